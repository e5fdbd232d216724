"""One supervisor per state directory: an exclusive flock on <state_dir>/supervisor.lock."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LockHeld(RuntimeError):
    """Another supervisor holds the state directory."""


def acquire_lock(state_dir: Path) -> int:
    """Exclusive flock on <state_dir>/supervisor.lock; returns the fd (kept open)."""
    path = state_dir / "supervisor.lock"
    # O_NOFOLLOW: a symlink planted as the lock must not make us write through it.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LockHeld(
            f"another rlsup supervisor (pid {holder}) already runs on {state_dir} (it holds {path})"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
