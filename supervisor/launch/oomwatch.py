"""Did the kernel's OOM killer kill this worker? Only the kernel can say.

A SIGKILL that rlsup did not send is not evidence of an OOM: an operator's `kill -9`, a
container runtime, a cgroup being torn down all look the same from the exit status. The
kernel's own word comes from two places:

1. the kernel log (`/dev/kmsg`, readable as root or with CAP_SYSLOG): the OOM killer logs
   `Killed process <pid> (<comm>)` (and `oom-kill:...,pid=<pid>,...`) for every victim, with
   a timestamp since boot, so the record names this very process;
2. else the `oom_kill` counter of the supervisor's memory cgroup (cgroup v2 `memory.events`,
   v1 `memory.oom_control`), which the workers share: it rose since the last look.

Neither readable (an unprivileged user on a host without a memory controller): the answer is
"unknown", which rlsup treats as a crash, not an OOM.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

KMSG = "/dev/kmsg"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class OomVerdict:
    killed: bool | None  # None: no source could tell
    evidence: str


def kmsg_names_pid(text: str, pid: int) -> bool:
    """Does this kernel log message record the OOM killer killing `pid`?"""
    killed = re.search(rf"\bKilled process {pid} \(", text)
    return bool(killed or re.search(rf"\boom-kill:.*,pid={pid},", text))


def parse_kmsg_record(raw: bytes) -> tuple[float, str] | None:
    """`prio,seq,usec,flags;message` → (seconds since boot, message)."""
    head, sep, message = raw.decode("utf-8", "replace").partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3:
        return None
    try:
        return int(fields[2]) / 1e6, message.rstrip("\n")
    except ValueError:
        return None


class KernelOomWatch:
    def __init__(self, kmsg: str = KMSG, cgroup_dir: Path | None = None) -> None:
        self.kmsg = kmsg
        self.cgroup_dir = cgroup_dir if cgroup_dir is not None else _own_memory_cgroup()
        self._oom_kills = self._cgroup_oom_kills()

    def verdict(self, pid: int, start_ticks: int | None) -> OomVerdict:
        """Was `pid` (started at `start_ticks` since boot) killed by the OOM killer?"""
        since_s = None if start_ticks is None else start_ticks / _CLK_TCK - 5.0
        records = self._kmsg_records()
        rose = self._cgroup_rose()  # keep the baseline current either way
        if records is not None:
            for ts, message in records:
                if (since_s is None or ts >= since_s) and kmsg_names_pid(message, pid):
                    return OomVerdict(True, f"kernel log: {message.strip()[:200]}")
            return OomVerdict(False, "no OOM kill of this pid in the kernel log")
        if rose is not None:
            where = f"oom_kill counter of {self.cgroup_dir}"
            return OomVerdict(rose, f"{where} {'rose' if rose else 'unchanged'}")
        return OomVerdict(None, "neither the kernel log nor a cgroup oom_kill counter is readable")

    def _kmsg_records(self) -> list[tuple[float, str]] | None:
        try:
            fd = os.open(self.kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        out = []
        try:
            while True:
                try:
                    raw = os.read(fd, 8192)
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # overwritten while we read: go on
                        continue
                    if exc.errno == errno.EAGAIN:
                        break
                    return None
                if not raw:
                    break
                record = parse_kmsg_record(raw)
                if record is not None:
                    out.append(record)
        finally:
            os.close(fd)
        return out

    def _cgroup_rose(self) -> bool | None:
        now = self._cgroup_oom_kills()
        if now is None or self._oom_kills is None:
            self._oom_kills = now
            return None
        rose, self._oom_kills = now > self._oom_kills, now
        return rose

    def _cgroup_oom_kills(self) -> int | None:
        if self.cgroup_dir is None:
            return None
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError, ValueError):
                for line in (self.cgroup_dir / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return None


def _own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v2 unified, else v1 `memory`), if mounted."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/")
        elif "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        else:
            continue
        if candidate.is_dir():
            return candidate
    return None
