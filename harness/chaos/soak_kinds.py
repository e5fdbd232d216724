"""The one table of fault kinds: how each is injected, which events must follow it, which
invariants it is judged by, and how often the schedule draws it.

To add a kind: an `_f_<kind>` injection in soak_faults.Injector, a row here; the engine's
schedule, the analysis and the figures pick it up from this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.chaos.soak_analysis import Analyst, EventLog
from harness.chaos.soak_faults import Fault, Injector

Expect = Callable[[EventLog], list[tuple[str, bool]]]


@dataclass(frozen=True)
class FaultKind:
    inject: Callable[[Injector], Fault | None]
    expect: Expect
    """(event description, seen) pairs: each one not seen is a problem."""
    invariants: Callable[[Analyst, Fault], None] = Analyst.recovered
    """Adds the fault's problems: by default, its victims' replacements recovered in bound."""
    opening: int = 1
    """How often it is in the opening schedule (shuffled; every kind at least once)."""
    filler: int = 0
    """Its weight among the random faults that fill the rest of a schedule."""
    long_filler: int = 0
    """Its weight added on long schedules (more than 40 faults): the global faults recur."""
    forbid: tuple[str, ...] = ()
    """Events it must not cause while it lasts (Fault.event_ids): e.g. no worker taken for
    hung while the state database is down."""


def _crash(ev: EventLog) -> tuple[str, bool]:
    return "worker_crash (of the victim pid)", ev.crash_of_victim(("worker_crash",))


def _after_crash(ev: EventLog) -> tuple[str, bool]:
    return "supervisor_start(after=supervisor_crash)", ev.has(
        "supervisor_start", None, lambda e: e["detail"].get("after") == "supervisor_crash"
    )


def _state_db(ev: EventLog) -> list[tuple[str, bool]]:
    """The outage the supervisor logged in the window, as an event dated in it (the injection
    found whether there was one: a database whose WAL has room writes on through a full disk)."""
    window = ev.fault.window_wall or (ev.since, float("inf"))
    recorded = ev.has("state_db_unavailable", None, lambda e: window[0] <= float(
        e["detail"].get("since", 0)) <= window[1])  # fmt: skip
    return [("state_db_unavailable (in the window)", recorded or not ev.fault.db_outage)]


def _clock_step(ev: EventLog) -> list[tuple[str, bool]]:
    # The workers the supervisor started: a wrapped game's is its shell, the script's leader.
    stopped = {ev.fault.leaders.get(g, pid) for g, pid in ev.fault.victims.items()}

    def found_them(e: dict[str, Any]) -> bool:
        listed = set(e["detail"].get("leftover_workers_stopped") or [])
        return e["detail"].get("after") == "supervisor_crash" and stopped <= listed

    return [("supervisor_start stopping every frozen leftover", ev.has(
        "supervisor_start", None, found_them))]  # fmt: skip


def _stopped_unrecorded(ev: EventLog) -> list[tuple[str, bool]]:
    """The spare that took a game before the supervisor died is stopped by the next one."""
    spare = ev.fault.spare_pid
    if spare is None:  # it never took the game: it ended with its supervisor
        return []
    return [("supervisor_start stopping the spare no row names", ev.has(
        "supervisor_start", None,
        lambda e: spare in (e["detail"].get("leftover_workers_stopped") or []),
    ))]  # fmt: skip


def _of_spare(ev: EventLog) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["detail"].get("pid") == ev.fault.spare_pid


def _not_spare(ev: EventLog) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["detail"].get("pid") not in (None, ev.fault.spare_pid)


def _pinned(mode: str) -> Expect:
    return lambda ev: [
        (
            f"mode_pinned({mode})",
            ev.has("mode_pinned", None, lambda e: e["detail"].get("mode") == mode),
        )
    ]


KINDS: dict[str, FaultKind] = {
    # A worker SIGKILLed, anywhere in its loop.
    "kill": FaultKind(Injector._f_kill, lambda ev: [_crash(ev)], opening=2, filler=2),
    # ... while a `.staging-*` checkpoint is being written.
    "kill_staging": FaultKind(
        Injector._f_kill_staging, lambda ev: [_crash(ev)], opening=2, filler=1
    ),
    # A worker SIGSTOPped and left so: the watchdog must call it hung and replace it.
    "sigstop": FaultKind(
        Injector._f_sigstop,
        lambda ev: [
            (
                "worker_hang",
                ev.has(
                    "worker_hang",
                    ev.game,
                    lambda e: e["detail"].get("pid") == ev.fault.victims.get(ev.game or ""),
                ),
            )
        ],
        filler=1,
    ),
    # The supervisor SIGKILLed; its workers left running (the next one stops them first).
    "supervisor_kill": FaultKind(
        Injector._f_supervisor_kill,
        lambda ev: [_after_crash(ev)],
        long_filler=1,
    ),
    # Everything SIGKILLed and a new boot id: a host reboot.
    "host_reboot": FaultKind(
        Injector._f_host_reboot,
        lambda ev: [("host_reboot", ev.has("host_reboot", None))],
        long_filler=1,
    ),
    # A cloud's preemption notice: each game checkpoints now, then the machine is taken and
    # boots again. Recorded as `preempted`, never as an unexpected `host_reboot`.
    "preemption": FaultKind(
        Injector._f_preemption,
        lambda ev: [
            ("preemption_notice", ev.has("preemption_notice", None)),
            ("preempted", ev.has("preempted", None)),
        ],
        long_filler=1,
        forbid=("host_reboot",),
    ),
    # The newest checkpoint's learner truncated / one bit flipped before the replacement loads.
    "corrupt_truncate": FaultKind(
        Injector._f_corrupt_truncate,
        lambda ev: [_crash(ev), ("checkpoint_corrupt", ev.has("checkpoint_corrupt", ev.game))],
        filler=1,
    ),
    "corrupt_bitflip": FaultKind(
        Injector._f_corrupt_bitflip,
        lambda ev: [_crash(ev), ("checkpoint_corrupt", ev.has("checkpoint_corrupt", ev.game))],
        filler=1,
    ),
    # One game's checkpoint filesystem full for a while (tmpfs).
    "disk_full": FaultKind(
        Injector._f_disk_full,
        lambda ev: [("checkpoint_failed", ev.has("checkpoint_failed", ev.game))],
        invariants=Analyst.disk_survived,
        long_filler=1,
    ),
    # A worker moved into an 8 MiB memory cgroup: the kernel OOM-kills it.
    "oom": FaultKind(
        Injector._f_oom,
        lambda ev: [
            ("worker_crash|worker_oom", ev.crash_of_victim(("worker_crash", "worker_oom")))
        ],
        long_filler=1,
    ),
    # A bit flipped in a replay chunk several checkpoints share, with the worker dead ...
    "replay_rot": FaultKind(
        Injector._f_replay_rot,
        lambda ev: [
            _crash(ev),
            ("replay_damaged(when=load)", ev.has("replay_damaged", ev.game, ev.damaged("load"))),
        ],
        filler=1,
    ),
    # ... and with the supervisor killed between the replacement's report and its event.
    "report_lost": FaultKind(
        Injector._f_report_lost,
        lambda ev: [
            _crash(ev),
            (
                "replay_damaged(when=load), recorded by the successor",
                ev.has("replay_damaged", ev.game, ev.damaged("load")),
            ),
            _after_crash(ev),
        ],
        filler=1,
    ),
    # ... and under the running worker (its next checkpoint must not link the rotten base).
    "replay_rot_live": FaultKind(
        Injector._f_replay_rot_live,
        lambda ev: [
            (
                "replay_damaged(when=checkpoint)",
                ev.fault.chunk_rewritten
                or ev.has("replay_damaged", ev.game, ev.damaged("checkpoint")),
            )
        ],
        filler=1,
    ),
    # EIO on every checkpoint read of one game for a while (the store's read seam).
    "read_eio": FaultKind(
        Injector._f_read_eio,
        lambda ev: [
            _crash(ev),
            ("checkpoint_unreadable", ev.has("checkpoint_unreadable", ev.game)),
        ],
        filler=1,
    ),
    # SIGSEGV/SIGABRT/SIGBUS/SIGILL right after each of three resumes.
    "crash_storm": FaultKind(
        Injector._f_crash_storm,
        lambda ev: [("worker_exit + worker_crash for every storm signal", ev.storm_crashes())],
        filler=1,
    ),
    # A running game's env_id changed and reloaded (refused), then reverted (accepted).
    "env_id_change": FaultKind(Injector._f_env_id_change, lambda ev: [], long_filler=1),
    # The whole state dir full (SQLite, logs, heartbeats) for 10 s.
    "state_disk_full": FaultKind(
        Injector._f_state_disk_full,
        lambda ev: [
            *_state_db(ev),
            (
                "write_failed (a worker's write, in the window)",
                ev.has(
                    "write_failed",
                    None,
                    lambda e: e["ts"] <= (ev.fault.window_wall or (0, 1e12))[1] + 5,
                ),
            ),
        ],
        long_filler=1,
        forbid=("worker_hang", "worker_crash", "worker_oom"),
    ),
    # The state database's write lock held by another process for 6 s.
    "db_locked": FaultKind(
        Injector._f_db_locked,
        _state_db,
        long_filler=1,
        forbid=("worker_hang", "worker_crash", "worker_oom"),
    ),
    # The wall clock 5 min ahead while the supervisor is down and its workers frozen.
    # Neither a reboot nor a hang may be taken for it.
    "clock_step": FaultKind(
        Injector._f_clock_step, _clock_step, long_filler=1, forbid=("host_reboot", "worker_hang")
    ),
    # The pre-warmed spare SIGKILLed idle (or warming): spare_lost, and a new one spawned.
    "spare_kill": FaultKind(
        Injector._f_spare_kill,
        lambda ev: [
            ("spare_lost (of the killed spare)", ev.has("spare_lost", None, _of_spare(ev))),
            ("spare_spawned (its successor)", ev.has("spare_spawned", None, _not_spare(ev))),
        ],
        filler=1,
    ),
    # A worker SIGKILLed and the spare handed its game SIGKILLed mid hand-over.
    "spare_assign_kill": FaultKind(
        Injector._f_spare_assign_kill, lambda ev: [_crash(ev)], filler=1
    ),
    # The spare handed a game while the state database is locked, then the supervisor
    # SIGKILLed: the next one stops that worker (no row names it) before it starts the game.
    "handover_supervisor_kill": FaultKind(
        Injector._f_handover_supervisor_kill,
        lambda ev: [_after_crash(ev), *_stopped_unrecorded(ev)],
    ),
    # A burst of idle connections to the metrics endpoint (more than a service has descriptors)
    # and a worker SIGKILLed while they are held: replaced, scraped, descriptors bounded.
    # Hostile numbers where the supervisor reads (run dir files, accounting.json): every
    # reader validates; no traceback, no crash, the commands answer, the game trains on.
    "hostile_files": FaultKind(Injector._f_hostile_files, lambda ev: [], forbid=("fatal",)),
    "metrics_flood": FaultKind(
        Injector._f_metrics_flood, lambda ev: [_crash(ev)], forbid=("fatal", "worker_hang")
    ),
    # Every worker SIGKILLed while the hook on worker_crash/restart misbehaves (output, a setsid
    # descendant holding it, sleeping past timeout_s): runs bounded, nothing left, no hang.
    "hook_storm": FaultKind(
        Injector._f_hook_storm,
        lambda ev: [
            _crash(ev),
            (
                "hook_failed (a run killed at its timeout_s)",
                ev.has("hook_failed", None, lambda e: "timeout_s" in str(e["detail"].get("error"))),
            ),
        ],
        forbid=("fatal", "worker_hang"),
    ),
    # [mirror] url changed and reloaded while a worker is SIGKILLed: refused whole, uploads go
    # on to the location in force, the replacement resumes; then reverted.
    "mirror_move": FaultKind(
        Injector._f_mirror_move,
        lambda ev: [
            _crash(ev),
            (
                "config_error (naming mirror.url)",
                ev.has("config_error", None, lambda e: "mirror.url" in str(e["detail"])),
            ),
            (
                "mirror_ok (after the refusal)",
                ev.has("mirror_ok", None, lambda e: e["id"] > (ev.fault.after_event_id or 1 << 62)),
            ),
        ],
        forbid=("fatal",),
    ),
    # An operator's pins: `rlsup scale --mode light` early, `--mode auto` later (placed by the
    # schedule, not drawn).
    "scale_light": FaultKind(
        Injector._f_scale_light, _pinned("light"), invariants=Analyst.scaled, opening=0
    ),
    "scale_auto": FaultKind(
        Injector._f_scale_auto, _pinned("auto"), invariants=Analyst.scaled, opening=0
    ),
}
