"""The state database `<state_dir>/rlsup.db`: opening it (creating and migrating it) and its
write side (events, boots, samples, worker and spare rows, modes, requests, the supervisor row).

WAL mode, `busy_timeout`, schema version in `PRAGMA user_version`, private files (dir 0700,
files 0600, -wal/-shm included). Only the supervisor writes, except `desired` (CLI `scale`) and
`control` (CLI `stop`). The schema is schema.py's, the queries reads.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoints import manifest
from checkpoints.perms import masked
from supervisor.files import make_private_dir

# The schema and the read side live beside this module; `db.events`, `db.EVENT_KINDS` and
# the rest keep working for the modules, tests and benchmarks that name them so.
# isort: off
from supervisor.ledger.reads import (
    BootSummary as BootSummary,
    Event as Event,
    boot_event as boot_event,
    boot_time_of as boot_time_of,
    boots_summary as boots_summary,
    desired_rows as desired_rows,
    event_counts as event_counts,
    events as events,
    first_boot_seen as first_boot_seen,
    get_desired as get_desired,
    get_mode as get_mode,
    latest_sample as latest_sample,
    mode_rows as mode_rows,
    mtbf_s as mtbf_s,
    pending_request as pending_request,
    spare as spare,
    starts as starts,
    supervisor_record as supervisor_record,
    supervisor_row as supervisor_row,
    worker as worker,
    workers as workers,
)
from supervisor.ledger.schema import (
    EVENT_KINDS as EVENT_KINDS,
    MIGRATIONS as MIGRATIONS,
    SCHEMA_VERSION as SCHEMA_VERSION,
)
# isort: on

DB_NAME = "rlsup.db"
BUSY_TIMEOUT_MS = 10_000
# The supervisor's own connection waits less: its writes are journaled
# (supervisor/ledger/journal.py) and retried, and a tick must not stall behind an operator's
# long write lock.
SUPERVISOR_BUSY_TIMEOUT_MS = 1_000


def db_file_mode() -> int:
    """The database (and its -wal/-shm) is the one file an operator writes (`rlsup scale`,
    `rlsup stop`): group-writable where the state is group-readable, else private."""
    return 0o660 if masked(0o040) else 0o600


def _make_private_file(path: Path) -> None:
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)  # the supervisor's connect(owner=True) opens it to its group


def connect(
    state_dir: Path,
    *,
    create: bool = True,
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    owner: bool = False,
) -> sqlite3.Connection:
    """Open (and create or migrate) the database; FileNotFoundError if absent and not create.

    owner: the supervisor, which sets the files' modes (the CLI never changes them)."""
    path = Path(state_dir) / DB_NAME
    if not path.exists():
        if not create:
            raise FileNotFoundError(f"no state database at {path}")
        make_private_dir(Path(state_dir))
        _make_private_file(path)
    conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    migrate(conn)
    if owner:
        for name in (path.name, path.name + "-wal", path.name + "-shm"):
            with contextlib.suppress(FileNotFoundError, PermissionError):
                os.chmod(path.with_name(name), db_file_mode())
    return conn


def migrate(conn: sqlite3.Connection) -> int:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise RuntimeError(f"database schema {version} is newer than this rlsup ({SCHEMA_VERSION})")
    while version < SCHEMA_VERSION:
        with transaction(conn):
            for stmt in MIGRATIONS[version].split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")
    return version


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE … COMMIT; on any error the transaction is rolled back and the error
    re-raised, and the connection is left outside any transaction whatever happened (SQLite
    may already have rolled back by itself, e.g. after SQLITE_FULL, and a failed COMMIT may
    leave it open): the next transaction on it can always begin."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise


def rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


# ---- events -------------------------------------------------------------------------------


def _add_event(
    conn: sqlite3.Connection,
    kind: str,
    game: str | None = None,
    detail: dict[str, Any] | None = None,
    ts: float | None = None,
    mono: float | None = None,
) -> int:
    """One event. `ts` is the system's wall clock (what operators read); `mono`, when the
    supervisor writes, its step-free clock (what the stability policy measures windows in).
    Private to the ledger: the Recorder is the one caller, so every event reaches the hooks
    (tests build ledgers of their own with it)."""
    cur = conn.execute(
        "INSERT INTO events(ts, kind, game, detail, mono) VALUES (?, ?, ?, ?, ?)",
        (
            time.time() if ts is None else ts,
            kind,
            game,
            json.dumps(detail or {}, default=str),
            mono,
        ),
    )
    return int(cur.lastrowid or 0)


# ---- boots --------------------------------------------------------------------------------

BOOT_ID_ENV = manifest.BOOT_ID_ENV


def read_boot_id() -> str:
    """This boot's identity (never empty); see checkpoints.manifest.read_boot_id."""
    return manifest.read_boot_id()


@dataclass(frozen=True)
class BootOutcome:
    """What this supervisor start means, judged from the ledger.

    kind: 'first' (empty ledger), 'reboot' (new boot id after a clean stop), 'host_reboot'
    (new boot id, previous boot not stopped cleanly: unexpected), 'supervisor_restart' (same
    boot, after a clean stop), 'supervisor_crash' (same boot, no clean stop: leftovers may live);
    the start turns a new boot after a standing preemption notice into 'preempted'.
    """

    kind: str
    boot_id: str
    previous_boot_id: str | None = None
    downtime_s: float | None = None

    @property
    def same_boot(self) -> bool:
        return self.kind in ("supervisor_restart", "supervisor_crash")


