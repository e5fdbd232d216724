"""The SDK's last words: an exit the supervisor must read as more than a crash (a fenced
placement, a checkpoint it cannot read, checkpoints of which none verifies, running out of
memory) leaves error.json in the run directory, as rlsup's own workers do (training/entry.py),
then exits with the worker's code for it.

error.json carries `pid` and `sid` (the session): behind a wrapper (`sh -c`, `uv run`) the
script is not the process the supervisor started, but it is in that process's session, and
the supervisor takes an error.json signed by its worker's session as the game's.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn

from rlsup._errors import NoValidCheckpoint, say
from training import protocol as P
from training.oom import oom_kind
from training.protocol import ExitCode, Phase

if TYPE_CHECKING:
    from rlsup._run import Run

NO_VALID = "no_valid_checkpoint"  # training.errors.NoValidCheckpointError.kind
UNREADABLE = "checkpoint_unreadable"  # training.errors.CheckpointUnreadableError.kind
UNREADABLE_EXIT = 1  # what the worker exits with for it (a failure: backoff, then again)
# Read errors that say the disk (or the mount) failed, not that the file is bad.
READ_ERRNOS = frozenset(
    {errno.EIO, errno.EACCES, errno.EPERM, errno.ESTALE, errno.ENXIO, errno.ENODEV,
     errno.ETIMEDOUT, errno.EREMOTEIO, errno.ENOTCONN, errno.EHOSTDOWN}
)  # fmt: skip


def write_error(
    run_dir: Path, kind: str, message: str, code: int, step: int | None, tb: str | None = None
) -> None:
    """error.json for the supervisor (never raises: a full disk leaves the exit status).
    `tb`: the traceback (default: the exception being handled, if any)."""
    if tb is None:
        tb = traceback.format_exc() if sys.exc_info()[0] is not None else ""
    with contextlib.suppress(Exception):
        from checkpoints import write_json_atomic

        write_json_atomic(
            run_dir / P.ERROR_FILE,
            {"kind": kind, "message": message, "exit_code": int(code), "time": time.time(),
             "pid": os.getpid(), "sid": os.getsid(0), "step": step,
             "traceback": tb[-4000:]},
        )  # fmt: skip


def exit_with(run: Run, kind: str, message: str, code: int, step: int | None = None) -> NoReturn:
    """Say `message`, leave error.json, stop heartbeating and exit `code`."""
    say(message)
    write_error(run.run_dir, kind, message, code, step)
    run.close(phase=Phase.STOPPING)
    raise SystemExit(int(code))


def unreadable(run: Run, what: str, exc: BaseException) -> NoReturn:
    """A checkpoint that cannot be read (EIO, EACCES, ...): kept as it is, not quarantined;
    the script exits 1 with kind checkpoint_unreadable and the supervisor retries after a
    backoff, when the disk (or the mount) may be back. Never a start from step 0."""
    exit_with(
        run,
        UNREADABLE,
        f"{what}: {exc}; the checkpoints are kept as they are, the supervisor starts the "
        "script again after a backoff",
        UNREADABLE_EXIT,
    )


def install_excepthook(run: Run) -> Callable[[], None]:
    """What the script lets escape, told to the supervisor as the worker would tell it (the
    traceback is printed as before):
    - `NoValidCheckpoint` (checkpoints exist, none verifies): error.json kind
      no_valid_checkpoint and exit 78, FATAL at once as for the worker: no restart can help,
      and none may start from zero. A script that catches it decides for itself.
    - running out of memory (MemoryError, torch's OutOfMemoryError, an allocator's text:
      training.oom): error.json kind cuda_oom / host_oom and exit 76, so the stability policy
      scales the game down (`run.knobs`) instead of counting a crash.
    - an OSError of the kind a failing disk raises, about a file under the checkpoints (its
      own reads go around the store: `torch.load(ckpt / "m.pt", weights_only=True)`):
      checkpoint_unreadable.
    Returns what takes the hook out again (`Run.close()`)."""
    previous = sys.excepthook
    root = os.path.abspath(run.store.root) + os.sep

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, NoValidCheckpoint):
            text = "".join(traceback.format_exception(kind, exc, tb))
            message = f"{exc}; refusing to start from zero (exit 78: a restart cannot help)"
            write_error(run.run_dir, NO_VALID, message, int(ExitCode.CONFIG), None, text)
            previous(kind, exc, tb)
            _exit_now(int(ExitCode.CONFIG))
        if (oom := oom_kind(exc)) is not None:
            text = "".join(traceback.format_exception(kind, exc, tb))
            where = "CUDA" if oom == "cuda_oom" else "host"
            message = f"{where} out of memory: {type(exc).__name__}: {exc}"
            write_error(run.run_dir, oom, message, int(ExitCode.OOM), None, text)
            previous(kind, exc, tb)
            _exit_now(int(ExitCode.OOM))
        filename = getattr(exc, "filename", None)
        if (
            isinstance(exc, OSError)
            and exc.errno in READ_ERRNOS
            and isinstance(filename, str | os.PathLike)
            and os.path.abspath(os.fspath(filename)).startswith(root)
        ):
            message = f"reading {os.fspath(filename)}: {exc}"
            say(message + "; the checkpoints are kept as they are (checkpoint_unreadable)")
            text = "".join(traceback.format_exception(kind, exc, tb))
            write_error(run.run_dir, UNREADABLE, message, UNREADABLE_EXIT, None, text)
        previous(kind, exc, tb)

    def uninstall() -> None:
        if sys.excepthook is hook:
            sys.excepthook = previous

    sys.excepthook = hook
    return uninstall


def _exit_now(code: int) -> NoReturn:
    """Exit `code` from an excepthook, where raising SystemExit is too late (the interpreter
    exits 1 after the hook): the atexit handlers first (the script's own, and Run.close's last
    heartbeat), as a normal exit would run them."""
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
