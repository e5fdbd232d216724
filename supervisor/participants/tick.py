"""What a participant is, and what each tick hands it: one frozen `TickView`, built by the
daemon once its decisions for the tick are made. A participant acts on the view and returns
the events it has to tell; the daemon records them (the Recorder is the one writer of events).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from supervisor.config import Config
from supervisor.lifecycle.runtime import GameRuntime
from supervisor.preemption.notice import Hold
from supervisor.stability.modes import ModeView
from supervisor.stability.policy import Vitals

# (kind, game, detail): an event for the daemon to record.
Event = tuple[str, str | None, dict[str, Any]]


@dataclass(frozen=True)
class TickView:
    """One tick, as decided: what the participants read instead of asking the daemon."""

    now: float  # the supervisor's monotonic clock at the tick
    wall: float  # the wall clock, for the rows operators read
    stopping: bool  # the supervisor is shutting down: nothing new is started
    games: tuple[GameRuntime, ...]  # the configured games' runtimes, as the lifecycle keeps them
    modes: ModeView  # the modes in force
    vitals: Vitals | None  # the host's latest reading (None before the first)
    hold: Hold  # a preemption notice's hold (the same value the lifecycle had this tick)
    placed: frozenset[str]  # games whose worker starts placed on a GPU (cold: never a spare's)


class Participant(Protocol):
    def start(self) -> None: ...

    def tick(self, view: TickView) -> Iterable[Event]: ...

    def reconfigure(self, cfg: Config) -> None: ...

    def close(self) -> None: ...
