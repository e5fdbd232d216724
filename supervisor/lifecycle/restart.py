"""Restart policy as pure functions: exit classification, backoff, windowed budget."""

from __future__ import annotations

import enum
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.launch.process import HOST_LOST_RC
from training.protocol import ExitCode

# Not an exit status (those are 0..255): the launcher's word that the worker's host is gone
# (several hosts: its Ray node died or stayed unreachable), so its exit status is unknowable.


class ExitKind(enum.StrEnum):
    DONE = "done"
    STOPPED = "stopped"  # stopped on request after a checkpoint (exit 75)
    OOM = "oom"
    CONFIG = "config_error"
    CRASH = "crash"  # any other exit status
    SIGNALED = "killed_by_signal"
    HOST_LOST = "host_lost"  # several hosts: its host died; the game moves (no failure)
    FENCED = "fenced"  # exit 77: placed elsewhere since (a second supervisor on the mirror?)
    START_LOST = "start_lost"  # the spare died before taking its assignment (no failure)


@dataclass(frozen=True)
class ExitInfo:
    kind: ExitKind
    returncode: int
    description: str

    @property
    def is_failure(self) -> bool:
        return self.kind in (ExitKind.OOM, ExitKind.CRASH, ExitKind.SIGNALED)


def classify_exit(returncode: int) -> ExitInfo:
    """Popen's returncode (negative = killed by that signal) → what happened."""
    if returncode == HOST_LOST_RC:
        return ExitInfo(ExitKind.HOST_LOST, returncode, "its host was lost")
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return ExitInfo(ExitKind.SIGNALED, returncode, f"killed by {name}")
    known = {
        ExitCode.DONE: ExitKind.DONE,
        ExitCode.STOPPED: ExitKind.STOPPED,
        ExitCode.OOM: ExitKind.OOM,
        ExitCode.CONFIG: ExitKind.CONFIG,
        ExitCode.FENCED: ExitKind.FENCED,
    }
    kind = known.get(returncode, ExitKind.CRASH)  # type: ignore[call-overload]
    return ExitInfo(kind, returncode, f"exit status {returncode} ({kind})")


def backoff_delay_s(failures: int, base_s: float, max_s: float, jitter: float) -> float:
    """Delay before restart number `failures` in a row (1 = the first after a stable run).

    The first restarts at once, as systemd's and supervisord's first retry does: one crash
    after a stable period is no sign of a loop, and every second of waiting is lost training
    (the spare's recovery was 0.83 s median, 0.73 s of it this wait). From the second in a
    row: base·2^(n-2), capped, then "equal jitter" (half fixed, half random) so that games
    crashing together spread out. `jitter` is a uniform draw in [0, 1)."""
    if failures <= 1:
        return 0.0
    raw = min(max_s, base_s * 2.0 ** (failures - 2))
    return raw / 2 + raw / 2 * jitter


def failures_in_window(failure_times: Sequence[float], now: float, window_s: float) -> list[float]:
    """The failures still counting against the budget: the window refills as they age out."""
    return [t for t in failure_times if now - t < window_s]


def budget_exhausted(
    failure_times: Sequence[float], now: float, window_s: float, budget: int
) -> bool:
    """True when more than `budget` failures fall in the last `window_s` seconds."""
    return len(failures_in_window(failure_times, now, window_s)) > budget


def consecutive_after_exit(previous: int, uptime_s: float, stable_after_s: float) -> int:
    """Consecutive-failure count (the backoff exponent) after one more failure: a run that
    stayed up `stable_after_s` resets it."""
    return 1 if uptime_s >= stable_after_s else previous + 1
