"""Alert hooks: `[[hooks]]` programs run on the events they name, off the tick loop.

Each matching event runs the hook's argv (no shell) with the event as one JSON object on stdin
(`{"ts", "kind", "game", "detail", "host"}`, the `rlsup events --json` item plus the host name)
and `RLSUP_EVENT_KIND` / `RLSUP_GAME` in its environment, which is otherwise an allow-list of
the service's (PATH, HOME, locale, TZ, proxies, CA bundles, plus the hook's `pass_env`): the
mirror's credentials and systemd's sockets are none of an alert program's business.

A run is bounded, whatever the program does. It runs in its own session; its output goes to a
pipe that the run's thread reads as it comes: the last OUTPUT_LOGGED bytes are kept for the
journal line, the first LOG_BYTES_PER_RUN are appended to `<logs_dir>/hooks.log`, the rest is
counted (400 MB of output cost the supervisor nothing). The run ends when the program has
exited and its output is closed, or OUTPUT_GRACE_S after its exit when a process it started
still holds that output, or at `timeout_s`. Then what it left running is killed: its process
group, and every process carrying its run's tag in the environment (RLSUP_HOOK_RUN), which
also finds a descendant that left the group with setsid. Nothing waits on a pipe's EOF.

Each [[hooks]] table has its own lane of RUNS_PER_HOOK threads, so a slow or hung hook delays
only its own later runs (each bounded by its timeout), never another hook: a `fatal` pager is
not queued behind a slow webhook. What the runs did comes back through `drain()`, which the
tick turns into `hook_failed` events (a failing hook is reported, never retried: an alert sent
twice is worse than one reported lost).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from supervisor.config import HookSpec
from supervisor.files import rotate_log

log = structlog.get_logger("rlsup.supervisor")

RUNS_PER_HOOK = 4  # runs of one [[hooks]] table at once (each table has its own lane)
MAX_WORKERS = RUNS_PER_HOOK  # its name in earlier releases
MAX_PENDING = 256  # runs of one hook queued beyond that are dropped (and reported)
OUTPUT_LOGGED = 4096  # bytes of a hook's output kept for the journal line (its tail)
LOG_BYTES_PER_RUN = 8 << 20  # bytes of one run's output appended to hooks.log
OUTPUT_GRACE_S = 0.5  # after the program exits, for the last of its output
HOOKS_LOG = "hooks.log"
RUN_TAG_ENV = "RLSUP_HOOK_RUN"  # a random tag per run: finds its descendants, wherever they are
# Events about hooks never fire hooks: a hook on "*" or "hook_failed" cannot loop.
SILENT_KINDS = frozenset({"hook_failed"})
# What a hook gets of the service's environment (besides its own pass_env and RLSUP_*): how
# to find programs, whose home and language, the proxy and CA bundle a webhook needs, and the
# desktop session's addresses for a notification. No credentials, no systemd sockets.
ENV_ALLOWED = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
        "http_proxy", "https_proxy", "no_proxy", "all_proxy",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
        "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "WAYLAND_DISPLAY",
    }
)  # fmt: skip
ENV_ALLOWED_PREFIXES = ("LC_",)


def hook_environment(service: Mapping[str, str], pass_env: tuple[str, ...] = ()) -> dict[str, str]:
    """The part of the service's environment a hook sees (RLSUP_* fields are added per run)."""
    return {
        k: v
        for k, v in service.items()
        if k in ENV_ALLOWED or k.startswith(ENV_ALLOWED_PREFIXES) or k in pass_env
    }


@dataclass(frozen=True)
class HookResult:
    hook: int  # index of its [[hooks]] table
    kind: str
    game: str | None
    returncode: int | None  # None: it could not be started or was killed at its timeout
    error: str  # "" when it exited 0
    seconds: float
    output: str = ""  # the tail of its output (stdout and stderr), as the journal line has it

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def detail(self, spec: HookSpec) -> dict[str, Any]:
        return {
            "hook": self.hook,
            "command": list(spec.command),
            "event": self.kind,
            "returncode": self.returncode,
            "error": self.error,
            "seconds": round(self.seconds, 3),
        }


