"""A process's identity (pid + start ticks), read from /proc: stdlib only, so that `rlsup
status` can tell a live worker from a recycled pid without importing psutil (~11 ms)."""

from __future__ import annotations

import os
from pathlib import Path

# The exit status of a worker whose host was lost (several hosts): not a real process's, a
# launcher's verdict. The game is placed again elsewhere, not counted as a crash.
HOST_LOST_RC = 1000


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc/<pid>/stat field 22), or None when
    it is gone or a zombie. With the pid, the identity of a process: unlike psutil's
    create_time (boot time + this, in wall-clock seconds), no wall-clock step moves it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def same_process(pid: int | None, ticks: int | None, create_time: float | None = None) -> bool:
    """Is `pid` alive and still the process recorded with these start ticks? Rows written
    before start ticks were recorded fall back to psutil's create time (within 1 s)."""
    if not pid:
        return False
    now = start_ticks(pid)
    if now is None:
        return False
    if ticks is not None:
        return now == ticks
    if create_time is None:
        return True
    started = create_time_of(now)  # rows of old versions only
    return started is not None and abs(started - create_time) <= 1.0


def create_time_of(ticks: int) -> float | None:
    """psutil's `create_time` of the process that started `ticks` clock ticks after boot:
    ticks / CLK_TCK + the boot's wall time (/proc/stat `btime`), psutil's own reckoning on
    Linux, without importing it (~11 ms of every `rlsup status` that meets an old row);
    None when /proc/stat cannot tell."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime"):
                    return float(ticks) / os.sysconf("SC_CLK_TCK") + float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
