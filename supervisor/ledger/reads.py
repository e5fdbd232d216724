"""The ledger's read side: every query that reports what the state database holds (the
events, boots, uptime and MTBF, worker rows, modes, requests), for the supervisor, `observe/`
and the commands alike, which render and never write SQL. Reads only: the writes are db.py's.

Readers for the CLI take a connection that may be None (no database yet) and read a table or a
column an older database lacks as empty.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any, NamedTuple

# ---- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    id: int
    ts: float
    kind: str
    game: str | None
    detail: dict[str, Any]
    mono: float | None = None  # the writing supervisor's step-free clock, when it wrote it


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


# ---- boots, uptime, MTBF ------------------------------------------------------------------


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


@dataclass(frozen=True)
class BootSummary:
    window_s: float
    uptime_s: float  # supervisor-observed up time within the window
    uptime_fraction: float
    reboots: int  # boots first seen in the window that had a predecessor
    unexpected_reboots: int  # host_reboot events in the window
    supervisor_crashes: int


class Failures(NamedTuple):
    """The ledger's unexpected failures, read once: the times of its `host_reboot` events and
    of its supervisor crashes (the `supervisor_start`s after one). Each window of
    `boots_summary` and the MTBF count from it: `rlsup status` asks for three figures of them,
    and a ledger of weeks is one read, not six. (A NamedTuple: a fraction of a dataclass's
    cost to define, on every status line.)"""

    reboots: tuple[float, ...]
    crashes: tuple[float, ...]

    @property
    def total(self) -> int:
        return len(self.reboots) + len(self.crashes)


def failures(conn: sqlite3.Connection) -> Failures:
    """Every unexpected failure in the ledger (`Failures`), oldest first."""
    reboots: list[float] = []
    crashes: list[float] = []
    for e in events(conn, kind=["host_reboot", "supervisor_start"]):
        if e.kind == "host_reboot":
            reboots.append(e.ts)
        elif e.detail.get("after") == "supervisor_crash":
            crashes.append(e.ts)
    return Failures(tuple(reboots), tuple(crashes))


def boots_summary(
    conn: sqlite3.Connection, now: float, window_s: float, seen: Failures | None = None
) -> BootSummary:
    """Uptime and reboot counts over the last `window_s` seconds (e.g. 86400, 604800);
    `seen`: the ledger's failures when the caller read them already (`failures`)."""
    start = now - window_s
    up = 0.0
    rows = conn.execute("SELECT first_seen, last_seen FROM boots ORDER BY first_seen").fetchall()
    for r in rows:
        up += max(0.0, min(r["last_seen"], now) - max(r["first_seen"], start))
    first_ever = rows[0]["first_seen"] if rows else now
    reboots = conn.execute(
        "SELECT COUNT(*) FROM boots WHERE first_seen >= ? AND first_seen > ?", (start, first_ever)
    ).fetchone()[0]
    seen = failures(conn) if seen is None else seen
    unexpected = sum(1 for ts in seen.reboots if ts >= start)
    crashes = sum(1 for ts in seen.crashes if ts >= start)
    observed = max(1e-9, min(window_s, now - first_ever))
    return BootSummary(window_s, up, min(1.0, up / observed), reboots, unexpected, crashes)


def mtbf_s(conn: sqlite3.Connection, now: float, seen: Failures | None = None) -> float | None:
    """Mean time between unexpected failures (host reboots and supervisor crashes): observed
    up time over the whole ledger / their count; None when none happened yet. `seen`: as
    `boots_summary`'s."""
    up = sum(
        max(0.0, min(r["last_seen"], now) - r["first_seen"])
        for r in conn.execute("SELECT first_seen, last_seen FROM boots")
    )
    count = (failures(conn) if seen is None else seen).total
    return up / count if count else None


# ---- workers, the spare ------------------------------------------------------------------


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


def spare(conn: sqlite3.Connection) -> dict[str, Any] | None:
    r = conn.execute("SELECT * FROM spare WHERE id = 1").fetchone()
    return dict(r) if r else None


def worker(conn: sqlite3.Connection, game: str) -> dict[str, Any] | None:
    return next((w for w in workers(conn) if w["game"] == game), None)


# ---- desired / modes / control requests -------------------------------------------------


def get_desired(conn: sqlite3.Connection, scope: str) -> tuple[str, bool] | None:
    r = conn.execute("SELECT mode, pinned FROM desired WHERE scope = ?", (scope,)).fetchone()
    return (r["mode"], bool(r["pinned"])) if r else None


def get_mode(conn: sqlite3.Connection, scope: str) -> tuple[str, float, str | None] | None:
    r = conn.execute("SELECT mode, since, reason FROM modes WHERE scope = ?", (scope,)).fetchone()
    return (r["mode"], r["since"], r["reason"]) if r else None


def pending_request(conn: sqlite3.Connection, name: str) -> tuple[str, float] | None:
    if not _has_table(conn, "control"):
        return None
    r = conn.execute("SELECT value, updated FROM control WHERE name = ?", (name,)).fetchone()
    return (r["value"], r["updated"]) if r else None


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
    return row.fetchone() is not None


# ---- supervisor row -----------------------------------------------------------------------


def supervisor_row(conn: sqlite3.Connection) -> dict[str, Any] | None:
    r = conn.execute("SELECT * FROM supervisor WHERE id = 1").fetchone()
    return dict(r) if r else None


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


# ---- for the commands, which render and never query ---------------------------------------


def known_games(conn: sqlite3.Connection | None) -> set[str]:
    """The games the ledger has a worker row of (one since removed from the config included):
    the names `rlsup events --game` accepts beside the config's."""
    return _distinct(conn, "workers", "game")


def known_event_kinds(conn: sqlite3.Connection | None) -> set[str]:
    """The event kinds the log holds (a newer supervisor's included): the kinds `rlsup events
    --kind` accepts beside the contract's."""
    return _distinct(conn, "events", "kind")


def _distinct(conn: sqlite3.Connection | None, table: str, column: str) -> set[str]:
    """A column's values; no database, no such table yet, or a database locked past the busy
    timeout reads empty (the caller falls back to the names it knows)."""
    if conn is None:
        return set()
    try:
        rows = conn.execute(f"SELECT DISTINCT {column} FROM {table} WHERE {column} IS NOT NULL")
        return {r[0] for r in rows}
    except sqlite3.OperationalError:
        return set()


@dataclass(frozen=True)
class BootSpan:
    """One boot as the supervisor saw it: from its first sighting to its last."""

    first_seen: float
    last_seen: float


def boot_spans(conn: sqlite3.Connection) -> list[BootSpan]:
    """Every boot's observed span, oldest first (the up time of `rlsup report`)."""
    rows = conn.execute("SELECT first_seen, last_seen FROM boots ORDER BY first_seen")
    return [BootSpan(r["first_seen"], r["last_seen"]) for r in rows.fetchall()]


def count_events_between(conn: sqlite3.Connection, kind: str, start: float, end: float) -> int:
    """How many events of `kind` the log holds with start <= ts < end (one day of a report)."""
    row = conn.execute(
        "SELECT COUNT(*) FROM events WHERE kind = ? AND ts >= ? AND ts < ?", (kind, start, end)
    ).fetchone()
    return int(row[0])