class HookRunner:
    def __init__(
        self,
        hooks: tuple[HookSpec, ...],
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.hooks = hooks
        service = dict(os.environ if env is None else env)
        self._envs = [hook_environment(service, spec.pass_env) for spec in hooks]
        self.host = socket.gethostname()
        self.log_path = log_dir / HOOKS_LOG if log_dir is not None else None
        self._lanes = [
            ThreadPoolExecutor(max_workers=RUNS_PER_HOOK, thread_name_prefix=f"rlsup-hook{i}")
            for i in range(len(hooks))
        ]
        self._lock = threading.Lock()
        self._results: list[HookResult] = []
        self._pending = [0] * len(hooks)
        self._dropped = 0
        self._live: dict[str, subprocess.Popen[bytes]] = {}  # run tag -> its program
        self._closed = False
        self._killing = False  # close() gave up on what still runs

    def matches(self, spec: HookSpec, kind: str, game: str | None) -> bool:
        if kind in SILENT_KINDS:
            return False
        if kind not in spec.on and "*" not in spec.on:
            return False
        return not spec.games or game is None or game in spec.games

    def fire(self, kind: str, game: str | None, detail: dict[str, Any], ts: float) -> None:
        """Queue every hook that wants this event; returns at once."""
        if self._closed:
            return
        for i, spec in enumerate(self.hooks):
            if not self.matches(spec, kind, game):
                continue
            payload = {"ts": ts, "kind": kind, "game": game, "detail": detail, "host": self.host}
            with self._lock:
                if self._pending[i] >= MAX_PENDING:
                    self._dropped += 1
                    continue
                self._pending[i] += 1
            self._lanes[i].submit(self._run, i, spec, kind, game, payload)

    def drain(self) -> tuple[list[HookResult], int]:
        """The hook runs finished since the last call, and how many were dropped (queue full)."""
        with self._lock:
            out, self._results = self._results, []
            dropped, self._dropped = self._dropped, 0
        return out, dropped

    def close(self, wait_s: float, *, then_kill: bool = True) -> None:
        """No new runs; give those queued or under way up to `wait_s` (each still bounded by
        its timeout). Then, with `then_kill` (the supervisor stops), drop what is queued and
        kill what still runs, descendants included; without it (a reload) they finish on
        their own, bounded by their timeouts."""
        self._closed = True
        done = threading.Event()

        def waiter() -> None:
            for lane in self._lanes:
                lane.shutdown(wait=True, cancel_futures=False)
            done.set()

        threading.Thread(target=waiter, daemon=True, name="rlsup-hook-close").start()
        done.wait(wait_s)
        if not then_kill or done.is_set():
            return
        for lane in self._lanes:
            lane.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._killing = True
            live = list(self._live.items())
        for tag, proc in live:
            end_run(proc.pid, tag)

    # ---- one run (a thread of its hook's lane) ------------------------------------------------

    def _run(
        self, index: int, spec: HookSpec, kind: str, game: str | None, payload: dict[str, Any]
    ) -> None:
        try:
            result = self._run_one(index, spec, kind, game, payload)
        except Exception as exc:  # a bug here must still be reported, never lost in a future
            log.exception("hook_failed", hook=index, on=kind, game=game)
            result = HookResult(index, kind, game, None, f"internal error: {exc!r}", 0.0)
        with self._lock:
            self._pending[index] -= 1
            self._results.append(result)

    def _run_one(
        self, index: int, spec: HookSpec, kind: str, game: str | None, payload: dict[str, Any]
    ) -> HookResult:
        t0 = time.monotonic()
        tag = secrets.token_hex(8)
        stamp = datetime.now().astimezone().isoformat(timespec="seconds")
        output = HookOutput(self.log_path, f"{stamp} hook {index} {kind}: ")
        rc: int | None = None
        error, left = "", 0
        env = {**self._envs[index], "RLSUP_EVENT_KIND": kind, "RLSUP_GAME": game or ""}
        try:
            proc, out_fd = spawn_hook(spec, payload, {**env, RUN_TAG_ENV: tag})
        except OSError as exc:
            error = f"could not run {spec.program or spec.command[0]}: {exc.strerror or exc}"
        else:
            rc, error, left = self._supervise(proc, out_fd, tag, t0 + spec.timeout_s, output)
            if rc is None and not error:
                error = f"killed after its timeout_s of {spec.timeout_s:g} s"
        seconds = time.monotonic() - t0
        text = output.close()
        fields: dict[str, Any] = {"hook": index, "on": kind, "game": game}
        fields.update(seconds=round(seconds, 3), output_bytes=output.total)
        if left:
            fields["left_running_killed"] = left  # descendants that outlived it
        if output.log_error:
            fields["log_error"] = output.log_error
        if error:
            log.warning("hook_failed", error=error, output=text, **fields)
        else:
            log.info("hook_ran", output=text, **fields)
        return HookResult(index, kind, game, rc, error, seconds, text)

    def _supervise(
        self,
        proc: subprocess.Popen[bytes],
        out_fd: int,
        tag: str,
        deadline: float,
        output: HookOutput,
    ) -> tuple[int | None, str, int]:
        """Read its output until the run ends; kill what is left. (returncode or None at the
        timeout, error, how many processes it left running)."""
        with self._lock:
            self._live[tag] = proc
            killing = self._killing
        try:
            if killing:  # close() gave up while this one was starting
                end_run(proc.pid, tag)
            ended = pump_output(proc, out_fd, deadline, output)
        finally:
            os.close(out_fd)
            left = end_run(proc.pid, tag)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)  # SIGKILLed: at once, unless stuck in the kernel
            with self._lock:
                self._live.pop(tag, None)
                killing = self._killing
        rc = proc.returncode
        if killing and (not ended or (rc is not None and rc < 0)):
            return None, "killed: the supervisor stopped before it finished", left
        if not ended:
            return None, "", left
        if rc is None:
            return None, "did not end after SIGKILL (stuck in the kernel?)", left
        return rc, "" if rc == 0 else f"exited with {_describe(rc)}", left


