"""`rlsup status` after a real (short) `rlsup run`: the state the real supervisor wrote."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.e2e

CONFIG = """\
state_dir = "state"
initial_mode = "light"
checkpoint_every_s = 30
stop_grace_s = 20
[modes.light]
num_envs = 4
batch_size = 128
n_steps = 64
max_concurrent = 2
[[games]]
name = "cartpole"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = 2048
seed = 1
device = "cpu"
args = { eval_episodes = 0 }
[[games]]
name = "cartpole-b"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = 1024
seed = 2
device = "cpu"
args = { eval_episodes = 0 }
"""


@pytest.mark.slow
def test_status_after_a_real_run_shows_its_games_steps_and_states(tmp_path: Path) -> None:
    config = tmp_path / "rlsup.toml"
    config.write_text(CONFIG)
    base = [sys.executable, "-m", "supervisor.cli"]
    run = subprocess.run(
        [*base, "run", "--config", str(config), "--exit-when-done"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]

    db = sqlite3.connect(tmp_path / "state" / "rlsup.db")
    rows = dict(db.execute("SELECT game, state FROM workers").fetchall())
    db.close()
    assert set(rows) == {"cartpole", "cartpole-b"}

    r = subprocess.run(
        [*base, "status", "--json", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # The supervisor is not running any more: 3, unless it finished every game (then 0).
    finished = all(s == "done" for s in rows.values())
    assert r.returncode == (0 if finished else 3), r.stderr
    doc = json.loads(r.stdout)
    games = {g["name"]: g for g in doc["games"]}
    assert set(games) == {"cartpole", "cartpole-b"}
    for name, total in (("cartpole", 2048), ("cartpole-b", 1024)):
        g = games[name]
        hb = json.loads((tmp_path / "state" / "runs" / name / "heartbeat.json").read_text())
        assert g["state"] == rows[name]
        assert g["total_steps"] == total
        assert g["global_step"] == hb["global_step"] > 0
        assert g["num_envs"] == 4 and g["mode"] == "light"
        assert g["eta_s"] is None  # nothing runs any more
    assert doc["supervisor"]["state"] == "stopped" and doc["supervisor"]["clean_stop"]
    if all(s == "done" for s in rows.values()):
        assert all(g["global_step"] >= g["total_steps"] for g in games.values())

    human = subprocess.run(
        [*base, "status", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert human.returncode == (0 if finished else 3)
    assert "stopped (clean stop" in human.stdout
    for name in ("cartpole", "cartpole-b"):
        line = next(ln for ln in human.stdout.splitlines() if ln.startswith(name + " "))
        assert rows[name] in line.lower()
