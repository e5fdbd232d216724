"""Bounded, jittered retries for transient I/O errors, and the one way the store opens a file
to read it.

Retries wrap opening/reading files and rename/link only. Never write or fsync: after a failed
fsync the page cache state is unknown, so retrying it and trusting the result would be a lie
(FIELD-NOTES lesson 3).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
    wait_random_exponential,
)

from checkpoints import _faults

TRANSIENT_ERRNOS = frozenset({errno.EINTR, errno.EAGAIN, errno.EBUSY})
# Reads may also fail for a while and then succeed: a network filesystem's stale handle or
# I/O error, a full file table. Retried a little longer; still bounded (under 1 s).
TRANSIENT_READ_ERRNOS = TRANSIENT_ERRNOS | {
    errno.EIO,
    errno.ESTALE,
    errno.EMFILE,
    errno.ENFILE,
    errno.ENOMEM,
    errno.ETIMEDOUT,
}
# The errors that say something about a checkpoint's bytes (a file is missing, or is not a
# regular file: a symlink someone planted). Every other OSError on a read says the file could
# not be read, which is no evidence against it.
DAMAGE_ERRNOS = frozenset({errno.ENOENT, errno.ELOOP, errno.EISDIR, errno.ENOTDIR})


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def is_transient_read(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_READ_ERRNOS


def is_damage(exc: OSError) -> bool:
    return exc.errno in DAMAGE_ERRNOS


transient_io = retry(
    stop=stop_after_attempt(4),
    # Small jittered waits: a transient errno clears in milliseconds, and a checkpoint
    # save should not stall the training loop for long on a sick disk.
    wait=wait_random_exponential(multiplier=0.005, max=0.1),
    retry=retry_if_exception(is_transient),
    reraise=True,
)

transient_read = retry(
    stop=stop_after_attempt(5),
    # 0.05, 0.1, 0.2, 0.4 s (+ up to 0.05 s jitter): about 0.8 s before giving up.
    wait=wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05),
    retry=retry_if_exception(is_transient_read),
    reraise=True,
)


@transient_io
def rename(src: Path, dst: Path) -> None:
    os.rename(src, dst)


@transient_io
def replace(src: Path, dst: Path) -> None:
    os.replace(src, dst)


@transient_io
def link(src: Path, dst: Path) -> None:
    # follow_symlinks=False: never link through a symlink someone planted in a checkpoint.
    os.link(src, dst, follow_symlinks=False)


def open_read(path: Path) -> int:
    """Open a checkpoint file for reading (never through a symlink). Not retried here: the
    callers retry the whole read, open included, with `transient_read`."""
    _faults.check_read(path)
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
