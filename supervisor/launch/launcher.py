"""The one seam that spawns and signals processes (fakeable in unit tests): `LauncherSeam`, what
the daemon may ask of any launcher, and `Launcher`, this host's. The Ray backend and the warm
spare sit behind the same seam; nothing above it asks which one runs a worker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil  # type: ignore[import-untyped]

from supervisor.files import LOG_ROTATE_BYTES, rotate_live_log
from supervisor.launch import sessions
from supervisor.launch.process import start_ticks
from supervisor.launch.spawn import (
    WORKER_MODULE,
    StillDraining,
    WorkerProcess,
    start_worker_process,
)

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


# How often the live workers' log sizes are looked at (a stat each): at 50 MB/s of output
# (a script printing every step) a log passes its limit by at most this many seconds of it.
LOG_CHECK_S = 0.5


class Launcher:
    """Spawns `python -m training.worker ARGV` in its own session, logs to a private file.

    The seam the tick loop places workers through: this one on this host; on the hosts of a
    Ray cluster `ray.RayLauncher`, which answers the same `LauncherSeam` without being one of
    these (the hooks below are no-ops here)."""

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
        stop_grace_s: float = 60.0,
        log_limit_bytes: int = LOG_ROTATE_BYTES,
        log_check_s: float = LOG_CHECK_S,
    ) -> None:
        self.python = python
        self.module = module
        self.spare = spare  # the pre-warmed spare worker's keeper (this host only)
        self.stop_grace_s = stop_grace_s
        # Workers asked to stop (SIGTERM to their group): pid -> when their grace ends.
        self._asked: dict[int, float] = {}
        self._logs: dict[int, Path] = {}  # live workers' logs, by pid
        self.log_limit_bytes, self.log_check_s = log_limit_bytes, log_check_s
        self._logs_checked = 0.0  # monotonic
        # Sessions whose leader exited after a stop request while others in them still finish
        # (a wrapper gone, its child checkpointing): sid -> (grace end, its log).
        self._draining: dict[int, tuple[float, Path | None]] = {}

    def connect(self) -> None:
        """Before the first spawn (several hosts: join the cluster). OSError when it cannot."""

    def configure(self, cfg: Config) -> None:
        """A reload: the configuration now in force (its stop grace, for a worker's remains)."""
        self.stop_grace_s = cfg.stop_grace_s

    def observe(self, now: float) -> list[tuple[str, str | None, dict[str, Any]]]:
        """Once a tick: events about the hosts (several hosts: joined, lost, rebooted); here,
        the remains of stopped workers past their grace are killed and the live workers'
        logs kept within their limit."""
        mono = time.monotonic()
        self._reap_draining(mono)
        if mono - self._logs_checked >= self.log_check_s:
            self._logs_checked = mono
            for path in set(self._logs.values()):
                rotate_live_log(path, self.log_limit_bytes)
        return []

    def stop_leftovers(self, grace_s: float) -> list[str]:
        """At start-up, workers of a predecessor that this launcher alone can find (several
        hosts: actors on other hosts); this host's are found by pid in the database."""
        return []

    def forget(self, proc: WorkerProcess) -> None:
        """The tick loop is done with `proc` (it exited and was reaped): nothing of its session
        may outlive it. What remains is killed at once, unless it was asked to stop: then the
        rest of its group had the SIGTERM too and may finish (a wrapper that died at once, its
        child writing the final checkpoint) until the grace ends."""
        log_path = self._logs.pop(proc.pid, None)
        grace_end = self._asked.pop(proc.pid, None)
        sid = proc.pid
        if not sessions.is_ours(sid, proc.start_ticks) or not sessions.members(sid):
            return
        if grace_end is not None and time.monotonic() < grace_end:
            self._draining[sid] = (grace_end, log_path)
            return
        sessions.kill_session(sid)

    def _reap_draining(self, now: float, log_path: Path | None = None) -> None:
        """Kill the draining sessions past their grace. `log_path`: the game that starts its
        next worker now waits (StillDraining) while its last one's remains finish their stop
        within the grace, rather than lose their final checkpoint: never two writers of one
        run, and nothing killed that was saving."""
        for sid, (grace_end, log) in list(self._draining.items()):
            if not sessions.members(sid):
                del self._draining[sid]
            elif now >= grace_end:
                sessions.kill_session(sid)
                del self._draining[sid]
            elif log_path is not None and log == log_path:
                raise StillDraining(
                    f"its last worker's remains (session {sid}) are still finishing their "
                    f"stop: waiting for them, at most {grace_end - now:.0f} s more"
                )

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
        self._reap_draining(time.monotonic(), log_path)
        if (
            self.spare is not None
            and not env
            and not command
            and (taken := self.spare.take(argv, log_path, cwd, now_mono)) is not None
        ):
            self._logs[taken.pid] = log_path
            return taken
        cmd = list(argv) if command else [self.python, "-P", "-m", self.module, *argv]
        popen = start_worker_process(cmd, log_path, cwd, extra_env=env)
        try:
            proc = self._track(popen, now_mono)
            self._logs[proc.pid] = log_path
            return proc
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
        """Ask to checkpoint and exit: its whole process group, so that a wrapper's children
        (`sh -c`, `uv run`) checkpoint too; SIGCONT too, since a stopped process cannot act
        on it."""
        self._asked.setdefault(proc.pid, time.monotonic() + self.stop_grace_s)
        sessions.signal_group(proc.pid, signal.SIGTERM)
        sessions.signal_group(proc.pid, signal.SIGCONT)

    def close(self) -> None:
        """At the supervisor's exit: no spare outlives it, nor a stopped worker's remains
        (given what is left of their grace)."""
        if self.spare is not None:
            self.spare.close()
        if self._draining:
            last = max(end for end, _ in self._draining.values())
            sessions.wait_empty(self._draining, max(0.0, last - time.monotonic()))
            self._reap_draining(float("inf"))

    def kill(self, proc: WorkerProcess) -> None:
        # The worker leads its own process group and session: take anything it spawned with it
        # (what left the group, a shell's job with its own, is still in the session).
        sessions.signal_group(proc.pid, signal.SIGKILL)
        if sessions.is_ours(proc.pid, proc.start_ticks):
            sessions.signal_members(proc.pid, signal.SIGKILL)
