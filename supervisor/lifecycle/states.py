"""The per-game worker state machine: one enum, one table of edges, one transition function."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class WorkerState(enum.StrEnum):
    """State of one game's worker.

    ::

        STOPPED ─▶ WAITING ─▶ STARTING ─▶ RUNNING ─┬─▶ EXITED ─┬─▶ DONE
                     ▲  ▲        │  ▲               │           ├─▶ BACKOFF ─▶ STARTING …
                     │  │        │  └── BACKOFF ◀───┼───────────┤   (crash, OOM, hang)
                     │  │        ▼                  │           ├─▶ FATAL  (budget spent,
                     │  │     STOPPING ◀────────────┘           │           config error)
                     │  │        └──▶ EXITED                    ├─▶ STOPPED (shutdown)
                     │  └───────────────────────────────────────┘   WAITING (mode change,
                     │                                                        over the cap)
                     └── BACKOFF (over the cap) ; DONE/FATAL ─▶ WAITING (reset)

    WAITING: queued for a slot (max_concurrent), or waiting for GPU memory.
    STARTING: spawned, no heartbeat from this pid yet. RUNNING: heart-beating.
    STOPPING: asked to stop (SIGTERM; SIGKILL after a grace). EXITED: the process is gone and
    its exit classified; the loop picks the next state in the same tick.
    BACKOFF: waiting out a restart delay (keeps its slot); also after a spawn that failed
    (a full disk, a failed pidfd), again when the restart's own spawn fails.
    DONE: total_steps reached (or its sweep ended its trial: pruned, failed elsewhere).
    FATAL: not restarted (restart budget spent, or a configuration error).
    The exact edges are `ALLOWED` below; `transition()` enforces them.
    """

    STOPPED = "stopped"
    WAITING = "waiting"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"
    BACKOFF = "backoff"
    DONE = "done"
    FATAL = "fatal"


S = WorkerState
ALLOWED: dict[WorkerState, frozenset[WorkerState]] = {
    S.STOPPED: frozenset({S.WAITING, S.STARTING, S.DONE, S.FATAL}),
    # WAITING/BACKOFF -> DONE: a sweep's trial ended before this run of it (re)started.
    S.WAITING: frozenset({S.STARTING, S.BACKOFF, S.STOPPED, S.FATAL, S.DONE}),
    S.STARTING: frozenset({S.RUNNING, S.STOPPING, S.EXITED}),
    S.RUNNING: frozenset({S.STOPPING, S.EXITED}),
    S.STOPPING: frozenset({S.EXITED}),
    S.EXITED: frozenset({S.DONE, S.BACKOFF, S.WAITING, S.FATAL, S.STOPPED}),
    # BACKOFF -> BACKOFF: the restart's spawn failed too (the disk still full): a new delay.
    S.BACKOFF: frozenset({S.STARTING, S.BACKOFF, S.WAITING, S.STOPPED, S.FATAL, S.DONE}),
    S.DONE: frozenset({S.STOPPED, S.WAITING}),
    S.FATAL: frozenset({S.STOPPED, S.WAITING}),
}

# The event kind (events table) each target state stands for.
EVENT_KIND: dict[WorkerState, str] = {
    S.STARTING: "worker_start",
    S.EXITED: "worker_exit",
    S.BACKOFF: "backoff",
    S.DONE: "game_done",
    S.FATAL: "fatal",
}

ACTIVE = frozenset({S.STARTING, S.RUNNING, S.STOPPING, S.BACKOFF})
ALIVE = frozenset({S.STARTING, S.RUNNING, S.STOPPING})
TERMINAL = frozenset({S.DONE, S.FATAL})


class IllegalTransition(RuntimeError):
    """A transition the diagram does not allow: a bug in the supervisor, never a runtime fault."""


@dataclass(frozen=True)
class Transition:
    """The one event a state change produces."""

    game: str
    source: WorkerState
    target: WorkerState
    reason: str
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


def transition(
    game: str, source: WorkerState, target: WorkerState, reason: str, **detail: Any
) -> Transition:
    """Check the edge source → target, log one canonical line, and return its event."""
    if target not in ALLOWED[source]:
        raise IllegalTransition(f"{game}: {source} → {target} is not an allowed edge ({reason})")
    kind = EVENT_KIND.get(target, "worker_state")
    if target is S.STARTING and detail.get("restarts", 0) > 0:
        kind = "restart"
    import structlog  # here, not at the top: `rlsup status` imports this module for its sets

    structlog.get_logger("rlsup.worker").info(
        "worker_state",
        game=game,
        **{"from": str(source), "to": str(target)},
        reason=reason,
        **detail,
    )
    return Transition(game, source, target, reason, kind, dict(detail))
