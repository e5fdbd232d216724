"""The one seam that spawns and signals processes (fakeable in unit tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
WORKER_MODULE = "training.worker"


@dataclass
class WorkerProcess:
    """A spawned worker: its Popen, a pidfd (readable when it exits), its create time."""

    popen: subprocess.Popen[bytes]
    pidfd: int
    create_time: float
    started_mono: float

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def close(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


class Launcher:
    """Spawns `python -m training.worker ARGV` in its own session, logs to a private file."""

    def __init__(self, python: str = sys.executable, module: str = WORKER_MODULE) -> None:
        self.python = python
        self.module = module

    def spawn(self, argv: list[str], log_path: Path, now_mono: float) -> WorkerProcess:
        env = dict(os.environ)
        # Not pip-installed yet (or run from a checkout): the worker must find `training`.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env.pop("NOTIFY_SOCKET", None)  # only the supervisor talks to systemd
        env.pop("WATCHDOG_USEC", None)
        env.pop("WATCHDOG_PID", None)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            popen = subprocess.Popen(
                [self.python, "-m", self.module, *argv],
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(fd)
        pidfd = os.pidfd_open(popen.pid)
        try:
            create_time = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            create_time = 0.0
        return WorkerProcess(popen, pidfd, create_time, now_mono)

    def terminate(self, proc: WorkerProcess) -> None:
        """Ask to checkpoint and exit; SIGCONT too, since a stopped process cannot act on it."""
        self._signal(proc.pid, signal.SIGTERM)
        self._signal(proc.pid, signal.SIGCONT)

    def kill(self, proc: WorkerProcess) -> None:
        # The worker leads its own process group: take anything it spawned with it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self._signal(proc.pid, signal.SIGKILL)

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def find_leftover(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The process `pid` if it is still the worker we started (same create time, a worker)."""
    if not pid or not create_time:
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > 1.0 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if not any(WORKER_MODULE in part for part in proc.cmdline()):
            return None
        return proc
    except psutil.Error:
        return None


def stop_leftovers(procs: list[psutil.Process], grace_s: float) -> list[int]:
    """SIGTERM (+SIGCONT) them all, wait against one deadline, SIGKILL the rest. Returns pids."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
            p.send_signal(signal.SIGCONT)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    deadline = time.monotonic() + 5
    while (
        any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in alive)
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return [p.pid for p in procs]
