"""The supervisor's writes to its state database: in order, never lost to a failed write, and
never able to wedge or kill the tick loop.

The supervisor's state lives in memory; the database is its journal (and what the CLI reads).
Each write is an operation (a function of the connection) queued and flushed in one
transaction, at once while the database is healthy. When a flush fails (the disk is full, the
database stays locked past the busy timeout, an I/O error) the transaction is rolled back, the
queue is kept in order, and the flush is retried after a capped, jittered backoff. The first
failure and the recovery are logged, and after the recovery one `state_db_unavailable` event
says for how long and how many writes waited: the journal hands its detail to `on_recovered`
(the Recorder, which records it as every other event, hooks included) and writes no event
itself.

An operation with a `key` replaces a queued one with the same key (the latest row of a worker,
the last tick time, the latest sample), so an outage grows the queue by events only; past
`max_pending` the oldest events are dropped and counted, never the newest.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import structlog

from supervisor.ledger import db

log = structlog.get_logger("rlsup.journal")

Op = Callable[[sqlite3.Connection], Any]


@dataclass
class Outage:
    since_mono: float
    since_wall: float
    error: str
    attempts: int = 0
    dropped_events: int = 0
    waited: set[int] = field(default_factory=set)


class Journal:
    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        max_pending: int = 50_000,
        backoff_base_s: float = 0.25,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.conn = conn
        self.clock = clock
        self.wall = wall
        self.rng = rng or random.Random()
        self.max_pending = max_pending
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._ops: OrderedDict[int, tuple[Op, str | None]] = OrderedDict()
        self._keyed: dict[str, int] = {}
        self._ids = count()
        self._retry_at = 0.0
        self.outage: Outage | None = None
        # Told how an outage went once it is over (the Recorder: its state_db_unavailable).
        self.on_recovered: Callable[[dict[str, Any]], None] | None = None

    @property
    def healthy(self) -> bool:
        """Everything written so far is in the database."""
        return not self._ops

    @property
    def pending(self) -> int:
        return len(self._ops)

    def write(self, op: Op, key: str | None = None, *, flush: bool = True) -> None:
        """Queue `op` (replacing a queued op with the same key) and, unless `flush` is False
        (the caller flushes a batch itself), flush if not backing off."""
        op_id = next(self._ids)
        if key is not None:
            old = self._keyed.pop(key, None)
            if old is not None:
                self._ops.pop(old, None)
            self._keyed[key] = op_id
        self._ops[op_id] = (op, key)
        if len(self._ops) > self.max_pending:
            self._drop_oldest_event()
        if self.outage is not None:
            self.outage.waited.add(op_id)
        if flush:
            self.flush()

    def flush(self, *, force: bool = False) -> bool:
        """Try to write everything queued, in order, in one transaction. True when done."""
        if not self._ops:
            return True
        if not force and self.clock() < self._retry_at:
            return False
        try:
            with db.transaction(self.conn):
                for op_id, (op, _) in list(self._ops.items()):
                    self._run(op_id, op)
        except sqlite3.Error as exc:
            self._failed(exc)
            return False
        except _BadOp:
            return self.flush(force=True)  # the bad op is gone: the rest goes through now
        self._ops.clear()
        self._keyed.clear()
        self._recovered()
        return not self._ops  # the outage's own event may have met a new one

    def _run(self, op_id: int, op: Op) -> None:
        try:
            op(self.conn)
        except sqlite3.Error:
            raise
        except Exception as exc:
            # A bug in one operation must not hold every later write hostage.
            log.exception("state_db_write_dropped", error=f"{type(exc).__name__}: {exc}")
            self._forget(op_id)
            raise _BadOp from exc

    def _forget(self, op_id: int) -> None:
        _, key = self._ops.pop(op_id)
        if key is not None and self._keyed.get(key) == op_id:
            del self._keyed[key]

    def _drop_oldest_event(self) -> None:
        for op_id, (_, key) in self._ops.items():
            if key is None:
                self._forget(op_id)
                if self.outage is not None:
                    self.outage.dropped_events += 1
                return

    def _failed(self, exc: sqlite3.Error) -> None:
        now = self.clock()
        if self.outage is None:
            self.outage = Outage(now, self.wall(), f"{type(exc).__name__}: {exc}")
            self.outage.waited.update(self._ops)
            log.error(
                "state_db_unavailable",
                error=self.outage.error,
                pending=len(self._ops),
                action="supervising from memory; writes are kept and retried",
            )
        self.outage.attempts += 1
        raw = min(self.backoff_max_s, self.backoff_base_s * 2.0 ** (self.outage.attempts - 1))
        self._retry_at = now + raw / 2 + raw / 2 * self.rng.random()

    def _recovered(self) -> None:
        outage, self.outage = self.outage, None
        self._retry_at = 0.0
        if outage is None:
            return
        detail = {
            "seconds": round(self.clock() - outage.since_mono, 3),
            "since": outage.since_wall,
            "error": outage.error,
            "attempts": outage.attempts,
            "writes_waited": len(outage.waited),
            "events_dropped": outage.dropped_events,
        }
        log.warning("state_db_recovered", **detail)
        if self.on_recovered is not None:
            # Queued like any write: should the database fail again at once, it waits too.
            self.on_recovered(detail)


class _BadOp(Exception):
    pass
