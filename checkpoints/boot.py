"""This boot's identity: tells a process restart apart from a host reboot (the manifest records
it; the ledger counts reboots by it). Stdlib only, and apart from the manifest: `rlsup status`
reads it and nothing else of the checkpoint store."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
BOOT_ID_ENV = "RLSUP_BOOT_ID_PATH"


def read_boot_id() -> str:
    """The kernel's boot id: tells a process restart apart from a host reboot.

    Read on every call (not cached) because tests and the supervisor may point
    RLSUP_BOOT_ID_PATH elsewhere at runtime. Where the file is missing (some containers), the
    identity falls back to when init (pid 1) started, in clock ticks since boot: new at every
    boot (or container start) and, unlike `btime` in /proc/stat, not moved by a wall-clock
    step. `btime` is the last resort; "unknown-boot" (reboots then go unnoticed) the very last.
    """
    path = os.environ.get(BOOT_ID_ENV) or DEFAULT_BOOT_ID_PATH
    try:
        boot_id = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        boot_id = ""
    return boot_id or _fallback_boot_id()


def _fallback_boot_id() -> str:
    try:
        stat = Path("/proc/1/stat").read_text(encoding="utf-8")
        return f"init-start-{int(stat.rsplit(')', 1)[1].split()[19])}"
    except (OSError, ValueError, IndexError):
        pass
    try:
        for line in Path("/proc/stat").read_text(encoding="utf-8").splitlines():
            if line.startswith("btime "):
                return f"btime-{int(line.split()[1])}"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown-boot"
