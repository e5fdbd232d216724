"""Alert hooks: `[[hooks]]` programs run on the events they name, off the tick loop.

Each matching event runs the hook's argv (no shell) with the event as one JSON object on stdin
(`{"ts", "kind", "game", "detail", "host"}`, the `rlsup events --json` item plus the host name)
and `RLSUP_EVENT_KIND` / `RLSUP_GAME` in its environment. A hook runs in its own session and is
killed (its whole process group) past its `timeout_s`. Its output goes to the supervisor's log,
truncated. Hooks run on a small thread pool, so a slow or hung hook never blocks the tick; what
they did comes back through `drain()`, which the tick turns into `hook_failed` events (a failing
hook is reported, never retried: an alert sent twice is worse than one reported lost).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog

from supervisor.config import HookSpec

log = structlog.get_logger("rlsup.supervisor")

MAX_WORKERS = 4  # hooks running at once
MAX_PENDING = 256  # hook runs queued beyond that are dropped (and reported)
OUTPUT_LOGGED = 4096  # bytes of a hook's output kept for the log
# Events about hooks never fire hooks: a hook on "*" or "hook_failed" cannot loop.
SILENT_KINDS = frozenset({"hook_failed"})


@dataclass(frozen=True)
class HookResult:
    hook: int  # index of its [[hooks]] table
    kind: str
    game: str | None
    returncode: int | None  # None: it could not be started or was killed at its timeout
    error: str  # "" when it exited 0
    seconds: float

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
    def __init__(self, hooks: tuple[HookSpec, ...], env: dict[str, str] | None = None) -> None:
        self.hooks = hooks
        self.env = dict(os.environ if env is None else env)
        self.host = socket.gethostname()
        self._pool = ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="rlsup-hook")
        self._lock = threading.Lock()
        self._results: list[HookResult] = []
        self._pending = 0
        self._dropped = 0
        self._closed = False

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
                if self._pending >= MAX_PENDING:
                    self._dropped += 1
                    continue
                self._pending += 1
            self._pool.submit(self._run, i, spec, kind, game, payload)

    def drain(self) -> tuple[list[HookResult], int]:
        """The hook runs finished since the last call, and how many were dropped (queue full)."""
        with self._lock:
            out, self._results = self._results, []
            dropped, self._dropped = self._dropped, 0
        return out, dropped

    def close(self, wait_s: float) -> None:
        """No new runs; give those under way up to `wait_s` (each still bounded by its
        timeout), then leave them to their timeouts in daemon threads."""
        self._closed = True
        done = threading.Event()

        def waiter() -> None:
            self._pool.shutdown(wait=True, cancel_futures=False)
            done.set()

        threading.Thread(target=waiter, daemon=True, name="rlsup-hook-close").start()
        done.wait(wait_s)

    # ---- one run (a pool thread) -------------------------------------------------------------

    def _run(
        self, index: int, spec: HookSpec, kind: str, game: str | None, payload: dict[str, Any]
    ) -> None:
        try:
            result = self._run_one(index, spec, kind, game, payload)
        except Exception as exc:  # a bug here must still be reported, never lost in a future
            log.exception("hook_failed", hook=index, on=kind, game=game)
            result = HookResult(index, kind, game, None, f"internal error: {exc!r}", 0.0)
        with self._lock:
            self._pending -= 1
            self._results.append(result)

    def _run_one(
        self, index: int, spec: HookSpec, kind: str, game: str | None, payload: dict[str, Any]
    ) -> HookResult:
        t0 = time.monotonic()
        rc: int | None = None
        error = ""
        output = b""
        try:
            data = json.dumps(payload, default=str).encode() + b"\n"
            env = {**self.env, "RLSUP_EVENT_KIND": kind, "RLSUP_GAME": game or ""}
            with subprocess.Popen(
                list(spec.command),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",
                start_new_session=True,  # its own process group: a timeout kills all of it
                close_fds=True,
            ) as proc:
                try:
                    output, _ = proc.communicate(data, timeout=spec.timeout_s)
                    rc = proc.returncode
                    if rc != 0:
                        error = f"exited with {_describe(rc)}"
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    output, _ = proc.communicate()
                    error = f"killed after its timeout_s of {spec.timeout_s:g} s"
        except OSError as exc:
            error = f"could not run {spec.command[0]}: {exc.strerror or exc}"
        seconds = time.monotonic() - t0
        text = output[-OUTPUT_LOGGED:].decode("utf-8", "replace").strip()
        fields = {"hook": index, "on": kind, "game": game, "seconds": round(seconds, 3)}
        if error:
            log.warning("hook_failed", error=error, output=text, **fields)
        else:
            log.info("hook_ran", output=text, **fields)
        return HookResult(index, kind, game, rc, error, seconds)


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"status {rc}"
