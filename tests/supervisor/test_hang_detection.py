"""Hang detection by progress: a frozen process versus a worker in a long, legitimate pause."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from supervisor.config import parse_config
from supervisor.daemon import GameRuntime, Supervisor
from training.protocol import Heartbeat

CONFIG = """
state_dir = "state"
initial_mode = "light"
[modes.light]
num_envs = 2
batch_size = 2
n_steps = 4
max_concurrent = 1
[[games]]
name = "g"
env_id = "CartPole-v1"
total_steps = 100
[watchdog]
startup_grace_s = 180
hang_timeout_s = 120
"""


def heartbeat(phase: str, deadline_s: float, step: int = 1000) -> Heartbeat:
    return Heartbeat(
        seq=1, pid=1, phase=phase, phase_deadline_s=deadline_s, global_step=step,
        total_steps=10**6, episodes=0, sps=0.0, mean_return=None, last_checkpoint_step=None,
        resumed_from_step=None, num_envs=2, batch_size=2, device="cpu", gpu_mem_mb=None,
    )  # fmt: skip


@pytest.fixture
def runtime(tmp_path: Path) -> tuple[Supervisor, GameRuntime]:
    cfg = parse_config(tomllib.loads(CONFIG), tmp_path / "rlsup.toml", CONFIG)
    sup = Supervisor(cfg, clock=lambda: 0.0)
    rt = sup.games["g"]
    rt.progressed = True  # past start-up: hang_timeout_s applies
    rt.seq_at = rt.step_at = rt.phase_at = 0.0
    return sup, rt


def test_frozen_heartbeat_is_hung_after_hang_timeout_whatever_the_phase_deadline(runtime):
    sup, rt = runtime
    rt.heartbeat = heartbeat("training", deadline_s=900)
    assert sup._hang_reason(rt, now=119) is None
    reason = sup._hang_reason(rt, now=121)
    assert reason is not None and "seq unchanged" in reason


def test_heartbeating_worker_in_a_long_update_is_judged_by_its_own_deadline(runtime):
    sup, rt = runtime
    rt.heartbeat = heartbeat("training", deadline_s=300)
    rt.seq_at = 250  # the heartbeat thread still publishes; steps do not move
    assert sup._hang_reason(rt, now=290) is None
    rt.seq_at = 310
    reason = sup._hang_reason(rt, now=310)
    assert reason is not None and "global_step stuck" in reason and "limit 300" in reason


def test_a_short_worker_deadline_never_undercuts_the_operators_hang_timeout(runtime):
    sup, rt = runtime
    rt.heartbeat = dataclasses.replace(heartbeat("training", deadline_s=10), seq=2)
    rt.seq_at = 100
    assert sup._hang_reason(rt, now=100) is None
    rt.seq_at = 125
    assert sup._hang_reason(rt, now=125) is not None
