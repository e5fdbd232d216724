"""A real `rlsup run` of a CartPole game with `seeds = [1, 2, 3]`: three real workers, their
run dirs and logs under the game's folder, and `rlsup results` with one row of n = 3."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from harness.runs import MODES, env_for, rlsup, start_supervisor, stop_supervisor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_three_seeds_train_as_three_runs_and_make_one_results_row(tmp_path: Path) -> None:
    config = tmp_path / "rlsup.toml"
    config.write_text(
        'state_dir = "state"\ncheckpoint_every_s = 5\nstop_grace_s = 20\n'
        + MODES.format(max_concurrent=2)
        + '[[games]]\nname = "cart"\nenv_id = "CartPole-v1"\ntotal_steps = 1024\n'
        'device = "cpu"\nseeds = [1, 2, 3]\nargs = { eval_episodes = 3 }\n'
    )
    env = env_for(tmp_path)
    sup = start_supervisor(config, env, "--exit-when-done")
    try:
        assert sup.wait(240) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        stop_supervisor(sup)
    state = tmp_path / "state"
    for seed in (1, 2, 3):
        run = state / "runs" / "cart" / f"s{seed}"
        assert json.loads((run / "eval.json").read_text())["episodes"] == 3
        assert (state / "logs" / "cart" / f"s{seed}.log").is_file()
    for folder in (state / "runs" / "cart", state / "logs" / "cart"):
        assert stat.S_IMODE(os.stat(folder).st_mode) & 0o007 == 0, folder  # private

    status = json.loads(rlsup("status", "--json", "--config", str(config), env=env).stdout)
    assert sorted(g["name"] for g in status["games"]) == ["cart/s1", "cart/s2", "cart/s3"]
    assert {g["state"] for g in status["games"]} == {"done"}

    out = rlsup("results", "--json", "--config", str(config), env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    [row] = doc["groups"]
    assert row["group"] == "cart" and row["n"] == 3 and row["training"] == 0
    assert row["seeds"] == [1, 2, 3] and row["eval"]["n"] == 3
    assert row["steps_min"] >= 1024
    evals = [json.loads((state / "runs" / "cart" / f"s{s}" / "eval.json").read_text())["mean"]
             for s in (1, 2, 3)]  # fmt: skip
    assert row["eval"]["mean"] == pytest.approx(sum(evals) / 3)
    assert row["hns"] is None  # CartPole is not an Atari-57 game

    logs = rlsup("logs", "cart/s2", "--config", str(config), env=env)
    assert logs.returncode == 0 and logs.stdout, logs.stderr