def spawn_hook(
    spec: HookSpec, payload: dict[str, Any], env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the hook in its own session: the event on stdin (a file, so writing it never
    blocks on a program that does not read it), stdout and stderr on one pipe whose read end
    is returned."""
    argv = [spec.program or spec.command[0], *spec.command[1:]]
    data = json.dumps(payload, default=str).encode() + b"\n"
    with tempfile.TemporaryFile() as stdin:
        stdin.write(data)
        stdin.flush()
        stdin.seek(0)
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=write_fd,
                stderr=write_fd,
                env=env,
                cwd="/",
                start_new_session=True,  # its own process group
                close_fds=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
    return proc, read_fd


def pump_output(
    proc: subprocess.Popen[bytes], out_fd: int, deadline: float, output: HookOutput
) -> bool:
    """Read the hook's output as it comes until the program has exited and the output is
    closed, or OUTPUT_GRACE_S after its exit (a process it started holds the output), or the
    deadline (False: timed out). Never waits on the output's EOF alone."""
    pidfd = _pidfd(proc.pid)
    exited_at: float | None = None
    eof = False
    try:
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and (eof or now >= exited_at + OUTPUT_GRACE_S):
                return True
            if now >= deadline:
                return False
            until = deadline if exited_at is None else min(deadline, exited_at + OUTPUT_GRACE_S)
            watch = [] if eof else [out_fd]
            if pidfd is not None and exited_at is None:
                watch.append(pidfd)
            # Without a pidfd, the program's exit is polled.
            wait = until - now if pidfd is not None else min(until - now, 0.05)
            if not watch:
                time.sleep(wait)  # output closed, only its exit to wait for (no pidfd)
                continue
            poller = select.poll()  # not select(): the supervisor's descriptors may pass 1024
            for fd in watch:
                poller.register(fd, select.POLLIN)
            readable = {fd for fd, _ in poller.poll(max(0.0, wait) * 1000)}
            if out_fd in readable:
                chunk = os.read(out_fd, 1 << 16)
                eof = not chunk
                output.add(chunk)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def end_run(pgid: int, tag: str) -> int:
    """SIGKILL what is left of a hook run: its process group, and every process of ours
    carrying its tag (a descendant that called setsid left the group, not the environment).
    Returns how many tagged processes were found alive."""
    found: set[int] = set()
    for _ in range(3):  # a process may fork while the last round kills its parent
        tagged = [pid for pid in tagged_processes(tag) if pid not in found]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for pid in tagged:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not tagged:
            break
        found.update(tagged)
    return len(found)


def tagged_processes(tag: str) -> list[int]:
    """Processes whose environment holds RLSUP_HOOK_RUN=tag (only ours are readable)."""
    entry = f"{RUN_TAG_ENV}={tag}".encode()
    me = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    out = []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or not ours
            continue
        if entry in environ.split(b"\0"):
            out.append(int(name))
    return out


_LOG_LOCK = threading.Lock()  # one rotation of hooks.log at a time


class HookOutput:
    """One run's output: its tail kept for the journal line, the first LOG_BYTES_PER_RUN
    bytes appended to hooks.log (each line prefixed with the run, as runs may interleave),
    the rest only counted. Memory: OUTPUT_LOGGED bytes, whatever the hook writes."""

    def __init__(self, log_path: Path | None, prefix: str) -> None:
        self.log_path = log_path
        self.total = 0
        self.log_error = ""
        self._tail = bytearray()
        self._prefix = prefix.encode()
        self._fd: int | None = None
        self._logged = 0
        self._line_start = True

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._tail += chunk
        del self._tail[:-OUTPUT_LOGGED]
        room = LOG_BYTES_PER_RUN - self._logged
        if room > 0 and chunk and self.log_path is not None and not self.log_error:
            self._log(chunk[:room])

    def close(self) -> str:
        """Finish its lines in the log; the tail, as text."""
        if self._fd is not None:
            ending = b"" if self._line_start else b"\n"
            if self.total > self._logged:
                more = self.total - self._logged
                ending += self._prefix + f"[{more} more bytes of output not logged]\n".encode()
            with contextlib.suppress(OSError):
                os.write(self._fd, ending)
            os.close(self._fd)
            self._fd = None
        return bytes(self._tail).decode("utf-8", "replace").strip()

    def _log(self, data: bytes) -> None:
        try:
            if self._fd is None:
                self._fd = self._open()
            self._logged += len(data)
            os.write(self._fd, self._prefixed(data))
        except OSError as exc:
            self.log_error = f"cannot write {self.log_path}: {exc.strerror or exc}"

    def _open(self) -> int:
        assert self.log_path is not None
        self.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        with _LOG_LOCK:
            rotate_log(self.log_path)  # one previous log (.1) past 64 MiB
            return os.open(self.log_path, flags, 0o600)

    def _prefixed(self, data: bytes) -> bytes:
        text = data.replace(b"\n", b"\n" + self._prefix)
        if self._line_start:
            text = self._prefix + text
        self._line_start = text.endswith(b"\n" + self._prefix)
        return text[: -len(self._prefix)] if self._line_start else text


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # an old kernel, or already reaped
        return None


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"status {rc}"
