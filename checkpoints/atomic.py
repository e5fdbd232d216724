"""Low-level durable file primitives: whole-buffer writes, fsync of dirs, atomic replace.

Order for an atomic replace follows PostgreSQL's durable_rename(): write a temp file in the
same directory, fsync it, rename over the target, fsync the directory (FIELD-NOTES lesson 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

from checkpoints import _retry
from checkpoints.perms import DIR_MODE, FILE_MODE, masked

# O_EXCL: a file we create is always new, so a stale file can never be partly reused;
# O_NOFOLLOW: never write through a symlink planted in our directory.
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW

# Linux caps one write() at about 2 GiB; stay well below it.
_MAX_WRITE = 1 << 30


def as_byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    """View any C-contiguous buffer (e.g. a numpy array's memory) as flat bytes, no copy."""
    view = memoryview(data)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")
    return view


def write_all(fd: int, data: bytes | bytearray | memoryview) -> int:
    """Write the whole buffer, looping over short writes. Returns bytes written."""
    view = as_byte_view(data)
    total = len(view)
    offset = 0
    while offset < total:
        offset += os.write(fd, view[offset : offset + _MAX_WRITE])
    return total


def create_file(path: Path, mode: int = FILE_MODE) -> int:
    """Create a new file and return its fd: `mode` as the umask leaves it, never for others."""
    fd = os.open(path, _CREATE_FLAGS, mode)
    try:
        os.fchmod(fd, masked(mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dir(path: Path, mode: int = DIR_MODE) -> None:
    """Create a directory: `mode` as the umask leaves it, never anything for others."""
    os.mkdir(path, mode)
    os.chmod(path, masked(mode))


def fsync_dir(path: Path) -> None:
    """fsync a directory so that entries created/renamed in it survive power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(
    path: Path, data: bytes, *, durable: bool = True, mode: int = FILE_MODE
) -> None:
    """Replace `path` with `data` atomically: readers see the old or the new content, never a mix.

    durable=False skips both fsyncs: still atomic against a process crash, but a power loss may
    lose the update. Meant for files rewritten every second (heartbeat.json).
    """
    path = Path(path)
    # Leading '.' keeps the temp file out of globs for the real name; the uuid makes
    # concurrent writers (and a leftover from a crash) never collide.
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    fd = create_file(tmp, mode)
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        _retry.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any, *, durable: bool = True, mode: int = FILE_MODE) -> None:
    """Serialise `obj` as JSON and write it with write_file_atomic.

    Serialising first means a non-serialisable object raises before any file is touched.
    """
    data = json.dumps(obj, sort_keys=True, indent=2).encode("utf-8") + b"\n"
    write_file_atomic(Path(path), data, durable=durable, mode=mode)
