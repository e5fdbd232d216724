"""The supervisor's database writes when the database fails: a real SQLite file held locked by
another connection (what an operator's `sqlite3` shell does), and the connection's own state
after a failed transaction."""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from supervisor.ledger import db
from supervisor.ledger.journal import Journal
from supervisor.ledger.recorder import Recorder

pytestmark = pytest.mark.e2e


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    c = db.connect(tmp_path, busy_timeout_ms=50)
    yield c
    c.close()


@pytest.fixture
def locker(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A second connection that can hold the write lock, as another process would."""
    c = sqlite3.connect(tmp_path / db.DB_NAME, isolation_level=None, timeout=1)
    yield c
    db.rollback(c)
    c.close()


def kinds(conn: sqlite3.Connection) -> list[str]:
    return [e.kind for e in db.events(conn)]


def test_writes_wait_in_order_while_the_database_is_locked_then_land(
    conn: sqlite3.Connection, locker: sqlite3.Connection
) -> None:
    clock = Clock()
    journal = Journal(conn, clock=clock, wall=lambda: 1000.0)
    Recorder(conn, journal, wall=lambda: 1000.0, steady=clock)  # records the outage's event
    locker.execute("BEGIN EXCLUSIVE")
    with structlog.testing.capture_logs() as logs:
        for kind in ("worker_start", "worker_exit", "worker_crash"):
            journal.write(lambda c, k=kind: db._add_event(c, k, "g", {}, 1000.0))
    assert not journal.healthy and journal.pending == 3
    assert [e["event"] for e in logs].count("state_db_unavailable") == 1, "logged once"
    locker.execute("COMMIT")
    clock.t += 60  # past the backoff
    assert journal.flush()
    assert kinds(conn) == ["worker_start", "worker_exit", "worker_crash", "state_db_unavailable"]
    outage = db.events(conn, kind="state_db_unavailable")[0].detail
    assert outage["writes_waited"] == 3 and outage["seconds"] == 60.0
    assert "locked" in outage["error"]


def test_keyed_writes_keep_only_the_newest_and_events_are_bounded(
    conn: sqlite3.Connection, locker: sqlite3.Connection
) -> None:
    clock = Clock()
    journal = Journal(conn, clock=clock, max_pending=5)
    Recorder(conn, journal, wall=clock, steady=clock)
    locker.execute("BEGIN EXCLUSIVE")
    for state in ("starting", "running", "stopping"):
        journal.write(lambda c, s=state: db.upsert_worker(c, "g", state=s), key="worker:g")
    for i in range(10):
        journal.write(lambda c, i=i: db._add_event(c, "restart", "g", {"i": i}, 1.0))
    assert journal.pending == 5  # one row + the 4 newest events
    locker.execute("COMMIT")
    clock.t += 60
    assert journal.flush()
    assert db.worker(conn, "g")["state"] == "stopping"  # type: ignore[index]
    assert [e.detail["i"] for e in db.events(conn, kind="restart")] == [6, 7, 8, 9]
    outage = db.events(conn, kind="state_db_unavailable")[0].detail
    assert outage["events_dropped"] == 6


def test_retries_back_off_with_jitter_and_are_bounded(
    conn: sqlite3.Connection, locker: sqlite3.Connection
) -> None:
    clock = Clock()
    journal = Journal(conn, clock=clock, backoff_base_s=1, backoff_max_s=8)
    locker.execute("BEGIN EXCLUSIVE")
    journal.write(lambda c: db._add_event(c, "restart", "g", {}, 1.0))
    attempts = []
    for _ in range(400):  # 40 s of ticks at 0.1 s
        clock.t += 0.1
        before = journal.outage.attempts if journal.outage else 0
        journal.flush()
        if journal.outage and journal.outage.attempts > before:
            attempts.append(clock.t)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert all(0.4 <= g <= 8.2 for g in gaps), gaps  # jittered, capped at backoff_max_s
    assert max(gaps) > 3, "it backs off"
    assert len(attempts) < 20, "not once a tick"


def test_a_bad_operation_is_dropped_not_blocking_the_rest(conn: sqlite3.Connection) -> None:
    journal = Journal(conn)

    def buggy(c: sqlite3.Connection) -> None:
        db._add_event(c, "restart", "g", {}, 1.0)
        raise ValueError("a bug in one write")

    with structlog.testing.capture_logs() as logs:
        journal.write(buggy)
    journal.write(lambda c: db._add_event(c, "restart", "g", {}, 2.0))
    assert journal.healthy
    assert [e.ts for e in db.events(conn, kind="restart")] == [2.0]
    assert any(e["event"] == "state_db_write_dropped" for e in logs)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
def test_transaction_leaves_the_connection_usable_after_a_full_disk(tmp_path: Path) -> None:
    """SQLITE_FULL inside a transaction: rolled back (whether or not SQLite already did), the
    error surfaces as itself, and the connection takes writes again once space returns."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs")
    try:
        conn = db.connect(disk)
        db._add_event(conn, "restart", "g", {}, 1.0)
        ballast = disk / "ballast"
        with contextlib.suppress(OSError), open(ballast, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        with pytest.raises(sqlite3.OperationalError, match="full"), db.transaction(conn):
            db._add_event(conn, "restart", "g", {"blob": "x" * 200_000}, 2.0)
        assert not conn.in_transaction
        ballast.unlink()
        with db.transaction(conn):
            db._add_event(conn, "restart", "g", {}, 3.0)
        assert [e.ts for e in db.events(conn)] == [1.0, 3.0]
        conn.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
