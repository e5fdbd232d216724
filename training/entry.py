"""A training worker's process, from its argv to its exit code: the configuration (exit 78
before torch is imported), the run-dir lock, the stop flags (signals, the parent gone), and
every error path to error.json and an exit code (`Worker`); the session itself is
training/session.py.

Shared by both ways a worker comes to be: a cold start (`python -m training.worker ARGV`,
training/worker.py) and a spare that took its assignment (training/standby.py). Exit codes,
heartbeat and files: see training/protocol.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from training.args import ConfigError, WorkerConfig
from training.protocol import ERROR_FILE, ExitCode, ParentWatch, RunDirBusy, lock_run_dir

# A predecessor may still be writing its last checkpoint: wait this long for the run-dir lock.
LOCK_WAIT_S = float(os.environ.get("RLSUP_WORKER_LOCK_WAIT_S", "60"))


class StopRequested:
    """Set by signal handlers and the parent watch; read by the training loop."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def __bool__(self) -> bool:
        return self.reason is not None

    def set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


class RunDirLocked(RuntimeError):
    pass


def main(argv: list[str], start: dict[str, Any] | None = None) -> int:
    """Be the worker `argv` describes, to its exit code. `start`: how this process came to be
    this worker (heartbeat `start`); a spare that took its assignment passes
    {"served": "spare", "assigned": <monotonic>}."""
    # gymnasium warns about envpool's float64 Box bounds on every env made: noise, not news.
    warnings.filterwarnings("ignore", category=UserWarning, module="gymnasium")
    try:
        cfg = WorkerConfig.from_argv(argv)
        run_dir = prepare_run_dir(Path(cfg.run_dir))
    except ConfigError as exc:
        print(f"rlsup worker: configuration error: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    except RunDirUnavailable as exc:
        print(f"rlsup worker: cannot create the run dir now: {exc}", file=sys.stderr)
        return 1
    stop = StopRequested()
    install_signal_handlers(stop)
    try:
        with run_dir_lock(run_dir):
            return Worker(cfg, run_dir, stop, start or {"served": "cold"}).run()
    except RunDirLocked as exc:
        print(f"rlsup worker: {exc}", file=sys.stderr)
        # The supervisor reads error.json to say why a worker died: give it the reason.
        from checkpoints import write_json_atomic

        with contextlib.suppress(OSError):
            write_json_atomic(
                run_dir / ERROR_FILE,
                {"kind": "run_dir_locked", "message": str(exc), "exit_code": 1,
                 "time": time.time(), "pid": os.getpid(), "step": None, "traceback": ""},
            )  # fmt: skip
        return 1


# A run dir that cannot be created for these reasons may well be creatable later: not a
# configuration error (exit 78 would make the game FATAL), a failure to retry.
TRANSIENT_MKDIR_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM})


class RunDirUnavailable(RuntimeError):
    pass


def prepare_run_dir(run_dir: Path) -> Path:
    """Create the run dir (0700) or explain why it cannot be used; writes nothing else."""
    try:
        run_dir.mkdir(mode=0o750, parents=True, exist_ok=True)  # the umask has the last word
    except OSError as exc:
        if exc.errno in TRANSIENT_MKDIR_ERRNOS:
            raise RunDirUnavailable(f"--run-dir {str(run_dir)!r}: {exc.strerror}") from exc
        raise ConfigError(f"--run-dir {str(run_dir)!r}: cannot create it: {exc.strerror}") from exc
    if not run_dir.is_dir() or not os.access(run_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--run-dir {str(run_dir)!r}: not a writable directory")
    return run_dir


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Never two writers on one run directory."""
    try:
        fd = lock_run_dir(run_dir, LOCK_WAIT_S)
    except RunDirBusy as exc:
        raise RunDirLocked(
            f"run dir {run_dir} is locked by another worker (pid {exc.holder})"
        ) from exc
    try:
        yield
    finally:
        os.close(fd)


def install_signal_handlers(stop: StopRequested) -> None:
    def handler(signum: int, _frame: FrameType | None) -> None:
        stop.set(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


class Worker:
    """The worker's life: load, train, checkpoint, evaluate, stop — every exit path defined."""

    def __init__(
        self,
        cfg: WorkerConfig,
        run_dir: Path,
        stop: StopRequested,
        start: dict[str, Any] | None = None,
    ) -> None:
        from training import logs

        self.cfg = cfg
        self.start = start or {"served": "cold"}
        self.run_dir = run_dir
        self.stop = stop
        # RLSUP_PARENT_PID (set by the supervisor), else the parent now: a worker orphaned
        # before it got here sees the difference at once.
        self.parent = ParentWatch.from_env()
        self.log = logs.configure(game=cfg.game, algo=cfg.algo, pid=os.getpid())
        self.step = 0

    def run(self) -> int:
        try:
            return self._run()
        except ConfigError as exc:
            kind = getattr(exc, "kind", "config")
            return self._error_exit(ExitCode.CONFIG, kind, str(exc))
        except MemoryError as exc:
            return self._error_exit(ExitCode.OOM, "host_oom", f"host out of memory: {exc}")
        except Exception as exc:
            from training.oom import oom_kind

            oom = oom_kind(exc)  # the same reading as the SDK's (cuDNN's words name no CUDA)
            if oom is not None:
                where = "CUDA" if oom == "cuda_oom" else "host"
                return self._error_exit(ExitCode.OOM, oom, f"{where} out of memory: {exc}")
            kind = getattr(exc, "kind", "crash")
            # Several hosts: placed elsewhere since (errors.PlacementFencedError): exit 77.
            code = ExitCode.FENCED if kind == "fenced" else 1
            return self._error_exit(code, kind, f"{type(exc).__name__}: {exc}")

    def _error_exit(self, code: int, kind: str, message: str) -> int:
        detail = {
            "kind": kind,
            "message": message,
            "traceback": traceback.format_exc()[-4000:],
            "step": self.step,
            "exit_code": int(code),
            "time": time.time(),
            "pid": os.getpid(),
        }
        with contextlib.suppress(OSError):
            from checkpoints import write_json_atomic

            write_json_atomic(self.run_dir / ERROR_FILE, detail)
        self.log.error("worker_error", kind=kind, message=message, exit_code=int(code))
        return int(code)

    def _run(self) -> int:
        from training.session import TrainingSession

        session = TrainingSession(
            self.cfg, self.run_dir, self.log, self._watch_parent, start=self.start
        )
        try:
            code = session.run(self.stop)
        finally:
            self.step = session.step
            session.close()
        return code

    def _watch_parent(self) -> None:
        if self.parent.gone():
            self.stop.set("parent_gone")
