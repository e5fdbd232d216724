"""What the supervisor tells its state database: events, worker rows, the tick, vitals samples,
the clean stop; and the one thing it reads back each tick, an operator's stop request.

The Recorder is the one funnel for events: every event of every wing (the journal's own
`state_db_unavailable` included) is recorded, logged and handed to the alert hooks here.
Every write goes through the `Journal` (kept in order, retried after an outage, never wedging
the tick). Rows that only the newest copy of matters (a game's worker row, the tick, samples)
are keyed, so an outage queues one of each rather than one per tick.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from supervisor.ledger import db
from supervisor.ledger.journal import Journal, Op

log = structlog.get_logger("rlsup.supervisor")

# How loud each event is on the journal (the rest: info). Operators grep these.
LOG_LEVEL = {
    **dict.fromkeys(("gpu_lost", "config_error", "worker_crash", "worker_oom"), "error"),
    **dict.fromkeys(
        (
            "worker_hang", "device_fallback", "no_host", "checkpoint_corrupt",
            "checkpoint_failed", "checkpoint_sync_fallback", "checkpoint_unreadable",
            "replay_damaged", "write_failed",
            "node_lost", "node_reboot", "hook_failed", "metrics_failed", "mirror_failed",
            "tracking_failed", "tracking_skipped",
            "uploader_exit", "spare_lost", "leftovers_stopped", "scale_down",
        ),
        "warning",
    ),
}  # fmt: skip

SAMPLES_EVERY_S = 60.0
SAMPLES_KEEP_S = 7 * 24 * 3600.0
SAMPLES_MAX_ROWS = 10_080  # a week at one row a minute


LOG_VALUE_MAX = 1000  # characters of one value on the journal (the event keeps it whole)
# Keys the log line itself uses: a detail's own are renamed (a hook's "event", a node's "game").
_LINE_KEYS = frozenset({"event", "game", "level", "timestamp", "logger"})


def log_fields(detail: dict[str, Any]) -> dict[str, Any]:
    """An event's detail as fields of its log line: keys that the line itself uses get a
    `detail_` prefix, and long strings (a hook's output, a traceback) are cut to
    LOG_VALUE_MAX characters with their length: the event in the database keeps them whole."""
    out: dict[str, Any] = {}
    for key, value in detail.items():
        if isinstance(value, str) and len(value) > LOG_VALUE_MAX:
            value = f"{value[:LOG_VALUE_MAX]}... ({len(value)} characters)"
        out[f"detail_{key}" if key in _LINE_KEYS else key] = value
    return out


class Recorder:
    def __init__(
        self,
        conn: sqlite3.Connection,
        journal: Journal,
        *,
        wall: Callable[[], float],
        steady: Callable[[], float],
    ) -> None:
        self.conn, self.journal = conn, journal
        self.wall, self.steady = wall, steady
        self._next_sample = 0.0
        self._last_sample_ts: float | None = None
        # Every event, as recorded (kind, game, detail, ts): the alert hooks'. Must not block.
        self.on_event: Callable[[str, str | None, dict[str, Any], float], None] | None = None
        # The journal's outage ends in an event like any other (its own line is logged).
        journal.on_recovered = lambda detail: self.event(
            "state_db_unavailable", None, detail, log_as=False
        )

    def event(
        self,
        kind: str,
        game: str | None,
        detail: dict[str, Any],
        log_as: dict[str, Any] | bool | None = None,
        *,
        along: Op | None = None,
        mono: float | None = None,
    ) -> None:
        """Record the event (and hand it to the alert hooks), and log it once: with its detail,
        or `log_as` (a shorter line: what and where, not a traceback), or not at all (False:
        its own line is logged already, as a state transition's is). `along`: a write that
        lands in the same transaction (a mode change's row); `mono`: the event's step-free
        time when the step that decided it kept its own (default: now)."""
        ts, mono = self.wall(), self.steady() if mono is None else mono

        def op(c: sqlite3.Connection) -> None:
            if along is not None:
                along(c)
            db._add_event(c, kind, game, detail, ts, mono)

        self.journal.write(op)
        if log_as is not False:
            fields = detail if log_as is None or log_as is True else log_as
            getattr(log, LOG_LEVEL.get(kind, "info"))(kind, game=game, **log_fields(fields))
        if self.on_event is not None:
            self.on_event(kind, game, detail, ts)

    def worker(self, name: str, row: dict[str, Any], *, flush: bool = True) -> None:
        # Keyed: while the database fails, only a game's newest row waits to be written.
        self.journal.write(
            lambda c: db.upsert_worker(c, name, **row), key=f"worker:{name}", flush=flush
        )

    def spare(self, row: dict[str, Any]) -> None:
        # Keyed: only the spare's newest row waits through an outage.
        self.journal.write(lambda c: db.set_spare(c, **row), key="spare")

    def tick(self, rows: Iterable[tuple[str, dict[str, Any]]], boot_id: str) -> None:
        """Every worker's row and the tick, in one transaction (and, after an outage's
        backoff, whatever is still queued before them)."""
        for name, row in rows:
            self.worker(name, row, flush=False)
        now = self.wall()

        def ticked(c: sqlite3.Connection) -> None:
            db.touch_boot(c, boot_id, now)
            db.set_supervisor(c, last_tick=now)

        self.journal.write(ticked, key="tick", flush=False)
        self.journal.flush()

    def sample(self, latest: tuple[float, dict[str, Any]] | None, now: float) -> None:
        """The sampler's latest reading (its time, its JSON) into `samples` about once a
        minute; keep a week."""
        if now < self._next_sample or latest is None or latest[0] == self._last_sample_ts:
            return
        self._next_sample = now + SAMPLES_EVERY_S
        ts, data = latest[0], json.dumps(latest[1], allow_nan=False)
        self._last_sample_ts = ts
        # Keyed: while the database fails, only the newest sample waits (samples are history).
        self.journal.write(
            lambda c: db.insert_sample(c, ts, data, SAMPLES_KEEP_S, SAMPLES_MAX_ROWS),
            key="samples",
        )

    def drop_stale_stop_request(self) -> None:
        """At start, before this supervisor is recorded as running: a stop request still in
        the database was meant for a predecessor that died before reading it. Dropping it
        here orders requests by the database's own commit order (the CLI writes one only for
        a supervisor it found running, i.e. after this), never by wall times, which a clock
        step reorders. Direct, not journaled: it must land before the first tick reads."""
        with db.transaction(self.conn):
            request = db.pending_request(self.conn, db.STOP_REQUEST)
            if request is not None:
                db.clear_request(self.conn, db.STOP_REQUEST)
        if request is not None:
            log.info("stop_request_stale", by=request[0], reason="written before this start")

    def stop_requested(self) -> bool:
        """`rlsup stop` by an operator who may not signal us (the service runs as another
        user) leaves a request in the database; any request there now was written after
        this supervisor started (`drop_stale_stop_request`)."""
        try:
            request = db.pending_request(self.conn, db.STOP_REQUEST)
        except sqlite3.Error:
            return False
        if request is None:
            return False
        self.journal.write(lambda c: db.clear_request(c, db.STOP_REQUEST))
        log.info("stop_requested", by=request[0])
        return True

    def stopped(self, boot_id: str) -> None:
        """A clean stop: the ledger's, the supervisor row's and the event; forced out now
        (the caller's close() tries once more and says what was lost)."""
        now = self.wall()

        def stopped(c: sqlite3.Connection) -> None:
            db.mark_clean_stop(c, boot_id, now)
            db.set_supervisor(c, state="stopped", last_tick=now)

        self.journal.write(stopped)
        self.event("supervisor_stop", None, {"pid": os.getpid(), "clean": True})
        self.journal.flush(force=True)

    def close(self) -> None:
        if not self.journal.flush(force=True):
            log.error(
                "state_db_unflushed",
                pending=self.journal.pending,
                reason="the state database still fails; these writes are lost",
            )
        self.conn.close()
