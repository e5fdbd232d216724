"""Where a worker's exit leads: a pure decision, keyed on enums, table-tested.

The tick loop classifies the exit status (`restart.classify_exit`), remembers why it had asked
the worker to stop (a `StopReason`, or None when nobody asked), and asks `route_exit` what the
game does next. The loop then carries it out (and, for a failure, the restart budget decides
between BACKOFF and FATAL).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from supervisor.launch.oomwatch import OomVerdict
from supervisor.lifecycle.restart import ExitInfo, ExitKind
from supervisor.lifecycle.states import WorkerState
from training.protocol import Heartbeat


class StopReason(enum.StrEnum):
    """Why the supervisor asked a worker to stop (SIGTERM; SIGKILL after a grace)."""

    HANG = "hang"  # no heartbeat or no progress past its deadline
    MODE_CHANGE = "mode_change"  # its effective mode changed: restart at the new sizes
    SLOTS = "slots"  # over max_concurrent: back to the queue
    REMOVED = "removed"  # its game left the configuration
    READDED = "readded"  # ... and came back while it was still stopping
    SHUTDOWN = "shutdown"  # the supervisor is stopping
    GPU_LOST = "gpu_lost"  # its GPU fell off the bus: placed again on another (not a failure)
    GPU_MOVE = "gpu_move"  # its GPU runs hot: moved to a calmer one (not a failure)
    SWEEP = "sweep"  # its sweep's trial ended (pruned, or another run of it failed): DONE


class Route(enum.StrEnum):
    DONE = "done"  # total_steps reached -> DONE
    REMOVED = "removed"  # -> STOPPED: the game is gone from the configuration
    CONFIG_ERROR = "config_error"  # exit 78 -> FATAL at once: a restart cannot help
    SHUTDOWN = "shutdown"  # -> STOPPED: the supervisor is stopping
    REQUEUE = "requeue"  # -> WAITING: asked to stop, or stopped cleanly: not a failure
    MOVE = "move"  # -> WAITING: its host was lost; placed again on another (not a failure)
    START_AGAIN = "start_again"  # -> WAITING: the spare died before it became the worker
    FENCED = "fenced"  # exit 77 -> FATAL: another placement owns the game
    IMPORT_ERROR = "import_error"  # an ImportError at start-up -> FATAL at once
    FAILURE = "failure"  # a crash, an OOM, a signal, a hang: backoff (or FATAL past the budget)
    SWEEP = "sweep"  # -> DONE: its trial ended (pruned, failed); its newest checkpoint is kept


def error_event(error_kind: str) -> str | None:
    """The event a worker's error.json kind makes on its own (checkpoint trouble), if any."""
    if error_kind in ("no_valid_checkpoint", "checkpoint_corrupt"):
        return "checkpoint_corrupt"
    if error_kind == "checkpoint_unreadable":
        return "checkpoint_unreadable"
    if error_kind.startswith("checkpoint") and error_kind != "checkpoint_mismatch":
        return "checkpoint_failed"
    return None


# Stops the supervisor asked for that are no failure, whatever the exit status.
_REQUEUED = frozenset(
    {
        StopReason.MODE_CHANGE,
        StopReason.SLOTS,
        StopReason.READDED,
        StopReason.GPU_LOST,
        StopReason.GPU_MOVE,
    }
)


def route_exit(
    kind: ExitKind,
    asked: StopReason | None,
    *,
    removed: bool,
    stopping: bool,
    progressed: bool = True,
    import_error: bool = False,
) -> Route:
    """What follows a worker's exit. `asked`: why the supervisor had asked it to stop;
    `removed`: its game left the configuration; `stopping`: the supervisor shuts down;
    `progressed`: its last heartbeat shows a step or a checkpoint past where it started;
    `import_error`: it died of an ImportError at start-up (`WorkerExit.start_import_error`)."""
    if kind is ExitKind.DONE:
        return Route.DONE
    if removed:
        return Route.REMOVED
    if kind is ExitKind.CONFIG:
        return Route.CONFIG_ERROR
    if kind is ExitKind.FENCED:
        return Route.FENCED
    if stopping:
        return Route.SHUTDOWN
    if asked is StopReason.SWEEP:
        return Route.SWEEP
    if kind is ExitKind.HOST_LOST:
        return Route.MOVE
    if kind is ExitKind.START_LOST:
        return Route.START_AGAIN
    if asked in _REQUEUED:
        return Route.REQUEUE
    if kind is ExitKind.CRASH and import_error and asked is None:
        # Its interpreter lacks a module: every restart would die the same way.
        return Route.IMPORT_ERROR
    if kind is ExitKind.STOPPED and asked is None and not progressed:
        # Exit 75 that nobody asked for, with nothing gained since the start: requeued at once
        # it would loop without bound (hundreds of starts a minute). Backoff and the budget.
        return Route.FAILURE
    if kind is ExitKind.STOPPED and asked is not StopReason.HANG:
        # Stopped after a checkpoint (exit 75) by someone else, or by itself (parent gone).
        return Route.REQUEUE
    return Route.FAILURE


