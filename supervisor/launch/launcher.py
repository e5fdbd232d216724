"""The one seam that spawns and signals processes (fakeable in unit tests): `LauncherSeam`, what
the daemon may ask of any launcher, and `Launcher`, this host's. The Ray backend and the warm
spare sit behind the same seam; nothing above it asks which one runs a worker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil  # type: ignore[import-untyped]

from supervisor.launch.process import start_ticks
from supervisor.launch.spawn import WORKER_MODULE, WorkerProcess, start_worker_process

if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.launch.spare import SpareKeeper, SpareWant


class LauncherSeam(Protocol):
    """What the daemon asks of a launcher (this host's, or a Ray cluster's)."""

    backend: str
    local: bool

    def connect(self) -> None: ...
    def configure(self, cfg: Config) -> None: ...
    def observe(self, now: float) -> list[tuple[str, str | None, dict[str, Any]]]: ...
    def stop_leftovers(self, grace_s: float) -> list[str]: ...
    def spawn(
        self,
        argv: list[str],
        log_path: Path,
        now_mono: float,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        command: bool = False,
    ) -> WorkerProcess: ...
    def terminate(self, proc: WorkerProcess) -> None: ...
    def kill(self, proc: WorkerProcess) -> None: ...
    def forget(self, proc: WorkerProcess) -> None: ...
    def tend_spare(self, want: SpareWant, now: float) -> list[tuple[str, str | None, Any]]: ...
    def spare_row(self) -> dict[str, Any] | None: ...
    def close(self) -> None: ...


class Launcher:
    """Spawns `python -m training.worker ARGV` in its own session, logs to a private file.

    The seam the tick loop places workers through: this one on this host; `raylaunch.
    RayLauncher` on the hosts of a Ray cluster (the hooks below are no-ops here)."""

    backend = "local"
    # The workers run on this host: its driver, its GPUs, its torch, its disk. What depends
    # on that (GPU placement, the CPU-fallback check, the uploader process) asks this, never
    # the backend's name.
    local = True

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
        command: bool = False,
    ) -> WorkerProcess:
        """`python -P -m training.worker ARGV` in `cwd` (its run dir), or with `command` (a
        command game) ARGV itself, always cold: -P keeps the working
        directory off sys.path, so an operator's own `training/` or `checkpoints/` package
        there can never shadow rlsup's. The ready spare of its device becomes it when there
        is one (`served` "spare"); else a fresh process (`served` "cold"). `env`: variables
        set for this worker alone (its GPU); a spare started before the placement cannot
        take them, so such a worker always starts cold."""
        if (
            self.spare is not None
            and not env
            and not command
            and (taken := self.spare.take(argv, log_path, cwd, now_mono)) is not None
        ):
            return taken
        cmd = list(argv) if command else [self.python, "-P", "-m", self.module, *argv]
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
