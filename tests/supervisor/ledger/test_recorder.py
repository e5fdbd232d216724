"""The Recorder is the one funnel: every event it records is logged once, whatever its detail
holds. A hook's `hook_failed` detail carries an `event` key and up to megabytes of output: it
once broke the log call (TypeError: multiple values for 'event') in every tick, which the
soak's hook storm found."""

from __future__ import annotations

import time
from pathlib import Path

import structlog

from supervisor.ledger import db
from supervisor.ledger.journal import Journal
from supervisor.ledger.recorder import LOG_VALUE_MAX, Recorder


def test_an_event_whose_detail_uses_the_log_lines_keys_is_recorded_and_logged(
    tmp_path: Path,
) -> None:
    conn = db.connect(tmp_path, busy_timeout_ms=1000, owner=True)
    try:
        recorder = Recorder(conn, Journal(conn), wall=time.time, steady=time.time)
        output = "x" * (LOG_VALUE_MAX * 10)
        detail = {"event": "worker_crash", "game": "other", "output": output, "hook": 0}
        with structlog.testing.capture_logs() as logs:
            recorder.event("hook_failed", "pong", detail)
        (line,) = [entry for entry in logs if entry["event"] == "hook_failed"]
        assert line["game"] == "pong" and line["log_level"] == "warning"
        assert line["detail_event"] == "worker_crash" and line["detail_game"] == "other"
        assert len(line["output"]) < LOG_VALUE_MAX + 50, "the journal gets the head only"
        (stored,) = db.events(conn, kind="hook_failed")
        assert stored.detail["output"] == output, "the database keeps the detail whole"
        assert stored.detail["event"] == "worker_crash"
    finally:
        conn.close()


def test_log_as_false_records_without_a_second_line(tmp_path: Path) -> None:
    conn = db.connect(tmp_path, busy_timeout_ms=1000, owner=True)
    try:
        recorder = Recorder(conn, Journal(conn), wall=time.time, steady=time.time)
        with structlog.testing.capture_logs() as logs:
            recorder.event("worker_start", "pong", {"pid": 1}, False)
            recorder.event("worker_crash", "pong", {"pid": 1, "tb": "long"}, {"pid": 1})
        assert [(e["event"], e.get("tb")) for e in logs] == [("worker_crash", None)]
        assert [e.kind for e in db.events(conn)] == ["worker_start", "worker_crash"]
    finally:
        conn.close()
