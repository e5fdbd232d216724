"""The ledger's read side as the commands use it (`rlsup events`' accepted names, `rlsup
report`'s boots and day counts), and the names `supervisor.ledger.db` still hands on."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from supervisor.ledger import db, reads, schema
from supervisor.observe import readonly


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    c = db.connect(tmp_path)
    # Rows written as a supervisor of any age would have: the reads must not care how.
    c.executemany(
        "INSERT INTO events(ts, kind, game) VALUES (?, ?, ?)",
        [
            (100.0, "host_reboot", None),
            (150.0, "worker_crash", "pong"),
            (199.0, "host_reboot", None),
            (200.0, "host_reboot", None),
            (250.0, "a_newer_kind", None),
        ],
    )
    c.execute("INSERT INTO workers(game, state) VALUES ('pong', 'RUNNING')")
    c.executemany(
        "INSERT INTO boots(boot_id, first_seen, last_seen) VALUES (?, ?, ?)",
        [("b2", 300.0, 400.0), ("b1", 10.0, 90.0)],
    )
    return c


def test_known_names_are_the_ledgers(conn: sqlite3.Connection) -> None:
    assert reads.known_games(conn) == {"pong"}
    assert reads.known_event_kinds(conn) == {
        "host_reboot",
        "worker_crash",
        "a_newer_kind",
    }


def test_known_names_of_no_database_or_no_tables_are_none(tmp_path: Path) -> None:
    assert reads.known_games(None) == set() and reads.known_event_kinds(None) == set()
    empty = sqlite3.connect(tmp_path / "empty.db")
    assert reads.known_games(empty) == set() and reads.known_event_kinds(empty) == set()


def test_boot_spans_oldest_first(conn: sqlite3.Connection) -> None:
    assert reads.boot_spans(conn) == [reads.BootSpan(10.0, 90.0), reads.BootSpan(300.0, 400.0)]


def test_count_events_between_is_half_open(conn: sqlite3.Connection) -> None:
    assert reads.count_events_between(conn, "host_reboot", 100.0, 200.0) == 2
    assert reads.count_events_between(conn, "host_reboot", 0.0, 1000.0) == 3
    assert reads.count_events_between(conn, "worker_crash", 151.0, 1000.0) == 0


def test_the_read_only_cli_connection_reads_the_same(tmp_path: Path) -> None:
    c = db.connect(tmp_path)
    c.execute("INSERT INTO events(ts, kind) VALUES (5.0, 'host_reboot')")
    c.close()
    with readonly.open_db_readonly(tmp_path / db.DB_NAME) as ro:
        assert ro is not None
        assert reads.known_event_kinds(ro) == {"host_reboot"}
        assert reads.count_events_between(ro, "host_reboot", 0.0, 10.0) == 1


def test_db_still_hands_on_the_schema_and_the_reads() -> None:
    """Importers that name `db.events`, `db.EVENT_KINDS` (the supervisor, tests, benchmarks)
    keep working after the split into schema.py, reads.py and db.py."""
    assert db.events is reads.events and db.Event is reads.Event
    assert db.mtbf_s is reads.mtbf_s and db.first_boot_seen is reads.first_boot_seen
    assert db.EVENT_KINDS is schema.EVENT_KINDS
    assert db.MIGRATIONS is schema.MIGRATIONS and db.SCHEMA_VERSION == schema.SCHEMA_VERSION
