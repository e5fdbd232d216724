"""The state database `<state_dir>/rlsup.db`: schema (a contract), migrations, query helpers.

WAL mode, `busy_timeout`, schema version in `PRAGMA user_version`, private files (dir 0700,
files 0600, -wal/-shm included). Only the supervisor writes, except `desired` (CLI `scale`).
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
from checkpoints.perms import DIR_MODE, masked

DB_NAME = "rlsup.db"
BUSY_TIMEOUT_MS = 10_000
# The supervisor's own connection waits less: its writes are journaled
# (supervisor/ledger/journal.py) and retried, and a tick must not stall behind an operator's
# long write lock.
SUPERVISOR_BUSY_TIMEOUT_MS = 1_000
EVENT_KINDS = frozenset(
    {
        "supervisor_start",
        "supervisor_stop",
        "host_reboot",
        "worker_start",
        "worker_exit",
        "worker_crash",
        "worker_hang",
        "worker_oom",
        "restart",
        "backoff",
        "fatal",
        "checkpoint_corrupt",
        "checkpoint_failed",
        "checkpoint_unreadable",
        "replay_damaged",
        "gpu_wait",
        "scale_down",
        "scale_up",
        "mode_pinned",
        "game_done",
        "config_reload",
        "config_error",
        "state_db_unavailable",
        "write_failed",
        "mirror_ok",
        "mirror_failed",
        "mirror_restored",
        "uploader_exit",
        # Several hosts ([cluster] backend = "ray"): the hosts' ledger and placements.
        "node_joined",
        "node_lost",
        "node_reboot",
        "no_host",
        "leftovers_stopped",
        # The pre-warmed spare worker ([spare]) and how each start was served.
        "spare_spawned",
        "spare_ready",
        "spare_lost",
        "spare_stopped",
        # Observability: an alert hook that failed, the metrics export that failed.
        "hook_failed",
        "metrics_failed",
        "spare_enabled",
        "spare_disabled",
        "worker_training",
        # GPUs: placement of a game's worker on one GPU, a GPU lost, NVML (un)available.
        "gpu_assigned",
        "gpu_lost",
        "gpu_driver",
        "gpu_moved",  # the policy moved a game off a hot or OOM-prone GPU to a calmer one
        # An auto game that will train on the CPU of a host with a driver (CPU-only torch).
        "device_fallback",
        # A worker's evaluation as its heartbeat reported it (step, mean, episodes, seconds):
        # the curves' evaluation points and the evaluation time of each game's time split.
        "evaluation",
        # A cloud's preemption notice ([preemption]): seen, lapsed, its watcher failing, a
        # worker that died under it, and the next boot's verdict (the machine was taken).
        "preemption_notice",
        "preemption_final_checkpoint",
        "preemption_cleared",
        "preemption_watch_failed",
        "worker_preempted",
        "preempted",
    }
)

_V1 = """
CREATE TABLE boots(boot_id TEXT PRIMARY KEY, boot_time REAL, first_seen REAL NOT NULL,
                   last_seen REAL NOT NULL, clean_stop INTEGER NOT NULL DEFAULT 0);
CREATE TABLE events(id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL, game TEXT,
                    detail TEXT NOT NULL DEFAULT '{}');
CREATE INDEX events_ts ON events(ts);
CREATE INDEX events_kind_ts ON events(kind, ts);
CREATE TABLE workers(game TEXT PRIMARY KEY, state TEXT NOT NULL, pid INTEGER,
                     pid_create_time REAL, mode TEXT, num_envs INTEGER, batch_size INTEGER,
                     restarts INTEGER NOT NULL DEFAULT 0, state_since REAL, reason TEXT,
                     heartbeat TEXT, updated REAL);
CREATE TABLE samples(ts REAL NOT NULL, data TEXT NOT NULL);
CREATE INDEX samples_ts ON samples(ts);
CREATE TABLE desired(scope TEXT PRIMARY KEY, mode TEXT NOT NULL, pinned INTEGER NOT NULL,
                     updated REAL NOT NULL);
