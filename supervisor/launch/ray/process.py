"""Several hosts: a worker on another host as the tick loop sees it, and the thread that hears
its exit as it happens.

`RayWorkerProcess` is the seam's `WorkerProcess` for a worker that runs inside an actor on a
joined host: each `poll()` relays the worker's heartbeat.json and error.json into the
supervisor's run dir (liveness, reports and errors are read as on one host), and turns a dead
actor, or a host unreachable for `host_lost_after_s`, into HOST_LOST_RC. `ExitWatch` keeps a
pending `wait_exit()` call on every placed worker's actor, so that an exit wakes the tick.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from supervisor.launch.process import HOST_LOST_RC
from supervisor.launch.ray.cluster import kill_actor
from supervisor.launch.spawn import WorkerProcess
from training import protocol

log = structlog.get_logger("rlsup.ray")

EXIT_WAIT_S = 30.0  # how long one `wait_exit()` call waits on its host before it is renewed
NOTICE_WAIT_S = 2.0  # a notified exit: the tick waits this long for the actor's status


@dataclasses.dataclass(eq=False)
class RayWorkerProcess(WorkerProcess):
    """A worker on another host, seen through its actor. `pid` is its pid on that host;
    `pidfd` a pipe that turns readable when the launcher's exit watch hears that the worker
    exited or its actor died (`notify`): the tick wakes as for a local pidfd and asks at once.
    Without that notice it is polled once a tick."""

    game: str = ""
    host: str = ""
    same_clock: bool = False  # another host's monotonic clock
    node_id: str = ""
    epoch: int = 0
    actor: Any = None
    view_dir: Path = Path()  # the supervisor's run dir of the game: relayed files land here
    # A command game's log on this host: its last words are appended here once it exited
    # (why it died is read from its log: spawn.worker_error).
    view_log: Path | None = None
    _tail_relayed: bool = False
    _eval_relayed: bytes | None = None  # eval.json as last relayed: written again on a change
    lost_after_s: float = 30.0
    remote_pid: int = 0
    returncode: int | None = None
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    _ref: Any = None
    _ok_at: float = 0.0
    _killed: bool = False
    stopping: bool = False  # asked to stop: its exit is reported once its final upload is done
    # It exited by itself and is restarted at once: its actor still mirrors its final
    # checkpoint (the launcher's `draining`).
    draining: bool = False
    _write_fd: int = -1
    on_report: Any = None  # (proc, status) -> None: the launcher's mirror bookkeeping

    @property
    def pid(self) -> int:
        return self.remote_pid

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        now = time.monotonic()
        if self._ref is None:
            self._ref = self.actor.status.remote()
        # Told it exited (or its actor died): wait for the answer now, not a tick later.
        ready, _ = ray.wait([self._ref], timeout=NOTICE_WAIT_S if self._noticed() else 0)
        if not ready:
            return self._unreachable(now)
        ref, self._ref = self._ref, None
        try:
            st = ray.get(ref, timeout=5)
        except (ActorUnavailableError, GetTimeoutError):
            return self._unreachable(now)
        except RayActorError as exc:
            # Dead: its host died or was removed (or we killed it after a kill_at).
            self._exit(-signal.SIGKILL if self._killed else HOST_LOST_RC, str(exc))
            return self.returncode
        self._ok_at = now
        self.report = st
        if self.on_report is not None:
            self.on_report(self, st)
        self._relay(protocol.HEARTBEAT_FILE, st.get("heartbeat"), host=self.host)
        self._relay(protocol.ERROR_FILE, st.get("error"))
        if (evaluated := st.get("eval")) is not None and evaluated != self._eval_relayed:
            self._eval_relayed = evaluated
            self._relay(protocol.EVAL_FILE, evaluated)
        self._relay_tail(st.get("log_tail"))
        if st.get("rc") is not None:
            self._exit(int(st["rc"]), None)
        elif st.get("exited") is not None and not (self.stopping or self._killed):
            # It exited by itself: the game restarts now, on this host mostly, where the
            # checkpoint it committed last lies; its actor mirrors that one behind it.
            self.returncode, self.draining = int(st["exited"]), True
        return self.returncode

    def notify(self) -> None:
        """The exit watch's notice (from its thread): the pipe turns readable."""
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"x")

    def _noticed(self) -> bool:
        """Drain the notice pipe; True when it held one."""
        try:
            return bool(os.read(self.pidfd, 64))
        except (BlockingIOError, OSError):
            return False

    def _unreachable(self, now: float) -> int | None:
        if now - self._ok_at < self.lost_after_s:
            return None
        log.warning("host_unreachable", game=self.game, host=self.host, after_s=self.lost_after_s)
        self._exit(HOST_LOST_RC, f"unreachable for {self.lost_after_s:g} s")
        return self.returncode

    def _exit(self, rc: int, why: str | None) -> None:
        self.returncode = rc
        if why:
            self.report = {**self.report, "lost": why}
        kill_actor(self.actor)  # done with it (or gone): free its name

    def _relay(self, name: str, data: bytes | None, host: str | None = None) -> None:
        if data is None:
            return
        if host is not None:
            with contextlib.suppress(ValueError, TypeError):
                hb = json.loads(data)
                if isinstance(hb, dict):
                    data = json.dumps({**hb, "host": host}).encode()
        path = self.view_dir / name
        tmp = path.with_name(f".{name}.relay")
        with contextlib.suppress(OSError):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, path)

    def _relay_tail(self, tail: str | None) -> None:
        if not tail or self._tail_relayed or self.view_log is None:
            return
        self._tail_relayed = True
        head = f"---- the last lines of its log on host {self.host} ----\n"
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        with contextlib.suppress(OSError):
            fd = os.open(self.view_log, flags, 0o640)
            try:
                os.write(fd, (head + tail).encode("utf-8", "replace"))
            finally:
                os.close(fd)

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = time.monotonic() + (timeout if timeout is not None else 60.0)
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.returncode

    def placement(self) -> dict[str, Any]:
        return {"host": self.host, "epoch": self.epoch}

    def close(self) -> None:
        super().close()
        if self._write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._write_fd)
            self._write_fd = -1


