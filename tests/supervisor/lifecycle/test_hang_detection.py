"""Hang detection by progress: a frozen process versus a worker in a long, legitimate pause."""

from __future__ import annotations

import dataclasses

import pytest

from supervisor.config import WatchdogConfig
from supervisor.lifecycle.liveness import Liveness, hang_reason
from training.protocol import Heartbeat

WATCHDOG = WatchdogConfig(startup_grace_s=180, hang_timeout_s=120)


def heartbeat(phase: str, deadline_s: float, step: int = 1000) -> Heartbeat:
    return Heartbeat(
        seq=1, pid=1, phase=phase, phase_deadline_s=deadline_s, global_step=step,
        total_steps=10**6, episodes=0, sps=0.0, mean_return=None, last_checkpoint_step=None,
        resumed_from_step=None, num_envs=2, batch_size=2, device="cpu", gpu_mem_mb=None,
    )  # fmt: skip


@pytest.fixture
def live() -> Liveness:
    live = Liveness(since=0.0)
    live.progressed = True  # past start-up: hang_timeout_s applies
    return live


def test_frozen_heartbeat_is_hung_after_hang_timeout_whatever_the_phase_deadline(
    live: Liveness,
) -> None:
    rt = live
    rt.heartbeat = heartbeat("training", deadline_s=900)
    assert hang_reason(rt, WATCHDOG, now=119) is None
    reason = hang_reason(rt, WATCHDOG, now=121)
    assert reason is not None and "seq unchanged" in reason


def test_heartbeating_worker_in_a_long_update_is_judged_by_its_own_deadline(live: Liveness) -> None:
    rt = live
    rt.heartbeat = heartbeat("training", deadline_s=300)
    rt.seq_at = 250  # the heartbeat thread still publishes; steps do not move
    assert hang_reason(rt, WATCHDOG, now=290) is None
    rt.seq_at = 310
    reason = hang_reason(rt, WATCHDOG, now=310)
    assert reason is not None and "global_step stuck" in reason and "limit 300" in reason


def test_a_short_worker_deadline_never_undercuts_the_operators_hang_timeout(live: Liveness) -> None:
    rt = live
    rt.heartbeat = dataclasses.replace(heartbeat("training", deadline_s=10), seq=2)
    rt.seq_at = 100
    assert hang_reason(rt, WATCHDOG, now=100) is None
    rt.seq_at = 125
    assert hang_reason(rt, WATCHDOG, now=125) is not None
