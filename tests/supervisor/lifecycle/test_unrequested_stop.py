"""Exit 75 that nobody asked for: a requeue only after progress, else a failure against the
restart budget (backoff, FATAL past it). Pure routes, then a real script that always exits 75
under a real `rlsup run`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.runs import env_for, events, rlsup
from supervisor.lifecycle.exits import Route, StopReason, WorkerExit, route_exit
from supervisor.lifecycle.restart import ExitKind, classify_exit
from supervisor.lifecycle.states import WorkerState
from training.protocol import ExitCode, Heartbeat

pytestmark = pytest.mark.e2e

K, R, A = ExitKind, Route, StopReason


def beat(step: int, ckpt: int | None, resumed: int | None) -> Heartbeat:
    return Heartbeat(
        seq=3, pid=1, phase="stopping", phase_deadline_s=0.0, global_step=step,
        total_steps=10_000, episodes=0, sps=0.0, mean_return=None, last_checkpoint_step=ckpt,
        resumed_from_step=resumed, num_envs=1, batch_size=1, device="cpu", gpu_mem_mb=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("asked", "progressed", "route"),
    [
        (None, True, R.REQUEUE),  # e.g. the SDK saw the preemption request: checkpointed
        (None, False, R.FAILURE),  # nobody asked and nothing was gained: a loop in the making
        (A.MODE_CHANGE, False, R.REQUEUE),  # asked: never a failure
        (A.SLOTS, False, R.REQUEUE),
        (A.HANG, True, R.FAILURE),
    ],
)
def test_an_unrequested_exit_75_requeues_only_after_progress(
    asked: StopReason | None, progressed: bool, route: Route
) -> None:
    got = route_exit(K.STOPPED, asked, removed=False, stopping=False, progressed=progressed)
    assert got is route


@pytest.mark.parametrize(
    ("hb", "progressed"),
    [
        (None, False),  # no heartbeat at all: the supervisor knows of no progress
        (beat(0, None, None), False),
        (beat(500, 500, 500), False),  # resumed at 500, still there
        (beat(520, 500, 500), True),  # stepped past the resume point
        (beat(500, 600, 500), True),  # a new committed checkpoint
        (beat(40, None, None), True),  # a fresh start that stepped
    ],
)
def test_progress_is_judged_from_the_last_heartbeat(hb: Heartbeat | None, progressed: bool) -> None:
    ex = WorkerExit(classify_exit(ExitCode.STOPPED), 0.2, None, hb, False, None)
    assert ex.progressed is progressed


def test_an_unrequested_exit_75_without_progress_says_so() -> None:
    ex = WorkerExit(classify_exit(ExitCode.STOPPED), 0.2, None, None, False, None)
    why, event = ex.failure(None)
    assert "exit 75" in why and "without progress" in why and event is None
    # Its requeue after progress is settled as before.
    assert ex.settle(R.REQUEUE, None) == (
        WorkerState.WAITING,
        "stopped after a checkpoint (exit 75)",
    )


ALWAYS_75 = "import sys; print('stopping, nobody asked', flush=True); sys.exit(75)"


def test_a_script_that_always_exits_75_is_bounded_and_ends_fatal(tmp_path: Path) -> None:
    config = tmp_path / "rlsup.toml"
    config.write_text(
        'state_dir = "state"\nstop_grace_s = 5\ntick_s = 0.05\n'
        "[modes.light]\nnum_envs = 1\nbatch_size = 1\nn_steps = 1\nmax_concurrent = 1\n"
        "[restart]\nbackoff_base_s = 0.1\nbackoff_max_s = 0.2\nbudget = 3\n"
        "budget_window_s = 600\n"
        f'[[games]]\nname = "loop"\ncommand = ["{sys.executable}", "-c", "{ALWAYS_75}"]\n'
    )
    env = env_for(tmp_path)
    out = rlsup("run", "--exit-when-done", "--config", str(config), env=env, timeout=60)
    state = tmp_path / "state"
    starts = events(state, "worker_start", "loop") + events(state, "restart", "loop")
    assert len(starts) == 4, out.stderr  # the first and 3 restarts
    (fatal,) = events(state, "fatal", "loop")
    reason = fatal["detail"]["reason"]
    assert "restart budget spent" in reason and "exit 75" in reason, reason
    assert "without progress" in reason, reason
    assert len(events(state, "backoff", "loop")) == 3
