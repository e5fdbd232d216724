"""Stable-Baselines3 under a real `rlsup run`: the examples as command games, SIGKILLed by a test
mid-run, restarted by the supervisor from their newest checkpoint, replay buffer included, and
finished. The adapter's own tests (no supervisor) are tests/sdk/test_sb3.py."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.runs import env_for, events, start_supervisor, stop_supervisor, wait_for
from tests.sdk.sb3_helpers import assert_no_pickled_objects, committed, read_json, stdout_fields
from training import protocol as P

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
HEAD = """\
state_dir = "state"
checkpoint_every_s = 3600
stop_grace_s = 20
tick_s = 0.1
[modes.light]
num_envs = 1
batch_size = 64
n_steps = 8
max_concurrent = 2
[restart]
backoff_base_s = 0.2
backoff_max_s = 0.5
[watchdog]
startup_grace_s = 120
hang_timeout_s = 60
"""


def game(name: str, script: str, *args: str) -> str:
    command = [sys.executable, str(REPO / "examples" / script), *args]
    return (
        f'[[games]]\nname = "{name}"\ncommand = {json.dumps(command)}\nheartbeat = true\n'
        'device = "cpu"\n'
    )


def game_process(name: str) -> psutil.Process | None:
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get(P.GAME_ENV) == name:
                return p
        except psutil.Error:
            continue
    return None


def test_sb3_games_killed_under_rlsup_resume_with_their_buffer_and_finish(tmp_path: Path) -> None:
    config = tmp_path / "rlsup.toml"
    config.write_text(
        HEAD
        + game("dqn", "sb3_dqn_cartpole.py", "--total-steps", "6000",
               "--checkpoint-every-steps", "1500", "--print-digest")
        + game("pendulum", "sb3_mujoco.py", "--total-steps", "1600",
               "--checkpoint-every-steps", "500")
    )  # fmt: skip
    state = tmp_path / "state"
    runs = {name: state / "runs" / name for name in ("dqn", "pendulum")}
    killed: dict[str, int] = {}
    at_kill: dict[str, Any] = {}
    sup = start_supervisor(config, env_for(tmp_path))
    try:
        for name, past in (("dqn", 2000), ("pendulum", 600)):
            wait_for(
                lambda n=name, s=past: (
                    committed(runs[n])
                    and (hb := P.read_heartbeat(runs[n])) is not None
                    and hb.global_step > s
                ),
                180,
                f"{name} past its first checkpoint",
            )
            proc = game_process(name)
            assert proc is not None
            proc.send_signal(signal.SIGKILL)
            killed[name], ckpt = committed(runs[name])[-1]
            at_kill[name] = read_json(ckpt / "sb3.json")  # before retention removes it
            wait_for(lambda n=name: events(state, "worker_crash", n), 30, f"{name}'s crash seen")
        wait_for(lambda: all(events(state, "game_done", n) for n in runs), 240, "both done")
    finally:
        stop_supervisor(sup)
    logs = {name: (state / "logs" / f"{name}.log").read_text() for name in runs}
    # The DQN resumed from the checkpoint it had when killed, its buffer byte for byte.
    resumed = stdout_fields(logs["dqn"], "resumed")
    step = int(resumed["step"])
    assert step == killed["dqn"] and step >= 1500
    saved = at_kill["dqn"]
    assert int(resumed["replay_size"]) == saved["replay"]["size"] == step
    assert resumed["replay_sha256"] == saved["replay"]["sha256"]
    assert stdout_fields(logs["dqn"], "finished") == {"step": "6000"}
    assert int(stdout_fields(logs["pendulum"], "resumed")["step"]) >= 500
    assert stdout_fields(logs["pendulum"], "finished") == {"step": "1600"}
    for name in runs:
        assert len(events(state, "worker_crash", name)) == 1
        final_step, final = committed(runs[name])[-1]
        assert final_step == {"dqn": 6000, "pendulum": 1600}[name]
        assert_no_pickled_objects(final)
