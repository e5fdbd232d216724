"""`<run_dir>/checkpoint.request` as the training loop sees it: a cheap "checkpoint now" flag.

The supervisor writes the file on a preemption notice (an operator may just `touch` it); the
learners ask `interrupt()` between two minibatches and between two env steps, so a request is
served within about one minibatch instead of at the end of an iteration that can take minutes.
`interrupt()` costs a monotonic clock read; the file is stat()ed at most every `poll_every_s`
(and read only when its mtime changes).

A request made at time t (the file's mtime) is satisfied by any checkpoint whose state was
captured at or after t, periodic or forced: one commit per request, however long the file
stays. A newer mtime is a new request. A forced checkpoint that failed (a full disk) is tried
again `RETRY_FAILED_S` later, not at every minibatch.

A stop (SIGTERM) also cuts the iteration short when a preemption deadline is known (the
request's, or RLSUP_PREEMPTION_DEADLINE): the machine is going, so the worker checkpoints what
it has and exits 75 rather than finish the iteration. Without a deadline a stop still waits for
the iteration's end, as it always did (nothing of it is thrown away).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from training.protocol import (
    CHECKPOINT_REQUEST_FILE,
    PREEMPTION_DEADLINE_ENV,
    CheckpointRequest,
    read_checkpoint_request,
    unix_time,
)

POLL_EVERY_S = 0.05
RETRY_FAILED_S = 10.0


class CheckpointRequestWatch:
    """The standing request, if any, and whether the training loop owes it a checkpoint.

    `stop`: truthy once the worker was asked to stop. `satisfied_at`: when the state of the
    newest committed checkpoint was captured (Unix seconds; None without one). `on_report`:
    called with the heartbeat's `checkpoint_request` entry when a request is first seen and
    when it is served.
    """

    def __init__(
        self,
        run_dir: Path,
        stop: Any,
        satisfied_at: float | None,
        on_report: Callable[[dict[str, Any]], None],
        *,
        poll_every_s: float = POLL_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.path = run_dir / CHECKPOINT_REQUEST_FILE
        self.run_dir = run_dir
        self.stop = stop
        self.satisfied_at = -math.inf if satisfied_at is None else satisfied_at
        self.on_report = on_report
        self.poll_every_s = poll_every_s
        self.clock = clock
        env = os.environ if environ is None else environ
        self.env_deadline = unix_time(env.get(PREEMPTION_DEADLINE_ENV))
        self.standing: CheckpointRequest | None = None  # the file as last read
        self.pending: CheckpointRequest | None = None  # standing and not yet satisfied
        self.report: dict[str, Any] | None = None
        self._next_poll = -math.inf
        self._retry_at = -math.inf
        self._served_last: tuple[float, int, float] | None = None  # captured, step, committed
        self._lock = threading.Lock()

    @property
    def deadline(self) -> float | None:
        """When the machine may be taken (Unix seconds), if a notice says so."""
        standing = self.standing
        if standing is not None and standing.deadline is not None:
            return standing.deadline
        return self.env_deadline

    def interrupt(self) -> bool:
        """Should the iteration in progress stop here? A request is owed a checkpoint, or a
        stop came with a preemption deadline. Cheap enough to ask every env step."""
        now = self.refresh()
        return self.due(now) or (bool(self.stop) and self.deadline is not None)

    def refresh(self) -> float:
        """poll() unless it ran within `poll_every_s`; returns the clock's reading."""
        now = self.clock()
        if now >= self._next_poll:
            self._next_poll = now + self.poll_every_s
            self.poll()
        return now

    def due(self, now: float | None = None) -> bool:
        """A request is owed a checkpoint now (not while a failed one waits to be retried)."""
        if self.pending is None:
            return False
        return (self.clock() if now is None else now) >= self._retry_at

    def poll(self) -> None:
        """Look at the file (one stat; read only when its mtime changed)."""
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            mtime = None
        seen: dict[str, Any] | None = None
        with self._lock:
            if mtime is None:
                self.standing = self.pending = None  # withdrawn
                return
            fresh = self.standing is None or self.standing.mtime != mtime
            if fresh:
                self.standing = read_checkpoint_request(self.run_dir) or CheckpointRequest(mtime)
            request = self.standing
            assert request is not None
            if request.mtime <= self.satisfied_at:
                self.pending = None
                last = self._served_last
                if fresh and last is not None and last[0] >= request.mtime:
                    # Made just before the state of a checkpoint of this process was
                    # captured, first looked at once that checkpoint committed: it serves
                    # the request, and the heartbeat says so as for a forced one.
                    seen = self.report = {
                        "requested": request.mtime,
                        "seen": round(time.time(), 3),
                        **request.details(),
                        "cut": None,
                        "committed": round(last[2], 3),
                        "committed_step": last[1],
                        "latency_s": round(max(0.0, last[2] - request.mtime), 3),
                    }
            elif self.pending is None or self.pending.mtime != request.mtime:
                self.pending = request
                self._retry_at = -math.inf
                self.report = seen = {
                    "requested": request.mtime,
                    "seen": round(time.time(), 3),
                    **request.details(),
                    "cut": None,
                    "committed": None,
                    "committed_step": None,
                    "latency_s": None,
                }
        if seen is not None:
            self.on_report(dict(seen))

    def note_cut(self, cut: str | None) -> None:
        """What the iteration that the pending request interrupted gave up (the report's)."""
        with self._lock:
            if self.pending is not None and self.report is not None:
                self.report["cut"] = cut

    def committed(self, captured_at: float, step: int) -> None:
        """A checkpoint captured at `captured_at` committed (from any thread): it satisfies
        the pending request if it was captured after the request was made."""
        served: dict[str, Any] | None = None
        with self._lock:
            if captured_at >= self.satisfied_at:
                self._served_last = (captured_at, int(step), time.time())
            self.satisfied_at = max(self.satisfied_at, captured_at)
            request = self.pending
            if request is not None and captured_at >= request.mtime and self.report is not None:
                self.pending = None
                now = time.time()
                self.report.update(
                    committed=round(now, 3),
                    committed_step=int(step),
                    latency_s=round(now - request.mtime, 3),
                )
                served = dict(self.report)
        if served is not None:
            self.on_report(served)

    def failed(self) -> None:
        """A forced checkpoint failed: try again in RETRY_FAILED_S, training meanwhile."""
        self._retry_at = self.clock() + RETRY_FAILED_S
