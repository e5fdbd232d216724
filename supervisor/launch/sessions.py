"""A worker is its whole session: every process a game's command started (`sh -c "a & b & exec
python train.py"`, `uv run`, `torchrun`, a forked child holding the run-dir lock) shares the
session id the supervisor gave its leader (`start_new_session`: sid = the leader's pid). The
launchers signal the leader's process group, and once the leader is gone they find what
remains by session id (/proc/<pid>/stat field 6) and kill it, so nothing of a game outlives it.

A session's id stays reserved while any process is in it (the kernel never hands out a pid still
in use as a session id), so remains found by the id of a dead leader are that leader's. Each one
is signalled through a pidfd opened after it was found and checked again: never a process that
took a recycled pid in between."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def session_of(pid: int) -> int | None:
    """The session id of a live (not zombie) `pid`, or None."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 4 or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[3])
    except ValueError:
        return None


def members(sid: int) -> list[int]:
    """Live processes (zombies left out: they are dead, only unreaped) of session `sid`."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and session_of(pid := int(entry.name)) == sid:
                found.append(pid)
    return found


def is_ours(sid: int, leader_ticks: int | None) -> bool:
    """Is session `sid` still the one our leader (started at `leader_ticks`) made? Its leader
    there (alive or not yet reaped) and the same process, or gone (its id is then reserved by
    what remains of it)."""
    fields = _stat_fields(sid)
    if fields is None:
        return True
    return leader_ticks is not None and len(fields) > 19 and fields[19] == str(leader_ticks)


def signal_members(sid: int, sig: int, pids: Iterable[int] | None = None) -> list[int]:
    """Send `sig` to every live member of session `sid` (or those of `pids` still in it);
    returns the pids signalled."""
    sent = []
    for pid in members(sid) if pids is None else pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        try:
            if session_of(pid) == sid:  # the pid, now pinned by the fd, still one of ours
                signal.pidfd_send_signal(fd, sig)
                sent.append(pid)
        except OSError:
            pass
        finally:
            os.close(fd)
    return sent


def signal_group(leader: int, sig: int) -> None:
    """`sig` to the leader's process group (everything it started that did not leave it);
    to the leader alone when the group is gone or not ours to signal."""
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(leader, sig)


def wait_empty(sids: Iterable[int], timeout_s: float, poll_s: float = 0.02) -> bool:
    """Wait until no live process is left in any of `sids`; True when none is."""
    sids = list(sids)
    deadline = time.monotonic() + timeout_s
    while any(members(sid) for sid in sids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def kill_session(sid: int, wait_s: float = 2.0) -> list[int]:
    """SIGKILL every member of session `sid` and wait (a bounded while) until they are gone,
    so that what they held (the run-dir lock) is free for the next worker. Returns the pids."""
    killed = signal_members(sid, signal.SIGKILL)
    if killed:
        wait_empty([sid], wait_s)
    return killed