class ExitWatch:
    """One thread that holds a pending `wait_exit()` call on every placed worker's actor and
    notifies the worker's process object when one returns (the worker exited) or fails (the
    actor died: its host, mostly). The tick then wakes on that worker's pipe and asks at once:
    an exit costs no tick's wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Any, RayWorkerProcess] = {}  # wait_exit ref -> its process
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, proc: RayWorkerProcess) -> None:
        with contextlib.suppress(Exception):  # no watch: it is polled once a tick
            ref = proc.actor.wait_exit.remote(EXIT_WAIT_S, True)
            with self._lock:
                self._pending[ref] = proc
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="rlsup-exits", daemon=True
                    )
                    self._thread.start()

    def unwatch(self, proc: RayWorkerProcess) -> None:
        with self._lock:
            for ref in [r for r, p in self._pending.items() if p is proc]:
                del self._pending[ref]

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            self._pending.clear()

    def _run(self) -> None:
        import ray

        while not self._closing.is_set():
            with self._lock:
                refs = list(self._pending)
            if not refs:
                self._closing.wait(0.2)
                continue
            try:
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.25)
            except Exception:  # the cluster unreachable: the ticks' polls tell
                self._closing.wait(1.0)
                continue
            for ref in ready:
                with self._lock:
                    proc = self._pending.pop(ref, None)
                if proc is None:
                    continue
                try:
                    rc = ray.get(ref, timeout=1)
                except Exception:
                    rc = -1  # the actor died: its poll says how
                if rc is None and proc.returncode is None:  # not yet: wait again
                    self.watch(proc)
                else:
                    proc.notify()
