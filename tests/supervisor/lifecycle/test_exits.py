"""Where a worker's exit leads: the whole table, by exit kind, why it was asked to stop, and
whether its game was removed or the supervisor is stopping."""

from __future__ import annotations

import pytest

from supervisor.launch.oomwatch import OomVerdict
from supervisor.lifecycle.exits import Route, StopReason, WorkerExit, error_event, route_exit
from supervisor.lifecycle.restart import ExitKind, classify_exit
from supervisor.lifecycle.states import WorkerState

K, R, A = ExitKind, Route, StopReason
ROUTES = [
    # kind, asked, removed, stopping -> route
    (K.DONE, None, False, False, R.DONE),
    (K.DONE, A.SHUTDOWN, True, True, R.DONE),  # finished first: done whatever else
    (K.STOPPED, A.REMOVED, True, False, R.REMOVED),
    (K.CRASH, A.REMOVED, True, False, R.REMOVED),
    (K.CONFIG, None, False, False, R.CONFIG_ERROR),
    (K.CONFIG, A.SHUTDOWN, False, True, R.CONFIG_ERROR),
    (K.STOPPED, A.SHUTDOWN, False, True, R.SHUTDOWN),
    (K.CRASH, A.SHUTDOWN, False, True, R.SHUTDOWN),
    (K.STOPPED, A.MODE_CHANGE, False, False, R.REQUEUE),
    (K.CRASH, A.MODE_CHANGE, False, False, R.REQUEUE),  # asked to stop: not a failure
    (K.SIGNALED, A.SLOTS, False, False, R.REQUEUE),
    (K.STOPPED, A.READDED, False, False, R.REQUEUE),
    (K.STOPPED, None, False, False, R.REQUEUE),  # stopped by someone else, checkpointed
    (K.STOPPED, A.HANG, False, False, R.FAILURE),  # a hang is a failure however it ends
    (K.SIGNALED, A.HANG, False, False, R.FAILURE),
    (K.CRASH, None, False, False, R.FAILURE),
    (K.OOM, None, False, False, R.FAILURE),
    (K.SIGNALED, None, False, False, R.FAILURE),
    # Several hosts: a lost host moves the game (no failure, whoever asked what); a fenced
    # worker (exit 77) means someone else placed the game: FATAL, restarting cannot help.
    (K.HOST_LOST, None, False, False, R.MOVE),
    (K.HOST_LOST, A.HANG, False, False, R.MOVE),
    (K.HOST_LOST, None, False, True, R.SHUTDOWN),
    (K.HOST_LOST, None, True, False, R.REMOVED),
    (K.FENCED, None, False, False, R.FENCED),
    (K.FENCED, None, False, True, R.FENCED),
    # The spare died before it took its assignment: the game never had that worker.
    (K.START_LOST, None, False, False, R.START_AGAIN),
    (K.START_LOST, A.MODE_CHANGE, False, False, R.START_AGAIN),
    (K.START_LOST, None, False, True, R.SHUTDOWN),
    (K.START_LOST, None, True, False, R.REMOVED),
]


@pytest.mark.parametrize(("kind", "asked", "removed", "stopping", "route"), ROUTES)
def test_route_exit(
    kind: ExitKind, asked: StopReason | None, removed: bool, stopping: bool, route: Route
) -> None:
    assert route_exit(kind, asked, removed=removed, stopping=stopping) is route


@pytest.mark.parametrize(
    ("error_kind", "event"),
    [
        ("no_valid_checkpoint", "checkpoint_corrupt"),
        ("checkpoint_corrupt", "checkpoint_corrupt"),
        ("checkpoint_unreadable", "checkpoint_unreadable"),
        ("checkpoint_failed", "checkpoint_failed"),
        ("checkpoint_mismatch", None),  # its FATAL reason says it all
        ("crash", None),
        ("", None),
    ],
)
def test_error_event(error_kind: str, event: str | None) -> None:
    assert error_event(error_kind) == event


def test_a_kernel_oom_kill_is_a_worker_oom_and_a_hang_makes_no_second_event() -> None:
    oom = WorkerExit(classify_exit(-9), 12.0, None, None, False, OomVerdict(True, "kernel log"))
    why, event = oom.failure(None)
    assert why.startswith("kernel OOM kill") and event is not None
    assert event[0] == "worker_oom" and event[1]["kernel_oom"] is True
    ours = WorkerExit(classify_exit(-9), 3.0, None, None, True, None)
    assert ours.failure(A.HANG) == ("hang: killed by SIGKILL", None)
    assert ours.detail()["killed_by_supervisor"] is True
    crash = WorkerExit(
        classify_exit(1), 1.0, {"kind": "crash", "message": "boom"}, None, False, None
    )
    assert crash.failure(None)[1] == ("worker_crash", {
        "returncode": 1, "description": "exit status 1 (crash)", "error_kind": "crash",
        "message": "boom", "traceback": None, "uptime_s": 1.0,
    })  # fmt: skip


S = WorkerState


@pytest.mark.parametrize(
    ("route", "asked", "error", "settled"),
    [
        (R.DONE, None, None, (S.DONE, "total_steps reached")),
        (R.REMOVED, A.REMOVED, None, (S.STOPPED, "removed from the configuration")),
        (R.SHUTDOWN, A.SHUTDOWN, None, (S.STOPPED, "supervisor shutdown")),
        (
            R.CONFIG_ERROR,
            None,
            {"message": "bad env_id"},
            (S.FATAL, "configuration error: bad env_id"),
        ),
        (
            R.CONFIG_ERROR,
            None,
            None,
            (S.FATAL, "configuration error: configuration error (exit 78)"),
        ),
        (R.REQUEUE, A.SLOTS, None, (S.WAITING, "slots")),
        (R.REQUEUE, None, None, (S.WAITING, "stopped after a checkpoint (exit 75)")),
        (R.FAILURE, None, None, None),  # the restart budget decides
        (R.FAILURE, A.HANG, None, None),
    ],
)
def test_settle(
    route: Route,
    asked: StopReason | None,
    error: dict[str, str] | None,
    settled: tuple[WorkerState, str] | None,
) -> None:
    ex = WorkerExit(classify_exit(0), 1.0, error, None, False, None)
    assert ex.settle(route, asked) == settled


def test_every_route_settles_or_is_a_failure() -> None:
    ex = WorkerExit(classify_exit(0), 1.0, None, None, False, None)
    assert [r for r in Route if ex.settle(r, None) is None] == [R.FAILURE]


def test_host_lost_and_fenced_are_classified_and_settled() -> None:
    from supervisor.lifecycle.restart import HOST_LOST_RC

    lost = classify_exit(HOST_LOST_RC)
    assert lost.kind is ExitKind.HOST_LOST and not lost.is_failure
    fenced = classify_exit(77)
    assert fenced.kind is ExitKind.FENCED and not fenced.is_failure
    ex = WorkerExit(lost, 5.0, None, None, False, None)
    assert ex.settle(Route.MOVE, None) == (WorkerState.WAITING, ex.settle(Route.MOVE, None)[1])
    state, why = WorkerExit(fenced, 5.0, None, None, False, None).settle(Route.FENCED, None)
    assert state is WorkerState.FATAL and "second supervisor" in why
