"""`rlsup status`'s step between a (re)start and the first step of the worker's loop: the
checkpoint it resumes from, never the 0 its first heartbeat carries. From the run dir's files
as a worker leaves them (a real `rlsup run` through it: test_command_evaluations.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from checkpoints import CheckpointStore
from supervisor.config import load_config
from supervisor.observe.games import games
from training import protocol as P

CONFIG = """\
state_dir = "state"
[modes.light]
num_envs = 4
batch_size = 128
n_steps = 64
max_concurrent = 2
[[games]]
name = "cart"
env_id = "CartPole-v1"
total_steps = 100000
[[games]]
name = "mine"
command = ["python", "train.py"]
total_steps = 100000
"""


def heartbeat(run: Path, **fields: Any) -> None:
    hb = {"seq": 1, "pid": 1, "phase": "loading", "phase_deadline_s": 3600, "global_step": 0,
          "total_steps": 100000, "time": time.time(), **fields}  # fmt: skip
    run.mkdir(parents=True, exist_ok=True)
    (run / P.HEARTBEAT_FILE).write_text(json.dumps(hb))


def checkpoint(run: Path, step: int) -> None:
    with CheckpointStore(run / P.CHECKPOINT_DIR).begin(step, {}) as writer:
        writer.write_bytes("x", b"1")
        writer.commit()


def steps(cfg_path: Path) -> dict[str, int]:
    cfg = load_config(cfg_path)
    return {g["name"]: g["global_step"] for g in games(None, cfg, time.time())}


@pytest.fixture
def cfg_path(tmp_path: Path) -> Path:
    path = tmp_path / "rlsup.toml"
    path.write_text(CONFIG)
    return path


def test_a_resumed_worker_that_has_not_stepped_shows_its_checkpoints_step(cfg_path: Path) -> None:
    state = cfg_path.parent / "state" / "runs"
    assert steps(cfg_path) == {"cart": 0, "mine": 0}  # nothing yet: a first start
    # Loading: the heartbeat's step is 0, its checkpoint not yet loaded: the newest committed.
    checkpoint(state / "cart", 4096)
    checkpoint(state / "cart", 8192)
    heartbeat(state / "cart")
    # Loaded (the SDK's `run.latest()`): the step it resumed from.
    checkpoint(state / "mine", 700)
    heartbeat(state / "mine", phase="starting", resumed_from_step=500, last_checkpoint_step=500)
    assert steps(cfg_path) == {"cart": 8192, "mine": 500}
    # Once it steps, its own step.
    heartbeat(state / "cart", phase="training", global_step=8200, resumed_from_step=8192)
    heartbeat(state / "mine", phase="training", global_step=510, resumed_from_step=500)
    assert steps(cfg_path) == {"cart": 8200, "mine": 510}
