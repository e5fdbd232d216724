"""File helpers every wing shares, on the ground floor (they import nothing of the supervisor):
private state directories and bounded logs. The launchers, the mirror's uploader, the hooks and
the ledger all write such files; keeping the helpers here lets none of them import another wing
for a few lines of file handling."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from checkpoints.perms import DIR_MODE, masked

LOG_ROTATE_BYTES = 64 << 20


def make_private_dir(path: Path) -> Path:
    """A state directory: its owner's, and its group's to read where the umask allows it
    (the systemd unit's operators group); never anyone else's."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, masked(DIR_MODE))
    return path


def rotate_log(path: Path, limit: int = LOG_ROTATE_BYTES) -> None:
    """Keep one previous log (`.1`) once the current one passes `limit` bytes."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > limit:
            os.replace(path, path.with_name(path.name + ".1"))


def rotate_live_log(path: Path, limit: int = LOG_ROTATE_BYTES) -> bool:
    """A live worker's log past `limit` bytes: its content becomes `.1` (the one previous
    kept) and the file is truncated in place, where the worker, which appends (O_APPEND),
    goes on writing. Renaming it would not do: the worker's fd would follow the old file. The
    copy chases the writer to the end before the truncate, so only a line written in that
    last instant can be lost (logrotate's copytruncate). True when it rotated."""
    try:
        if path.stat().st_size <= limit:
            return False
        previous = path.with_name(path.name + ".1")
        staging = path.with_name(f".{path.name}.1.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        src = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            dst = os.open(staging, flags, 0o640)
            try:
                _copy_to_end(src, dst)
                os.ftruncate(src, 0)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        os.replace(staging, previous)
        return True
    except OSError:
        return False


def _copy_to_end(src: int, dst: int) -> None:
    """Copy `src` to `dst` until a read finds nothing more (the writer may still append)."""
    offset = 0
    while True:
        size = os.fstat(src).st_size
        if size <= offset:
            return
        while offset < size:
            sent = os.sendfile(dst, src, offset, size - offset)
            if sent == 0:
                return
            offset += sent