CREATE TABLE modes(scope TEXT PRIMARY KEY, mode TEXT NOT NULL, since REAL NOT NULL, reason TEXT);
CREATE TABLE supervisor(id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER,
                        pid_create_time REAL, boot_id TEXT, started REAL, last_tick REAL,
                        config_path TEXT, state TEXT);
"""
# v2: a process is identified by pid + start ticks since boot (/proc/<pid>/stat), which no
# wall-clock step moves; events carry the supervisor's step-free clock (`mono`) for the policy.
# The supervisor records the systemd unit that runs it (if any); `control` carries requests
# from the CLI that are not modes (a stop asked by an operator who may not signal it).
_V2 = """
ALTER TABLE workers ADD COLUMN pid_start_ticks INTEGER;
ALTER TABLE supervisor ADD COLUMN pid_start_ticks INTEGER;
ALTER TABLE supervisor ADD COLUMN systemd_unit TEXT;
ALTER TABLE events ADD COLUMN mono REAL;
CREATE TABLE control(name TEXT PRIMARY KEY, value TEXT, updated REAL NOT NULL);
"""
# v3: the pre-warmed spare worker (one row: its state, identity, why) and, per game, how its
# current worker was started (`last_start`: served spare/cold and the detect -> first step
# breakdown, JSON).
_V3 = """
CREATE TABLE spare(id INTEGER PRIMARY KEY CHECK (id = 1), state TEXT NOT NULL, pid INTEGER,
                   pid_start_ticks INTEGER, device TEXT, since REAL, ready_since REAL,
                   reason TEXT, rss_mb REAL, updated REAL NOT NULL);
ALTER TABLE workers ADD COLUMN last_start TEXT;
"""
# v4: the GPU the game's current worker was placed on ({"index", "uuid"} as JSON, NULL when
# it has no worker or runs unplaced).
_V4 = """
ALTER TABLE workers ADD COLUMN gpu TEXT;
"""
# Forward migrations: MIGRATIONS[i] takes user_version i to i+1. Append, never edit.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4)
SCHEMA_VERSION = len(MIGRATIONS)


def make_private_dir(path: Path) -> Path:
    """A state directory: its owner's, and its group's to read where the umask allows it
    (the systemd unit's operators group); never anyone else's."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, masked(DIR_MODE))
    return path


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


def starts(conn: sqlite3.Connection, game: str) -> int:
    """How many workers of `game` the ledger has seen start (`worker_start` and `restart`
    events): a command game's RLSUP_RESUME_COUNT. Events still in the journal's queue are not
    counted; a read error counts none."""
    try:
        row = conn.execute(
            "SELECT COUNT(*) FROM events WHERE game = ? AND kind IN ('worker_start', 'restart')",
            (game,),
        ).fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0]) if row else 0


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


@dataclass(frozen=True)
class Event:
    id: int
    ts: float
    kind: str
    game: str | None
    detail: dict[str, Any]
    mono: float | None = None  # the writing supervisor's step-free clock, when it wrote it


def event_counts(conn: sqlite3.Connection, kinds: tuple[str, ...]) -> dict[str, int]:
    """How many events of each of these kinds the log holds."""
    rows = conn.execute(
        f"SELECT kind, COUNT(*) FROM events WHERE kind IN ({','.join('?' * len(kinds))}) "
        "GROUP BY kind",
        kinds,
    ).fetchall()
    return {str(k): int(n) for k, n in rows}


def events(
    conn: sqlite3.Connection,
    since: float | None = None,
    game: str | None = None,
    kind: str | list[str] | None = None,
    limit: int | None = None,
    since_mono: float | None = None,
) -> list[Event]:
    """Events oldest first, filtered by time (ts >= since; or the step-free clock, where the
    row has one, >= since_mono), game and kind(s)."""
    where: list[str] = []
    params: list[Any] = []
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if since_mono is not None:
        where.append(
            "COALESCE(mono, ts) >= ?" if _has_column(conn, "events", "mono") else "ts >= ?"
        )
        params.append(since_mono)
    if game is not None:
        where.append("game = ?")
        params.append(game)
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else list(kind)
        where.append(f"kind IN ({','.join('?' * len(kinds))})")
        params += kinds
    # A database the supervisor has not migrated yet (the CLI opens it read-only): no `mono`.
    mono = "mono" if _has_column(conn, "events", "mono") else "NULL AS mono"
    sql = f"SELECT id, ts, kind, game, detail, {mono} FROM events"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id"
    if limit is not None:
        newest = sql.replace("ORDER BY id", "ORDER BY id DESC")
        sql = f"SELECT * FROM ({newest} LIMIT {int(limit)}) ORDER BY id"
    return [
        Event(r["id"], r["ts"], r["kind"], r["game"], json.loads(r["detail"] or "{}"), r["mono"])
        for r in conn.execute(sql, params)
    ]


