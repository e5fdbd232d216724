"""The one seam that spawns and signals processes (fakeable in unit tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil  # type: ignore[import-untyped]

from supervisor.procid import same_process as same_process
from supervisor.procid import start_ticks as start_ticks
from training.protocol import PARENT_PID_ENV

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.spare import SpareKeeper, SpareWant

PROJECT_ROOT = Path(__file__).resolve().parent.parent
WORKER_MODULE = "training.worker"


def process_argv(cmdline: list[str]) -> list[str]:
    """A process's argv as psutil reads it, whether or not it was retitled: a worker started
    from the spare carries its command line as one string (setproctitle), NUL-padded."""
    parts = [part for part in cmdline if part]
    if len(parts) == 1 and " " in parts[0]:
        return parts[0].split()
    return list(cmdline)


class NoRoom(OSError):
    """No host has room for another game now (several hosts): the game waits, no failure."""


@dataclass
class WorkerProcess:
    """A spawned worker: its Popen, a pidfd (readable when it exits), its identity."""

    popen: subprocess.Popen[bytes]
    pidfd: int
    create_time: float  # wall clock, for display
    started_mono: float
    start_ticks: int | None = None  # identity: clock ticks since boot
    served: str = "cold"  # "cold" (a fresh process) or "spare" (the pre-warmed one)
    # Its monotonic clock is the supervisor's (the same host): the start breakdown may
    # subtract the worker's marks from the supervisor's readings.
    same_clock: bool = True

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        return self.popen.wait(timeout)

    def placement(self) -> dict[str, Any]:
        """Where it runs, for its events: {} on this host; host and epoch on several."""
        return {}

    def lost_before_start(self) -> bool:
        """Did it die before it became the worker (a spare that never took its assignment)?
        Then the game never had this worker: it starts again at once, no failure."""
        return False

    def close(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


def start_worker_process(
    cmd: list[str],
    log_path: Path,
    cwd: Path | None,
    pass_fds: tuple[int, ...] = (),
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`cmd` (a worker) in its own session, in `cwd`, output appended to `log_path` (never
    through a link), with an environment that finds rlsup's packages and lacks systemd's;
    `pass_fds`: descriptors it inherits (a spare's channel); `extra_env`: set on top (its
    GPU: `CUDA_VISIBLE_DEVICES`)."""
    env = {**os.environ, **(extra_env or {})}
    # Not pip-installed yet (or run from a checkout): the worker must find `training`.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    # Its parent, for a worker orphaned before it could ask (it then checkpoints and exits).
    env[PARENT_PID_ENV] = str(os.getpid())
    env.pop("NOTIFY_SOCKET", None)  # only the supervisor talks to systemd
    env.pop("WATCHDOG_USEC", None)
    env.pop("WATCHDOG_PID", None)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(log_path, flags, 0o640)
    try:
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env=env,
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
        )
    finally:
        os.close(fd)


class Launcher:
    """Spawns `python -m training.worker ARGV` in its own session, logs to a private file.

    The seam the tick loop places workers through: this one on this host; `raylaunch.
    RayLauncher` on the hosts of a Ray cluster (the hooks below are no-ops here)."""

    backend = "local"

    def __init__(
        self,
        python: str = sys.executable,
        module: str = WORKER_MODULE,
        spare: SpareKeeper | None = None,
    ) -> None:
        self.python = python
        self.module = module
        self.spare = spare  # the pre-warmed spare worker's keeper (this host only)

    def connect(self) -> None:
        """Before the first spawn (several hosts: join the cluster). OSError when it cannot."""

    def configure(self, cfg: Config) -> None:
        """A reload: the configuration now in force (this host's launcher keeps none of it)."""

    def observe(self, now: float) -> list[tuple[str, str | None, dict[str, Any]]]:
        """Once a tick: events about the hosts (several hosts: joined, lost, rebooted)."""
        return []

    def stop_leftovers(self, grace_s: float) -> list[str]:
        """At start-up, workers of a predecessor that this launcher alone can find (several
        hosts: actors on other hosts); this host's are found by pid in the database."""
        return []

    def forget(self, proc: WorkerProcess) -> None:
        """The tick loop is done with `proc` (it exited and was reaped)."""

    def tend_spare(self, want: SpareWant, now: float) -> list[tuple[str, str | None, Any]]:
        """Once a tick: keep (or drop) this host's spare worker as `want` says; its events."""
        return self.spare.tend(want, now) if self.spare is not None else []

    def spare_row(self) -> dict[str, Any] | None:
        """The spare, for `rlsup status` (None: this launcher keeps none)."""
        return self.spare.row() if self.spare is not None else None

    def spawn(
        self,
        argv: list[str],
        log_path: Path,
        now_mono: float,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> WorkerProcess:
        """`python -P -m training.worker ARGV` in `cwd` (its run dir): -P keeps the working
        directory off sys.path, so an operator's own `training/` or `checkpoints/` package
        there can never shadow rlsup's. The ready spare of its device becomes it when there
        is one (`served` "spare"); else a fresh process (`served` "cold"). `env`: variables
        set for this worker alone (its GPU); a spare started before the placement cannot
        take them, so such a worker always starts cold."""
        if (
            self.spare is not None
            and not env
            and (taken := self.spare.take(argv, log_path, cwd, now_mono)) is not None
        ):
            return taken
        cmd = [self.python, "-P", "-m", self.module, *argv]
        popen = start_worker_process(cmd, log_path, cwd, extra_env=env)
        try:
            return self._track(popen, now_mono)
        except BaseException:
            # Never leave a child running that nobody tracks: kill and reap it, then fail.
            with contextlib.suppress(OSError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.kill()
            popen.wait()
            raise

    @staticmethod
    def _track(popen: subprocess.Popen[bytes], now_mono: float) -> WorkerProcess:
        pidfd = os.pidfd_open(popen.pid)
        try:
            create_time = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            create_time = 0.0
        return WorkerProcess(popen, pidfd, create_time, now_mono, start_ticks(popen.pid))

    def terminate(self, proc: WorkerProcess) -> None:
        """Ask to checkpoint and exit; SIGCONT too, since a stopped process cannot act on it."""
        self._signal(proc.pid, signal.SIGTERM)
        self._signal(proc.pid, signal.SIGCONT)

    def close(self) -> None:
        """At the supervisor's exit: no spare outlives it."""
        if self.spare is not None:
            self.spare.close()

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


LOG_ROTATE_BYTES = 64 << 20


def rotate_log(path: Path, limit: int = LOG_ROTATE_BYTES) -> None:
    """Keep one previous worker log (`.1`) once the current one passes `limit` bytes."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > limit:
            os.replace(path, path.with_name(path.name + ".1"))


def find_leftover(
    pid: int | None, ticks: int | None, create_time: float | None = None
) -> psutil.Process | None:
    """The process `pid` if it is still the worker we started (same start, a worker)."""
    if not pid or (ticks is None and not create_time):
        return None
    if not same_process(pid, ticks, create_time):
        return None
    try:
        proc = psutil.Process(pid)
        if WORKER_MODULE not in process_argv(proc.cmdline()):
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