def classify_boot(conn: sqlite3.Connection, boot_id: str, now: float) -> BootOutcome:
    """What this supervisor start means, judged from the ledger (reads only)."""
    row = conn.execute("SELECT clean_stop FROM boots WHERE boot_id = ?", (boot_id,)).fetchone()
    if row is not None:
        return BootOutcome(
            "supervisor_restart" if row["clean_stop"] else "supervisor_crash", boot_id
        )
    prev = conn.execute(
        "SELECT boot_id, last_seen, clean_stop FROM boots ORDER BY last_seen DESC LIMIT 1"
    ).fetchone()
    if prev is None:
        return BootOutcome("first", boot_id)
    kind = "reboot" if prev["clean_stop"] else "host_reboot"
    return BootOutcome(kind, boot_id, prev["boot_id"], max(0.0, now - prev["last_seen"]))


def apply_boot(
    conn: sqlite3.Connection, outcome: BootOutcome, now: float, boot_time: float | None
) -> None:
    """Record this start in the ledger (inside the caller's transaction)."""
    if outcome.same_boot:
        conn.execute(
            "UPDATE boots SET clean_stop = 0, last_seen = ? WHERE boot_id = ?",
            (now, outcome.boot_id),
        )
    else:
        conn.execute(
            "INSERT OR IGNORE INTO boots(boot_id, boot_time, first_seen, last_seen, clean_stop) "
            "VALUES (?, ?, ?, ?, 0)",
            (outcome.boot_id, boot_time, now, now),
        )


def record_boot(
    conn: sqlite3.Connection, boot_id: str, now: float, boot_time: float | None = None
) -> BootOutcome:
    """Record this start in the ledger and classify it (reboot / supervisor restart / crash)."""
    with transaction(conn):
        outcome = classify_boot(conn, boot_id, now)
        apply_boot(conn, outcome, now, boot_time)
    return outcome


def touch_boot(conn: sqlite3.Connection, boot_id: str, now: float) -> None:
    conn.execute("UPDATE boots SET last_seen = ? WHERE boot_id = ?", (now, boot_id))


def mark_clean_stop(conn: sqlite3.Connection, boot_id: str, now: float) -> None:
    conn.execute("UPDATE boots SET clean_stop = 1, last_seen = ? WHERE boot_id = ?", (now, boot_id))


# ---- samples (host vitals) ----------------------------------------------------------------


def insert_sample(
    conn: sqlite3.Connection, ts: float, data: str, keep_s: float, max_rows: int
) -> None:
    """One vitals sample (JSON); drop those older than `keep_s` and beyond `max_rows`."""
    conn.execute("INSERT INTO samples(ts, data) VALUES (?, ?)", (ts, data))
    conn.execute("DELETE FROM samples WHERE ts < ?", (ts - keep_s,))
    conn.execute(
        "DELETE FROM samples WHERE rowid NOT IN "
        f"(SELECT rowid FROM samples ORDER BY ts DESC LIMIT {int(max_rows)})"
    )


# ---- workers ------------------------------------------------------------------------------


def _upsert(
    conn: sqlite3.Connection, table: str, key: str, value: Any, cols: dict[str, Any]
) -> None:
    """Insert the row `key = value` of `table`, or update these columns of it."""
    names = [key, *cols]
    sets = ", ".join(f"{k} = excluded.{k}" for k in cols)
    conn.execute(
        f"INSERT INTO {table}({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
        f"ON CONFLICT({key}) DO UPDATE SET {sets}",
        [value, *cols.values()],
    )


def upsert_worker(conn: sqlite3.Connection, game: str, **cols: Any) -> None:
    cols["updated"] = cols.get("updated", time.time())
    _upsert(conn, "workers", "game", game, cols)


def set_spare(conn: sqlite3.Connection, **cols: Any) -> None:
    """The spare worker's row (state off / starting / warming / ready)."""
    cols["updated"] = cols.get("updated", time.time())
    _upsert(conn, "spare", "id", 1, cols)


# ---- desired / modes ----------------------------------------------------------------------

HOST_SCOPE = "*"


def set_desired(conn: sqlite3.Connection, scope: str, mode: str, pinned: bool, now: float) -> None:
    conn.execute(
        "INSERT INTO desired(scope, mode, pinned, updated) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(scope) DO UPDATE SET mode = excluded.mode, pinned = excluded.pinned, "
        "updated = excluded.updated",
        (scope, mode, int(pinned), now),
    )


def set_mode(
    conn: sqlite3.Connection, scope: str, mode: str, now: float, reason: str | None
) -> None:
    conn.execute(
        "INSERT INTO modes(scope, mode, since, reason) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(scope) DO UPDATE SET mode = excluded.mode, since = excluded.since, "
        "reason = excluded.reason",
        (scope, mode, now, reason),
    )


# ---- control requests (CLI -> supervisor) ------------------------------------------------

STOP_REQUEST = "stop"


def request(conn: sqlite3.Connection, name: str, value: str, now: float) -> None:
    conn.execute(
        "INSERT INTO control(name, value, updated) VALUES (?, ?, ?) ON CONFLICT(name) DO "
        "UPDATE SET value = excluded.value, updated = excluded.updated",
        (name, value, now),
    )


def clear_request(conn: sqlite3.Connection, name: str) -> None:
    conn.execute("DELETE FROM control WHERE name = ?", (name,))


# ---- supervisor row -----------------------------------------------------------------------


def set_supervisor(conn: sqlite3.Connection, **cols: Any) -> None:
    _upsert(conn, "supervisor", "id", 1, cols)