def _has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    return any(row[1] == column for row in conn.execute(f"PRAGMA table_info({table})"))


# ---- boots --------------------------------------------------------------------------------

BOOT_ID_ENV = manifest.BOOT_ID_ENV


def boot_event(conn: sqlite3.Connection, kind: str, boot_id: str) -> Event | None:
    """The newest event of `kind` whose detail names `boot_id` (the preemption notices)."""
    r = conn.execute(
        "SELECT id, ts, kind, game, detail FROM events WHERE kind = ? "
        "AND json_extract(detail, '$.boot_id') = ? ORDER BY id DESC LIMIT 1",
        (kind, boot_id),
    ).fetchone()
    if r is None:
        return None
    return Event(r["id"], r["ts"], r["kind"], r["game"], json.loads(r["detail"] or "{}"))


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


@dataclass(frozen=True)
class BootSummary:
    window_s: float
    uptime_s: float  # supervisor-observed up time within the window
    uptime_fraction: float
    reboots: int  # boots first seen in the window that had a predecessor
    unexpected_reboots: int  # host_reboot events in the window
    supervisor_crashes: int


def boots_summary(conn: sqlite3.Connection, now: float, window_s: float) -> BootSummary:
    """Uptime and reboot counts over the last `window_s` seconds (e.g. 86400, 604800)."""
    start = now - window_s
    up = 0.0
    rows = conn.execute("SELECT first_seen, last_seen FROM boots ORDER BY first_seen").fetchall()
    for r in rows:
        up += max(0.0, min(r["last_seen"], now) - max(r["first_seen"], start))
    first_ever = rows[0]["first_seen"] if rows else now
    reboots = conn.execute(
        "SELECT COUNT(*) FROM boots WHERE first_seen >= ? AND first_seen > ?", (start, first_ever)
    ).fetchone()[0]
    unexpected = conn.execute(
        "SELECT COUNT(*) FROM events WHERE kind = 'host_reboot' AND ts >= ?", (start,)
    ).fetchone()[0]
    crashes = sum(
        1
        for e in events(conn, since=start, kind="supervisor_start")
        if e.detail.get("after") == "supervisor_crash"
    )
    observed = max(1e-9, min(window_s, now - first_ever))
    return BootSummary(window_s, up, min(1.0, up / observed), reboots, unexpected, crashes)


def mtbf_s(conn: sqlite3.Connection, now: float) -> float | None:
    """Mean time between unexpected failures (host reboots and supervisor crashes): observed
    up time over the whole ledger / their count; None when none happened yet."""
    up = sum(
        max(0.0, min(r["last_seen"], now) - r["first_seen"])
        for r in conn.execute("SELECT first_seen, last_seen FROM boots")
    )
    failures = len(events(conn, kind="host_reboot")) + sum(
        1
        for e in events(conn, kind="supervisor_start")
        if e.detail.get("after") == "supervisor_crash"
    )
    return up / failures if failures else None


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