_SETTLED = {
    Route.DONE: (WorkerState.DONE, "total_steps reached"),
    Route.REMOVED: (WorkerState.STOPPED, "removed from the configuration"),
    Route.SHUTDOWN: (WorkerState.STOPPED, "supervisor shutdown"),
    Route.SWEEP: (WorkerState.DONE, "its sweep ended its trial (pruned, or failed elsewhere)"),
    Route.MOVE: (WorkerState.WAITING, "its host was lost: placed again on another host"),
    Route.START_AGAIN: (
        WorkerState.WAITING,
        "the spare died before it took the assignment: started again (not a failure)",
    ),
    Route.FENCED: (
        WorkerState.FATAL,
        "fenced: the game was placed again by someone else (exit 77); is a second supervisor "
        "using the same mirror prefix?",
    ),
}


@dataclass(frozen=True)
class WorkerExit:
    """Everything known about one worker's exit, and the events it makes."""

    info: ExitInfo
    uptime_s: float
    error: dict[str, Any] | None  # its own error.json, if it wrote one
    heartbeat: Heartbeat | None  # its last
    killed_by_supervisor: bool
    oom: OomVerdict | None  # the kernel's word on a SIGKILL rlsup did not send

    @property
    def progressed(self) -> bool:
        """Did its last heartbeat show a step, or a committed checkpoint, past the step it
        resumed from (0 for a fresh start)? Without a heartbeat the supervisor knows of none."""
        hb = self.heartbeat
        if hb is None:
            return False
        start = hb.resumed_from_step or 0
        return hb.global_step > start or (hb.last_checkpoint_step or 0) > start

    def start_import_error(self, startup_grace_s: float) -> bool:
        """Did it die of an ImportError as its last words, before any heartbeat and within
        the start-up grace (its interpreter lacks a module)? Later, the same error is a crash
        like any other (an import inside the training loop, a plug-in loaded at evaluation)."""
        return (
            (self.error or {}).get("kind") == "import_error"
            and self.heartbeat is None
            and self.uptime_s < startup_grace_s
        )

    def exception(self) -> str | None:
        """The exception it died of, one line, when it said: the exception line of its
        traceback (a command game's log), else the first line of its own error.json."""
        error = self.error or {}
        if isinstance(line := error.get("exception"), str) and line:
            return line
        message = error.get("message")
        if error.get("kind") == "command_exit" or not isinstance(message, str) or not message:
            return None  # a command's log tail without a traceback: no exception to name
        return message.strip().splitlines()[0][:300] if message.strip() else None

    @property
    def kernel_oom(self) -> bool:
        return self.oom is not None and self.oom.killed is True

    def _killed(self) -> dict[str, Any]:
        if self.killed_by_supervisor:
            return {"killed_by_supervisor": True}
        if self.oom is not None:
            return {"kernel_oom": self.oom.killed, "oom_evidence": self.oom.evidence}
        return {}

    def detail(self) -> dict[str, Any]:
        """The detail of its `worker_exit` state change."""
        out: dict[str, Any] = {
            "returncode": self.info.returncode,
            "exit": str(self.info.kind),
            "uptime_s": round(self.uptime_s, 3),
            **self._killed(),
        }
        if (hb := self.heartbeat) is not None:
            out.update(global_step=hb.global_step, last_checkpoint_step=hb.last_checkpoint_step)
        if self.error:
            out["error"] = {k: self.error.get(k) for k in ("kind", "message", "step")}
        return out

    def error_event(self) -> tuple[str, dict[str, Any]] | None:
        """Its error.json as an event of its own, when it is about checkpoints."""
        kind = str((self.error or {}).get("kind") or "")
        event = error_event(kind)
        if event is None:
            return None
        return event, {"error_kind": kind, "message": (self.error or {}).get("message")}

    def settle(self, route: Route, asked: StopReason | None) -> tuple[WorkerState, str] | None:
        """The state (and its reason) a route other than FAILURE leads to; None for a
        failure (the restart budget decides between BACKOFF and FATAL)."""
        if route is Route.CONFIG_ERROR:
            msg = (self.error or {}).get("message") or "configuration error (exit 78)"
            return WorkerState.FATAL, f"configuration error: {msg}"
        if route is Route.REQUEUE:
            return WorkerState.WAITING, asked or "stopped after a checkpoint (exit 75)"
        if route is Route.IMPORT_ERROR:
            return WorkerState.FATAL, (
                f"cannot start: {self.exception()} (at start-up, before any heartbeat); "
                "restarting cannot help: install the module into the interpreter the "
                "command runs (see its log)"
            )
        return _SETTLED.get(route)

    def failure(self, asked: StopReason | None) -> tuple[str, tuple[str, dict[str, Any]] | None]:
        """Why it failed, for the BACKOFF/FATAL reason, and its failure event (None after a
        hang: the hang made its own)."""
        if asked is StopReason.HANG:
            return f"hang: {self.info.description}", None
        if self.info.kind is ExitKind.STOPPED:
            # Its own exit 75, unasked and without progress: no crash of the host or the
            # game's code (the stability policy must not see one), a loop to slow down.
            return "exit 75 without a stop request and without progress since its start", None
        cause = "kernel OOM kill" if self.kernel_oom else str(self.info.kind)
        oomed = self.info.kind is ExitKind.OOM or self.kernel_oom
        error = self.error or {}
        event = "worker_oom" if oomed else "worker_crash"
        named = f": {exc}" if (exc := self.exception()) else ""
        return f"{cause}: {self.info.description}{named}", (event, {
            "returncode": self.info.returncode,
            "description": self.info.description,
            "error_kind": error.get("kind"),
            "message": error.get("message"),
            "traceback": error.get("traceback"),
            "uptime_s": round(self.uptime_s, 3),
            **self._killed(),
        })  # fmt: skip
