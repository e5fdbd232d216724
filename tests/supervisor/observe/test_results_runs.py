"""`rlsup results` for command games and sweeps: the ENV a command game declares (never its
run's name), one row per run on request (`--runs`), how many runs of how many have an
evaluation, and the runs' hyper-parameters in every format. From the state dir alone."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.config import load_config
from supervisor.observe.results import collect, command_env_label

HEAD = """\
state_dir = "state"
[modes.light]
num_envs = 4
batch_size = 128
n_steps = 64
max_concurrent = 2
"""
COMMANDS = f"""
[[games]]
name = "declared"
command = ["{sys.executable}", "train.py"]
params = {{ env_id = "HalfCheetah-v4", lr = 3e-4 }}
[[games]]
name = "flagged"
command = ["uv", "run", "python", "cleanrl_dqn.py", "--env-id", "Breakout-v5"]
[[games]]
name = "plain"
command = ["{sys.executable}", "/somewhere/my_trainer.py", "--lr", "1e-3"]
seeds = [1, 2, 3]
params = {{ lr = 1e-3 }}
"""
SWEEP = """
[[games]]
name = "cart"
env_id = "CartPole-v1"
total_steps = 1000
seeds = [1, 2]
[games.variants]
base = {}
fast = { learning_rate = 1e-3 }
"""


def write_run(
    state: Path, name: str, *, eval_mean: float | None = None, last_100: float | None = None
) -> None:
    """A run dir as an SDK script leaves it: its heartbeat names the run (`game`), not an env."""
    run = state / "runs" / name
    run.mkdir(parents=True)
    hb = {"global_step": 500, "total_steps": 1000, "mean_return": last_100, "game": name}
    hb["writer"] = "sdk"
    (run / "heartbeat.json").write_text(json.dumps(hb))
    if eval_mean is not None:
        ev = {"mean": eval_mean, "step": 400, "episodes": 5, "seconds": 1.0, "time": 1.0}
        (run / "eval.json").write_text(json.dumps(ev))


@pytest.fixture
def cfg_path(tmp_path: Path) -> Path:
    path = tmp_path / "rlsup.toml"
    path.write_text(HEAD + COMMANDS + SWEEP)
    return path


def test_a_command_games_env_is_what_it_declares_never_its_runs_name(cfg_path: Path) -> None:
    cfg = load_config(cfg_path)
    state = cfg_path.parent / "state"
    for name in ("declared", "flagged", "plain/s1"):
        write_run(state, name, eval_mean=5.0, last_100=4.0)
    env = {r.name: r.env_id for r in collect(cfg).runs}
    assert env == {
        "declared": "HalfCheetah-v4",  # params' env_id
        "flagged": "Breakout-v5",  # --env-id in its command
        "plain/s1": "my_trainer.py",  # the program the interpreter runs
    }
    assert command_env_label(cfg.game("plain/s2")) == "my_trainer.py"


def test_partial_runs_say_how_many_of_how_many_and_runs_lists_each(
    cfg_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = cfg_path.parent / "state"
    write_run(state, "plain/s1", eval_mean=10.0, last_100=8.0)
    write_run(state, "plain/s2", last_100=9.0)  # no evaluation yet; plain/s3: nothing yet
    assert main(["results", "--config", str(cfg_path), "--game", "plain"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("plain")]
    assert "2/3 seeds" in row and "10.0 (n=1/3)" in row, out
    assert main(["results", "--config", str(cfg_path), "--game", "plain", "--json"]) == 0
    (group,) = json.loads(capsys.readouterr().out)["groups"]
    assert (group["n"], group["configured"], group["eval"]["n"]) == (2, 3, 1)

    assert main(["results", "--config", str(cfg_path), "--game", "plain", "--runs"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["RUN", "ENV", "ALGO"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"plain/s1", "plain/s2", "plain/s3"}  # the one with nothing too
    assert "10.0" in rows["plain/s1"] and "400" in rows["plain/s1"]  # EVAL at its step
    assert rows["plain/s3"].split()[3] == "unknown"  # never started here
    assert main(["results", "--config", str(cfg_path), "--game", "plain", "--runs", "--csv"]) == 0
    runs = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["name"], r["eval"], r["param.lr"]) for r in runs] == [
        ("plain/s1", "10.0", "0.001"),
        ("plain/s2", "", "0.001"),
        ("plain/s3", "", "0.001"),
    ]


def test_hyper_parameters_in_every_format(
    cfg_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = cfg_path.parent / "state"
    for name, ev in (("cart/base/s1", 100.0), ("cart/base/s2", 120.0), ("cart/fast/s1", 200.0)):
        write_run(state, name, eval_mean=ev, last_100=ev / 2)
    args = ["results", "--config", str(cfg_path), "--game", "cart"]
    # Text: a column for what differs between the rows (the variants' learning rate), no more.
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "learning_rate" and "gamma" not in lines[0]
    assert lines[1].startswith("cart/base") and lines[1].split()[-1] == "-"
    assert lines[2].startswith("cart/fast") and lines[2].split()[-1] == "0.001"
    # Per run: the seed differs too.
    assert main([*args, "--runs"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[-2:] == ["learning_rate", "seed"]
    # Markdown: the same columns, and the parameters every row shares below the table.
    assert main([*args, "--markdown"]) == 0
    md = capsys.readouterr().out
    assert md.splitlines()[0].endswith("| learning_rate |")
    assert "<details><summary>" in md and "- `gamma = 0.99`" in md
    # CSV and JSON: every parameter.
    assert main([*args, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["group"], r["param.learning_rate"], r["param.gamma"]) for r in rows] == [
        ("cart/base", "", "0.99"),
        ("cart/fast", "0.001", "0.99"),
    ]
    assert "param.seed" not in rows[0]  # not shared by a group's seeds
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_run = {r["name"]: r["params"] for r in doc["runs"]}
    assert by_run["cart/base/s2"]["seed"] == 2 and by_run["cart/fast/s1"]["learning_rate"] == 1e-3
    assert len(by_run["cart/base/s1"]) > 30  # every resolved worker argument
    assert doc["groups"][0]["params"]["gamma"] == 0.99 and "seed" not in doc["groups"][0]["params"]
