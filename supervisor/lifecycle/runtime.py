"""What the tick loop holds in memory about each game, and about each worker process.

A `GameRuntime` lives as long as its game is configured: its state, restart budget and backoff,
GPU memory learned. A `WorkerLife` is created when a worker is spawned and dropped when it
exits: everything about that one process (its pid and identity, its liveness, why it was asked
to stop, what of its reports became events). Nothing per process is ever reset by hand: a new
process gets a new `WorkerLife`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from supervisor.config import GameSpec, ModeSpec
from supervisor.launch.spawn import WorkerProcess
from supervisor.lifecycle.exits import StopReason
from supervisor.lifecycle.liveness import Liveness, Reported
from supervisor.lifecycle.states import WorkerState
from training.protocol import Heartbeat


@dataclass
class WorkerLife:
    """One worker process, from spawn to exit."""

    proc: WorkerProcess
    mode: ModeSpec  # the sizes it was started with
    live: Liveness
    reported: Reported = field(default_factory=Reported)
    stop_reason: StopReason | None = None  # why the supervisor asked it to stop
    kill_at: float | None = None  # SIGKILL due (monotonic) if it has not exited by then
    killed: bool = False  # the supervisor sent it SIGKILL
    spawned_at: float = 0.0  # time.monotonic() when it was spawned (or the spare assigned)
    start_reported: bool = False  # its start breakdown became a `worker_training` event


@dataclass
class GameRuntime:
    """One configured game: what outlives its worker processes."""

    spec: GameSpec
    state: WorkerState = WorkerState.STOPPED
    reason: str = ""
    state_since: float = 0.0  # wall clock, for the DB
    life: WorkerLife | None = None  # the current worker process, if any
    mode: ModeSpec | None = None  # the sizes its latest worker was started with
    restarts: int = 0
    failures: list[float] = field(default_factory=list)  # monotonic times, budget window
    consecutive: int = 0  # backoff exponent
    backoff_until: float = 0.0
    gpu_peak_mb: dict[tuple[int, int | str, int], float] = field(default_factory=dict)
    exit_seen_at: float | None = None  # time.monotonic() when its last worker's exit was seen
    last_start: dict[str, Any] | None = None  # how its newest worker started (served, times)

    # Read-only views of the current worker (None without one).
    @property
    def proc(self) -> WorkerProcess | None:
        return self.life.proc if self.life else None

    @property
    def heartbeat(self) -> Heartbeat | None:
        return self.life.live.heartbeat if self.life else None

    @property
    def stop_reason(self) -> StopReason | None:
        return self.life.stop_reason if self.life else None

    @property
    def progressed(self) -> bool:
        return bool(self.life and self.life.live.progressed)

    def db_row(self, updated: float) -> dict[str, Any]:
        """Its `workers` row: state, the current worker's identity, sizes, last heartbeat."""
        hb, mode, proc = self.heartbeat, self.mode, self.proc
        batch = self.spec.mode_batch(mode) if mode else None
        batch = batch if isinstance(batch, int) else None
        return {
            "state": str(self.state),
            "pid": proc.pid if proc else None,
            "pid_create_time": proc.create_time if proc else None,
            "pid_start_ticks": proc.start_ticks if proc else None,
            "mode": mode.name if mode else None,
            "num_envs": mode.num_envs if mode else None,
            "batch_size": batch if batch is not None else (hb.batch_size if hb else None),
            "restarts": self.restarts,
            "state_since": self.state_since,
            "reason": self.reason,
            "heartbeat": json.dumps(hb.to_json()) if hb else None,
            "last_start": json.dumps(self.last_start) if self.last_start else None,
            "updated": updated,
        }


@dataclass
class Reconciled:
    """What a configuration reload changes: the games that are new (to queue) and the ones
    whose worker must stop (removed from the configuration while it runs)."""

    added: list[GameRuntime]
    leaving: list[GameRuntime]


def reconcile(
    games: dict[str, GameRuntime],
    removed: dict[str, GameRuntime],
    specs: Iterable[GameSpec],
    now_wall: float,
) -> Reconciled:
    """Bring `games` (in the new order) and `removed` (runtimes whose worker still stops) in
    line with the reloaded `specs`. A game keeps its runtime (restarts, budget, backoff); one
    re-added while its old worker still stops takes that runtime back, so its next worker
    starts only once the old one has exited (never two at once)."""
    old = dict(games)
    added: list[GameRuntime] = []
    games.clear()
    for spec in specs:
        if spec.name in old:
            rt = games[spec.name] = old.pop(spec.name)
        elif spec.name in removed:
            rt = games[spec.name] = removed.pop(spec.name)
            if rt.life is not None:
                rt.life.stop_reason = StopReason.READDED
        else:
            rt = games[spec.name] = GameRuntime(spec, state_since=now_wall)
            added.append(rt)
        rt.spec = spec
    leaving = [rt for rt in old.values() if rt.life is not None]
    removed.update({rt.spec.name: rt for rt in leaving})
    return Reconciled(added, leaving)


def summary(games: Iterable[GameRuntime]) -> str:
    """One line for systemd's STATUS=: how many games are in each state."""
    counts: dict[str, int] = {}
    for rt in games:
        counts[str(rt.state)] = counts.get(str(rt.state), 0) + 1
    return "rlsup: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
