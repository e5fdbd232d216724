"""The worker state machine, edge by edge."""

from __future__ import annotations

import itertools

import pytest
from structlog.testing import capture_logs

from supervisor.lifecycle.states import ALLOWED, IllegalTransition, WorkerState, transition

S = WorkerState
EDGES = [(a, b) for a, targets in ALLOWED.items() for b in sorted(targets)]
NON_EDGES = [(a, b) for a, b in itertools.product(S, S) if b not in ALLOWED[a]]


def test_every_state_has_its_edges_listed() -> None:
    assert set(ALLOWED) == set(S)


@pytest.mark.parametrize(("source", "target"), EDGES, ids=lambda s: str(s))
def test_allowed_edge_returns_one_event_and_logs_one_line(source: S, target: S) -> None:
    with capture_logs() as logs:
        tr = transition("pong", source, target, "because", pid=7, restarts=0)
    assert (tr.source, tr.target, tr.game, tr.reason) == (source, target, "pong", "because")
    assert len(logs) == 1
    want = {
        "event": "worker_state",
        "game": "pong",
        "from": str(source),
        "to": str(target),
        "reason": "because",
        "pid": 7,
        "restarts": 0,
    }
    assert logs[0].items() >= want.items()


@pytest.mark.parametrize(("source", "target"), NON_EDGES, ids=lambda s: str(s))
def test_illegal_edge_raises(source: S, target: S) -> None:
    with pytest.raises(IllegalTransition):
        transition("pong", source, target, "bug")


def test_main_path_of_the_diagram_is_allowed() -> None:
    path = [
        S.STOPPED,
        S.WAITING,
        S.STARTING,
        S.RUNNING,
        S.EXITED,
        S.BACKOFF,
        S.STARTING,
        S.RUNNING,
        S.STOPPING,
        S.EXITED,
        S.STOPPED,
    ]
    for a, b in itertools.pairwise(path):
        transition("g", a, b, "path")


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        (S.STARTING, "worker_start"),
        (S.EXITED, "worker_exit"),
        (S.BACKOFF, "backoff"),
        (S.DONE, "game_done"),
        (S.FATAL, "fatal"),
        (S.WAITING, "worker_state"),
    ],
)
def test_event_kind_follows_the_target(target: S, kind: str) -> None:
    source = next(s for s in S if target in ALLOWED[s])
    assert transition("g", source, target, "x").kind == kind


def test_start_after_a_failure_is_a_restart_event() -> None:
    assert transition("g", S.BACKOFF, S.STARTING, "x", restarts=2).kind == "restart"


def test_terminal_states_leave_only_by_reset() -> None:
    assert ALLOWED[S.DONE] == {S.STOPPED, S.WAITING}
    assert ALLOWED[S.FATAL] == {S.STOPPED, S.WAITING}
