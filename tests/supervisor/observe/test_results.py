"""`rlsup results`: figures over seeds from the state dir alone, normalised and aggregated."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.config import load_config
from supervisor.observe import atari_scores
from supervisor.observe.results import collect, iqm

HEAD = """\
state_dir = "state"
[modes.light]
num_envs = 4
batch_size = 128
n_steps = 64
max_concurrent = 2
[[games]]
name = "breakout"
env_id = "Breakout-v5"
total_steps = 1000
seeds = [1, 2, 3]
[[games]]
name = "pong"
env_id = "Pong-v5"
total_steps = 1000
[games.variants]
a = {}
b = { learning_rate = 1e-4 }
[[games]]
name = "cart"
env_id = "CartPole-v1"
total_steps = 1000
"""


def write_run(
    state: Path,
    name: str,
    *,
    eval_mean: float | None = None,
    last_100: float | None = None,
    step: int = 1000,
    periodic: float | None = None,
    csv_only: bool = False,
) -> None:
    run = state / "runs" / name
    run.mkdir(parents=True)
    if eval_mean is not None:
        ev = {"mean": eval_mean, "step": step, "episodes": 10}
        (run / "eval.json").write_text(json.dumps(ev))
    if last_100 is not None and csv_only:
        (run / "progress.csv").write_text(
            f"time,global_step,mean_return\n1.0,{step // 2},0.5\n2.0,{step},{last_100}\n"
        )
    elif last_100 is not None or periodic is not None:
        hb = {"global_step": step, "total_steps": 1000, "mean_return": last_100}
        if periodic is not None:
            hb["eval"] = {"mean": periodic, "step": step, "episodes": 5}
        (run / "heartbeat.json").write_text(json.dumps(hb))


@pytest.fixture
def cfg_path(tmp_path: Path) -> Path:
    path = tmp_path / "rlsup.toml"
    path.write_text(HEAD)
    return path


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    assert iqm([1, 2, 3, 4]) == pytest.approx(2.5)
    assert iqm([0, 10, 10, 100]) == pytest.approx(10)  # the outliers trimmed
    # rliable's IQM is scipy.stats.trim_mean(x, 0.25): int(n / 4) cut from each end.
    assert iqm([5, 1, 4, 2, 3, 100, -50]) == pytest.approx(3.0)  # cut 1 each end: mean(1..5)
    assert iqm([7.0]) == 7.0
    assert iqm([]) is None


def test_normalised_scores_follow_the_published_table() -> None:
    assert atari_scores.normalised("Breakout-v5", 30.5) == pytest.approx(1.0)
    assert atari_scores.normalised("Breakout-v5", 1.7) == pytest.approx(0.0)
    assert atari_scores.normalised("MontezumaRevenge-v5", 4753.3) == pytest.approx(1.0)
    assert atari_scores.normalised("UpNDown-v5", 533.4) == pytest.approx(0.0)
    assert atari_scores.normalised("CartPole-v1", 500) is None
    assert atari_scores.normalised("Pitfall2-v5", 0) is None  # not Pitfall: not in the table
    assert len(atari_scores.RANDOM_HUMAN) == 57


def test_groups_over_seeds_and_variants_with_spread_and_normalised_scores(
    cfg_path: Path,
) -> None:
    state = cfg_path.parent / "state"
    for seed, (ev, l100) in zip((1, 2, 3), ((10.0, 8.0), (16.0, 9.0), (13.0, 10.0)), strict=True):
        write_run(state, f"breakout/s{seed}", eval_mean=ev, last_100=l100)
    write_run(state, "pong/a", eval_mean=-20.7, last_100=-20.0)
    write_run(state, "pong/b", last_100=-19.0, periodic=-10.0)  # no final eval yet: periodic
    write_run(state, "cart", last_100=100.0, csv_only=True)  # heartbeat removed: progress.csv
    res = collect(load_config(cfg_path))
    by = {g.group: g for g in res.groups}
    assert set(by) == {"breakout", "pong/a", "pong/b", "cart"}
    b = by["breakout"]
    assert b.n == 3 and b.seeds == [1, 2, 3] and b.eval is not None and b.last_100 is not None
    assert b.eval.mean == pytest.approx(13.0) and b.eval.std == pytest.approx(3.0)
    assert (b.eval.min, b.eval.max) == (10.0, 16.0)
    assert b.last_100.mean == pytest.approx(9.0)
    assert b.hns_of == "eval"
    assert b.hns == pytest.approx(statistics.fmean((x - 1.7) / 28.8 for x in (10, 16, 13)))
    assert b.training == 3  # no supervisor ever ran them: not done, their figures are latest
    assert by["pong/b"].eval is not None and by["pong/b"].eval.mean == -10.0
    assert by["pong/a"].hns == pytest.approx(0.0)
    cart = by["cart"]
    assert cart.last_100 is not None and cart.last_100.mean == 100.0 and cart.steps_max == 1000
    assert cart.hns is None and cart.eval is None
    # Aggregates: the median over games; the IQM over every run's normalised score.
    scored = sorted(g.hns for g in res.groups if g.hns is not None)
    assert res.hns_games == 3 and res.median_hns == pytest.approx(statistics.median(scored))
    pooled = [r.hns for r in res.runs if r.hns is not None]
    assert len(pooled) == 5 and res.iqm_hns == pytest.approx(iqm(pooled))


def test_the_cli_formats_and_the_empty_case(
    cfg_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", "--config", str(cfg_path)]) == 0
    out = capsys.readouterr()
    assert "no evaluation or training return yet" in out.err and "GAME" in out.out
    assert main(["results", "--config", str(cfg_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["groups"] == [] and doc["aggregate"]["median_hns"] is None
    assert not (cfg_path.parent / "state").exists(), "results wrote into the state dir"

    state = cfg_path.parent / "state"
    write_run(state, "breakout/s1", eval_mean=10.0, last_100=8.0)
    write_run(state, "breakout/s2", eval_mean=12.0, last_100=9.0)
    assert main(["results", "--config", str(cfg_path), "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["group"], r["n"], r["eval_n"]) for r in rows] == [("breakout", "2", "2")]
    assert float(rows[0]["eval_mean"]) == pytest.approx(11.0)
    assert main(["results", "--config", str(cfg_path), "--markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("| GAME |") and "| breakout (training 2/2) |" in md
    assert "11.0 ± 1.4" in md and "Badia et al. 2020" in md
    assert main(["results", "--config", str(cfg_path), "--game", "breakout/s1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["groups"][0]["n"] == 1
    assert main(["results", "--config", str(cfg_path), "--game", "nope"]) == 2
    assert "unknown game 'nope'" in capsys.readouterr().err
