"""Bounded, jittered retries for transient I/O errors.

Used only around opening/reading files during load and around rename/link. Never around
write or fsync: after a failed fsync the page cache state is unknown, so retrying it and
trusting the result would be a lie (FIELD-NOTES lesson 3).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

TRANSIENT_ERRNOS = frozenset({errno.EINTR, errno.EAGAIN, errno.EBUSY})


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


transient_io = retry(
    stop=stop_after_attempt(4),
    # Small jittered waits: a transient errno clears in milliseconds, and a checkpoint
    # save should not stall the training loop for long on a sick disk.
    wait=wait_random_exponential(multiplier=0.005, max=0.1),
    retry=retry_if_exception(is_transient),
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


@transient_io
def open_read(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