def workers(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """All worker rows; `heartbeat` decoded from JSON (None when absent)."""
    out = []
    for r in conn.execute("SELECT * FROM workers ORDER BY game"):
        row = dict(r)
        row["heartbeat"] = json.loads(row["heartbeat"]) if row["heartbeat"] else None
        row["last_start"] = json.loads(row["last_start"]) if row.get("last_start") else None
        row["gpu"] = json.loads(row["gpu"]) if row.get("gpu") else None
        out.append(row)
    return out


def set_spare(conn: sqlite3.Connection, **cols: Any) -> None:
    """The spare worker's row (state off / starting / warming / ready)."""
    cols["updated"] = cols.get("updated", time.time())
    _upsert(conn, "spare", "id", 1, cols)


def spare(conn: sqlite3.Connection) -> dict[str, Any] | None:
    r = conn.execute("SELECT * FROM spare WHERE id = 1").fetchone()
    return dict(r) if r else None


def worker(conn: sqlite3.Connection, game: str) -> dict[str, Any] | None:
    return next((w for w in workers(conn) if w["game"] == game), None)


# ---- desired / modes ----------------------------------------------------------------------

HOST_SCOPE = "*"


def get_desired(conn: sqlite3.Connection, scope: str) -> tuple[str, bool] | None:
    r = conn.execute("SELECT mode, pinned FROM desired WHERE scope = ?", (scope,)).fetchone()
    return (r["mode"], bool(r["pinned"])) if r else None


def set_desired(conn: sqlite3.Connection, scope: str, mode: str, pinned: bool, now: float) -> None:
    conn.execute(
        "INSERT INTO desired(scope, mode, pinned, updated) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(scope) DO UPDATE SET mode = excluded.mode, pinned = excluded.pinned, "
        "updated = excluded.updated",
        (scope, mode, int(pinned), now),
    )


def get_mode(conn: sqlite3.Connection, scope: str) -> tuple[str, float, str | None] | None:
    r = conn.execute("SELECT mode, since, reason FROM modes WHERE scope = ?", (scope,)).fetchone()
    return (r["mode"], r["since"], r["reason"]) if r else None


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


def pending_request(conn: sqlite3.Connection, name: str) -> tuple[str, float] | None:
    if not _has_table(conn, "control"):
        return None
    r = conn.execute("SELECT value, updated FROM control WHERE name = ?", (name,)).fetchone()
    return (r["value"], r["updated"]) if r else None


def clear_request(conn: sqlite3.Connection, name: str) -> None:
    conn.execute("DELETE FROM control WHERE name = ?", (name,))


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
    return row.fetchone() is not None


# ---- reads for the CLI (a database that may be absent, or older than this rlsup) -----------


def _rows(conn: sqlite3.Connection | None, sql: str, *params: Any) -> list[dict[str, Any]]:
    """Rows as dicts; no database, or a table or column it does not have (yet), reads empty."""
    if conn is None:
        return []
    try:
        return [dict(r) for r in conn.execute(sql, params).fetchall()]
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc) or "no such column" in str(exc):
            return []
        raise


def supervisor_record(conn: sqlite3.Connection | None) -> dict[str, Any] | None:
    rows = _rows(conn, "SELECT * FROM supervisor WHERE id = 1")
    return rows[0] if rows else None


def boot_time_of(conn: sqlite3.Connection | None, boot_id: str | None) -> float | None:
    rows = _rows(conn, "SELECT boot_time FROM boots WHERE boot_id = ?", boot_id)
    return rows[0]["boot_time"] if rows else None


def first_boot_seen(conn: sqlite3.Connection | None) -> float | None:
    rows = _rows(conn, "SELECT MIN(first_seen) AS t FROM boots")
    return rows[0]["t"] if rows else None


def latest_sample(conn: sqlite3.Connection | None) -> tuple[float, str] | None:
    rows = _rows(conn, "SELECT ts, data FROM samples ORDER BY rowid DESC LIMIT 1")
    return (rows[0]["ts"], rows[0]["data"]) if rows else None


def desired_rows(conn: sqlite3.Connection | None) -> dict[str, dict[str, Any]]:
    """Operators' pins by scope."""
    return {r["scope"]: r for r in _rows(conn, "SELECT * FROM desired")}


def mode_rows(conn: sqlite3.Connection | None) -> list[dict[str, Any]]:
    """The modes in force by scope (scope, mode, since, reason), in scope order."""
    return _rows(conn, "SELECT * FROM modes ORDER BY scope")


# ---- supervisor row -----------------------------------------------------------------------


def set_supervisor(conn: sqlite3.Connection, **cols: Any) -> None:
    _upsert(conn, "supervisor", "id", 1, cols)


def supervisor_row(conn: sqlite3.Connection) -> dict[str, Any] | None:
    r = conn.execute("SELECT * FROM supervisor WHERE id = 1").fetchone()
    return dict(r) if r else None
