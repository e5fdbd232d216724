"""What a supervisor's start records: its row, and the events that say what the start means."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from supervisor.db import BootOutcome
from supervisor.launcher import start_ticks
from supervisor.sdnotify import systemd_unit


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


def start_events(
    outcome: BootOutcome, leftovers: list[int], config: Path, host_mode: str
) -> list[tuple[str, dict[str, Any]]]:
    """`host_reboot` after an unexpected one, then `supervisor_start` saying what came before
    (first start, a reboot, a supervisor restart or crash) and which leftovers were stopped."""
    events: list[tuple[str, dict[str, Any]]] = []
    if outcome.kind == "host_reboot":
        events.append(("host_reboot", {
            "boot_id": outcome.boot_id,
            "previous_boot_id": outcome.previous_boot_id,
            "downtime_s": outcome.downtime_s,
            "unexpected": True,
        }))  # fmt: skip
    events.append(("supervisor_start", {
        "pid": os.getpid(),
        "boot_id": outcome.boot_id,
        "after": outcome.kind,
        "downtime_s": outcome.downtime_s,
        "leftover_workers_stopped": leftovers,
        "config": str(config),
        "host_mode": host_mode,
    }))  # fmt: skip
    return events
