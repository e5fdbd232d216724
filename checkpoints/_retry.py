"""Bounded, jittered retries for transient I/O errors, and the one way the store opens a file
to read it.

Retries wrap opening/reading files and rename/link only. Never write or fsync: after a failed
fsync the page cache state is unknown, so retrying it and trusting the result would be a lie
(FIELD-NOTES lesson 3).

tenacity runs them when it is importable (the service, the built-in worker). The SDK (`import
rlsup`) reaches the store from a user's own interpreter, which may have only the standard
library: there the same policy (attempts, waits, predicate, re-raise) runs as a plain loop.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

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


def io_wait_s(attempt: int) -> float:
    """After failed attempt `attempt` (1-based): tenacity's wait_random_exponential(multiplier=
    0.005, max=0.1). Small jittered waits: a transient errno clears in milliseconds, and a
    checkpoint save should not stall the training loop for long on a sick disk."""
    return random.uniform(0.0, min(0.1, 0.005 * 2.0 ** (attempt - 1)))


def read_wait_s(attempt: int) -> float:
    """tenacity's wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05): 0.05,
    0.1, 0.2, 0.4 s (+ up to 0.05 s jitter), about 0.8 s before giving up."""
    return min(1.0, 0.05 * 2.0 ** (attempt - 1)) + random.uniform(0.0, 0.05)


IO_ATTEMPTS = 4
READ_ATTEMPTS = 5

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


def bounded_retry(
    call: Callable[[], _T],
    attempts: int,
    wait_s: Callable[[int], float],
    retry_on: Callable[[BaseException], bool],
) -> _T:
    """tenacity's Retrying(stop=stop_after_attempt(attempts), wait, retry=retry_if_exception(
    retry_on), reraise=True)(call), without tenacity."""
    attempt = 1
    while True:
        try:
            return call()
        except Exception as exc:
            if attempt >= attempts or not retry_on(exc):
                raise
        time.sleep(wait_s(attempt))
        attempt += 1


class RetryPolicy:
    """A decorator: the call retried `attempts` times at most while `retry_on` says so, waiting
    `wait_s(attempt)` after each failed one, the last error re-raised. tenacity runs it when it
    is importable, else `bounded_retry` does; chosen at the first call, so importing the store
    (as `import rlsup` does) imports neither."""

    def __init__(
        self,
        attempts: int,
        wait_s: Callable[[int], float],
        retry_on: Callable[[BaseException], bool],
        tenacity_wait: Callable[[Any], Any],
    ) -> None:
        self.attempts, self.wait_s, self.retry_on = attempts, wait_s, retry_on
        self._tenacity_wait = tenacity_wait  # the same waits as wait_s, in tenacity's terms
        self._runner: Callable[[Callable[[], Any]], Any] | None = None

    def __call__(self, fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return self.run(functools.partial(fn, *args, **kwargs))

        return cast(_F, wrapped)

    def run(self, call: Callable[[], _T]) -> _T:
        if self._runner is None:
            self._runner = self._make_runner()
        result: _T = self._runner(call)
        return result

    def _make_runner(self) -> Callable[[Callable[[], Any]], Any]:
        try:
            import tenacity
        except ImportError:  # a user's own interpreter, through the SDK
            return lambda call: bounded_retry(call, self.attempts, self.wait_s, self.retry_on)
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=self._tenacity_wait(tenacity),
            retry=tenacity.retry_if_exception(self.retry_on),
            reraise=True,
        )
        # A copy per call, as tenacity's own decorator makes: its statistics are per call.
        return lambda call: retrying.copy()(call)


transient_io = RetryPolicy(
    IO_ATTEMPTS,
    io_wait_s,
    is_transient,
    lambda t: t.wait_random_exponential(multiplier=0.005, max=0.1),
)
transient_read = RetryPolicy(
    READ_ATTEMPTS,
    read_wait_s,
    is_transient_read,
    lambda t: t.wait_exponential(multiplier=0.05, max=1.0) + t.wait_random(0, 0.05),
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
