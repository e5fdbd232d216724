"""What a supervisor's start records: its row, and the events that say what the start means."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import structlog

from checkpoints.names import newest_step
from supervisor.config import Config
from supervisor.launch.process import start_ticks
from supervisor.launch.spawn import (
    find_leftover,
    orphaned_remains,
    stop_leftovers,
    unrecorded_workers,
)
from supervisor.ledger import db
from supervisor.ledger.db import BootOutcome
from supervisor.lifecycle.liveness import REPORT_KINDS, new_reports, reported_from_events
from supervisor.lifecycle.runtime import GameRuntime
from supervisor.lifecycle.states import WorkerState
from supervisor.preemption.notice import previous_boot_notice
from supervisor.sdnotify import Notifier, systemd_unit
from training import protocol

log = structlog.get_logger("rlsup.supervisor")


def supervisor_row(boot_id: str, now_wall: float, config: Path) -> dict[str, Any]:
    """The `supervisor` table's row for this process (identity: pid + start ticks)."""
    return {
        "pid": os.getpid(),
        "pid_create_time": psutil.Process().create_time(),
        "pid_start_ticks": start_ticks(os.getpid()),
        "boot_id": boot_id,
        "started": now_wall,
        "last_tick": now_wall,
        "config_path": str(config),
        "state": "running",
        "systemd_unit": systemd_unit(os.environ),
    }


def with_preemption(outcome: BootOutcome, notice: dict[str, Any] | None) -> BootOutcome:
    """A new boot after a counted preemption notice: `preempted`, not an unexpected reboot."""
    if notice is None or not notice.get("counted", True):
        return outcome
    return dataclasses.replace(outcome, kind="preempted")


def boot_outcome(
    conn: sqlite3.Connection, boot_id: str, now: float
) -> tuple[BootOutcome, tuple[str, None, dict[str, Any]] | None]:
    """This start's verdict (`preempted` after a standing notice) and its boot event."""
    outcome = db.classify_boot(conn, boot_id, now)
    notice = previous_boot_notice(conn, outcome, now)
    outcome = with_preemption(outcome, notice)
    return outcome, reboot_event(outcome, notice)


def reboot_event(
    outcome: BootOutcome, notice: dict[str, Any] | None = None
) -> tuple[str, None, dict[str, Any]] | None:
    """`preempted` after a preemption (recorded with the boot itself), `host_reboot` after an
    unexpected reboot (a preemption beyond `max_preemptions` a day is one too), else None."""
    base = {
        "boot_id": outcome.boot_id,
        "previous_boot_id": outcome.previous_boot_id,
        "downtime_s": outcome.downtime_s,
    }
    if outcome.kind == "preempted" and notice is not None:
        keys = ("provider", "action", "deadline", "notice_at", "notice_ts")
        return "preempted", None, {**base, **{k: notice.get(k) for k in keys}}
    if outcome.kind != "host_reboot":
        return None
    over = {"preemption_notice": True, "over_max_preemptions": True} if notice else {}
    return "host_reboot", None, {**base, "unexpected": True, **over}


def start_event(
    outcome: BootOutcome, leftovers: list[int], config: Path, host_mode: str
) -> dict[str, Any]:
    """`supervisor_start`'s detail: what came before (first start, a reboot, a supervisor
    restart or crash) and which leftovers were stopped."""
    return {
        "pid": os.getpid(),
        "boot_id": outcome.boot_id,
        "after": outcome.kind,
        "downtime_s": outcome.downtime_s,
        "leftover_workers_stopped": leftovers,
        "config": str(config),
        "host_mode": host_mode,
    }


def stop_leftover_workers(rows: list[dict[str, Any]], cfg: Config, notifier: Notifier) -> list[int]:
    """Same boot, new supervisor: stop the workers of the database's rows still alive (same
    pid and start time), what is left of the sessions of those that are gone (a wrapper's
    children, a forked child still holding the run-dir lock), and the workers of this state
    directory's games that no row names (started an instant before the last supervisor died),
    BEFORE any worker is started.
    Draining them can outlast systemd's start timeout: ask it for the time. Returns the pids
    stopped."""
    procs: list[psutil.Process] = []
    orphaned: dict[int, list[int]] = {}
    for row in rows:
        ticks = row.get("pid_start_ticks")
        if p := find_leftover(row["pid"], ticks, row["pid_create_time"]):
            procs.append(p)
        elif remains := orphaned_remains(row["pid"], ticks):
            orphaned[row["pid"]] = remains
    # Those no row names: started just before the last supervisor died, their row unwritten.
    known = {p.pid for p in procs} | {pid for pids in orphaned.values() for pid in pids}
    unrecorded = unrecorded_workers(cfg.state_dir / "runs", known)
    if not procs and not orphaned and not unrecorded:
        return []
    notifier.extend_timeout(cfg.stop_grace_s + 30, "stopping leftover workers")
    log.warning(
        "leftover_workers",
        pids=[p.pid for p in procs],
        orphaned=orphaned,
        unrecorded=[p.pid for p in unrecorded],
    )
    return stop_leftovers([*procs, *unrecorded], cfg.stop_grace_s, orphaned)


_CATCH_UP_WINDOW = 500  # report events of a game searched for a worker's pid


def unrecorded_reports(
    conn: sqlite3.Connection, rows: list[dict[str, Any]], run_dir: Callable[[str], Path]
) -> list[tuple[str, str, dict[str, Any]]]:
    """(game, kind, detail) of what the previous supervisor's workers reported in their last
    heartbeat and it never turned into an event: it died in between (a damaged replay chunk
    found at load, a quarantined checkpoint, a failed write). Read once those workers are
    stopped, before any new worker overwrites the heartbeat; dedup by the pid each report
    event names (its newest `_CATCH_UP_WINDOW` events of the game)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for row in rows:
        hb = protocol.read_heartbeat(run_dir(row["game"]))
        if hb is None or row.get("pid") is None or hb.pid != row["pid"]:
            continue
        recorded = db.events(
            conn, game=row["game"], kind=list(REPORT_KINDS), limit=_CATCH_UP_WINDOW
        )
        seen = reported_from_events(hb.pid, ((e.kind, e.detail) for e in recorded))
        for kind, detail in new_reports(seen, hb):
            out.append((row["game"], kind, {**detail, "caught_up": True}))
    return out


def restore_states(
    games: dict[str, GameRuntime], rows: list[dict[str, Any]], run_dir: Callable[[str], Path]
) -> None:
    """Restart counts carry over; a game recorded DONE whose checkpoints reached total_steps
    stays done (`run_dir(name)` gives a game's run directory)."""
    by_game = {r["game"]: r for r in rows}
    for name, rt in games.items():
        row = by_game.get(name)
        rt.restarts = row["restarts"] if row else 0
        newest = newest_step(run_dir(name) / protocol.CHECKPOINT_DIR)
        if row and row["state"] == WorkerState.DONE and (newest or -1) >= rt.spec.total_steps:
            rt.state = WorkerState.DONE
            rt.reason = row["reason"] or "done"
