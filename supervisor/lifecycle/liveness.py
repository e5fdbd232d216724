"""One worker's liveness, as the supervisor sees it through its heartbeats, and hang detection.

Pure: the tick loop reads `heartbeat.json` and hands it here with its own monotonic clock;
nothing here reads files, signals or writes. `Liveness` belongs to one worker process (a
`WorkerLife`) and is dropped with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from supervisor.config import WatchdogConfig
from training.protocol import Heartbeat


@dataclass
class Liveness:
    """When (by the supervisor's monotonic clock) the worker's heartbeat last changed."""

    since: float  # spawn time: the clocks start here
    heartbeat: Heartbeat | None = None
    seq_at: float = 0.0  # its `seq` last changed (the process is not frozen)
    step_at: float = 0.0  # its `global_step` last moved
    phase_at: float = 0.0  # its phase last changed
    first_step: int | None = None
    progressed: bool = False  # its step moved past the one it started from

    def __post_init__(self) -> None:
        self.seq_at = self.step_at = self.phase_at = self.since

    def observe(self, hb: Heartbeat, now: float) -> None:
        old = self.heartbeat
        if old is None or hb.seq != old.seq:
            self.seq_at = now
        if old is None or hb.global_step != old.global_step:
            self.step_at = now
        if old is None or hb.phase != old.phase:
            self.phase_at = now
        if self.first_step is None:
            self.first_step = hb.global_step
        elif hb.global_step > self.first_step:
            self.progressed = True
        self.heartbeat = hb


def hang_reason(live: Liveness, wd: WatchdogConfig, now: float) -> str | None:
    """Hung = a frozen process, or no step progress past the phase's deadline.

    The heartbeat thread publishes about once a second whatever the worker is doing, so a
    `seq` that stops means the process is frozen (SIGSTOP, the GIL held): the configured limit
    applies. Step progress may legitimately pause longer (a big PPO update, loading a large
    replay buffer, an evaluation): then the worker's own `phase_deadline_s`, measured from its
    iterations, extends the limit (except in phase `starting`: the operator's grace rules).
    """
    hb = live.heartbeat
    limit = wd.hang_timeout_s if live.progressed else wd.startup_grace_s
    seq_idle = now - live.seq_at
    if hb is None and seq_idle > limit:
        return f"no heartbeat within {limit:g} s of start"
    if seq_idle > limit:
        return f"heartbeat seq unchanged for {seq_idle:.1f} s (limit {limit:g} s)"
    step_limit = limit
    if hb is not None and hb.phase != "starting":
        step_limit = max(limit, float(hb.phase_deadline_s or 0))
    step_idle = now - max(live.step_at, live.phase_at)
    if step_idle > step_limit:
        return (
            f"global_step stuck at {hb.global_step if hb else None} for {step_idle:.1f} s "
            f"in phase {hb.phase if hb else None} (limit {step_limit:g} s)"
        )
    return None


@dataclass
class Reported:
    """What of a worker's heartbeat reports has already become an event."""

    quarantined: set[str] = field(default_factory=set)
    checkpoint_failures: int = 0
    sync_fallbacks: int = 0
    replay_damage: int = 0
    write_failures: set[str] = field(default_factory=set)
    mirror_restore: bool = False
    evaluations: set[int] = field(default_factory=set)  # the steps of evaluations reported


def new_reports(seen: Reported, hb: Heartbeat) -> list[tuple[str, dict[str, Any]]]:
    """The (event kind, detail) of what `hb` reports for the first time; marks them seen.

    Quarantined checkpoints, failed checkpoint writes, damaged replay chunks, and the first
    failed write of each kind of file (a full disk under the run dir or the log). Each detail
    names the reporting worker's `pid`: a successor supervisor tells by it what its
    predecessor recorded (`reported_from_events`)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name in hb.quarantined:
        if name not in seen.quarantined:
            seen.quarantined.add(name)
            out.append(("checkpoint_corrupt", {"checkpoint": name}))
    if hb.checkpoint_failures > seen.checkpoint_failures:
        seen.checkpoint_failures = hb.checkpoint_failures
        out.append(
            (
                "checkpoint_failed",
                {
                    "error": hb.last_checkpoint_error,
                    "step": hb.global_step,
                    "failures": hb.checkpoint_failures,
                    "last_checkpoint_step": hb.last_checkpoint_step,
                },
            )
        )
    if hb.checkpoint_sync_fallbacks > seen.sync_fallbacks:
        seen.sync_fallbacks = hb.checkpoint_sync_fallbacks
        out.append(
            (
                "checkpoint_sync_fallback",
                {
                    "reason": hb.last_checkpoint_sync_fallback,
                    "step": hb.global_step,
                    "fallbacks": hb.checkpoint_sync_fallbacks,
                },
            )
        )
    for damage in hb.replay_damage[seen.replay_damage :]:
        out.append(("replay_damaged", dict(damage)))
    seen.replay_damage = max(seen.replay_damage, len(hb.replay_damage))
    for kind, failures in sorted(hb.write_failures.items()):
        if failures and kind not in seen.write_failures:
            seen.write_failures.add(kind)
            out.append(("write_failed", {"file": kind, "failures": failures}))
    if hb.mirror_restore and not seen.mirror_restore:
        seen.mirror_restore = True
        out.append(("mirror_restored", dict(hb.mirror_restore)))
    # The recent ones first (a fast game can evaluate twice between two reads), then the
    # newest whole (a worker of a release before `evals`).
    recent = hb.evals if isinstance(hb.evals, list) else []  # another writer's: anything
    for ev in sorted(filter(None, map(evaluation_of, [*recent, hb.eval])), key=_step):
        if ev["step"] not in seen.evaluations:
            seen.evaluations.add(ev["step"])
            out.append(("evaluation", ev))
    return [(kind, {**detail, "pid": hb.pid}) for kind, detail in out]


def _step(ev: dict[str, Any]) -> int:
    return int(ev["step"])


def evaluation_of(ev: Any) -> dict[str, Any] | None:
    """The `evaluation` event's detail of a heartbeat's `eval` (None: none or malformed)."""
    if not isinstance(ev, dict):
        return None
    step, mean = ev.get("step"), ev.get("mean")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(mean, int | float):
        return None
    seconds = ev.get("seconds")
    return {
        "step": step,
        "mean": float(mean),
        "episodes": ev.get("episodes") if isinstance(ev.get("episodes"), int) else None,
        "seconds": float(seconds) if isinstance(seconds, int | float) else None,
        "time": ev.get("time") if isinstance(ev.get("time"), int | float) else None,
    }


REPORT_KINDS = (
    "checkpoint_corrupt",
    "checkpoint_failed",
    "checkpoint_sync_fallback",
    "replay_damaged",
    "write_failed",
    "mirror_restored",
    "evaluation",
)


def reported_from_events(pid: int, events: Iterable[tuple[str, dict[str, Any]]]) -> Reported:
    """What of worker `pid`'s reports the (kind, detail) events already hold (those whose
    detail names the pid): the inverse of `new_reports`, for a supervisor that takes over
    from one that died between a worker's report and its event."""
    seen = Reported()
    for kind, d in events:
        if d.get("pid") != pid:
            continue
        if kind == "checkpoint_corrupt":
            seen.quarantined.add(str(d.get("checkpoint")))
        elif kind == "checkpoint_failed":
            seen.checkpoint_failures = max(seen.checkpoint_failures, int(d.get("failures") or 0))
        elif kind == "checkpoint_sync_fallback":
            seen.sync_fallbacks = max(seen.sync_fallbacks, int(d.get("fallbacks") or 0))
        elif kind == "replay_damaged":
            seen.replay_damage += 1
        elif kind == "write_failed":
            seen.write_failures.add(str(d.get("file")))
        elif kind == "mirror_restored":
            seen.mirror_restore = True
        elif kind == "evaluation" and isinstance(d.get("step"), int):
            seen.evaluations.add(d["step"])
    return seen
