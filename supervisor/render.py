"""Shared helpers of the read-only CLI commands (status, events, plot).

Stdlib only (plus `supervisor.config`): `rlsup status` must start in milliseconds, so nothing
here may import torch, numpy, envpool or matplotlib.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import sqlite3
import sys
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from supervisor import db
from supervisor.commands._common import EXIT_USAGE
from supervisor.config import Config
from training.protocol import PROGRESS_FILE

DB_FILE = db.DB_NAME

# The contract's event kinds (db.EVENT_KINDS), in display order. A kind found in the database
# is accepted too, so that a newer supervisor's kinds can be queried by an older CLI.
EVENT_KINDS = tuple(sorted(db.EVENT_KINDS))
MODE_EVENT_KINDS = ("scale_down", "scale_up", "mode_pinned")


class UsageError(Exception):
    """Bad input from the operator (exit 2); str() is the whole message."""


# ---- arguments and configuration ----------------------------------------------------------


def fail_usage(message: str) -> int:
    print(f"rlsup: error: {message}", file=sys.stderr)
    return EXIT_USAGE


_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.IGNORECASE)
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """'90s', '30m', '24h', '7d', '2w' or plain seconds → seconds; UsageError otherwise."""
    m = _DURATION_RE.fullmatch(text)
    if not m:
        raise UsageError(
            f"bad duration {text!r}: expected a number with a unit s, m, h, d or w "
            "(e.g. 90s, 30m, 24h, 7d)"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2).lower()]


# ---- the state database (read-only) -------------------------------------------------------


@contextlib.contextmanager
def open_db_readonly(path: Path) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection (`mode=ro`: the CLI never writes), or None when there is no DB."""
    if not path.exists():
        yield None
        return
    uri = "file:" + urllib.parse.quote(str(path.absolute())) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=2.0)
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def connect_readonly(path: Path) -> sqlite3.Connection | None:
    """A long-lived read-only connection (for following), or None while there is no DB. Each
    statement outside a transaction reads the newest committed state (WAL)."""
    if not path.exists():
        return None
    uri = "file:" + urllib.parse.quote(str(path.absolute())) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=2.0)
    except sqlite3.OperationalError:  # removed since, or not readable yet
        return None
    conn.row_factory = sqlite3.Row
    return conn


def last_event_id(conn: sqlite3.Connection) -> int:
    """The id of the newest event (0 when there is none)."""
    return int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])


def query_events_between(
    conn: sqlite3.Connection,
    after_id: int,
    upto_id: int,
    *,
    since: float | None = None,
    game: str | None = None,
    kinds: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Events with after_id < id <= upto_id, oldest first, as {ts, kind, game, detail} (the
    shape of `query_events`): the new events since the last poll of a follower."""
    where = ["id > ?", "id <= ?"]
    params: list[Any] = [after_id, upto_id]
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if game is not None:
        where.append("game = ?")
        params.append(game)
    if kinds:
        where.append(f"kind IN ({','.join('?' * len(kinds))})")
        params += list(kinds)
    sql = f"SELECT ts, kind, game, detail FROM events WHERE {' AND '.join(where)} ORDER BY id"
    return [
        {"ts": r[0], "kind": r[1], "game": r[2], "detail": parse_json(r[3])}
        for r in conn.execute(sql, params)
    ]


def no_state_message(cfg: Config) -> str:
    return (
        f"no state database at {cfg.db_path} yet: the supervisor has never run with this "
        f"configuration. Start it with `rlsup run --config {cfg.path}` "
        f"(create a configuration with `rlsup init`)."
    )


def query_events(
    conn: sqlite3.Connection,
    *,
    since: float | None = None,
    game: str | None = None,
    kinds: Sequence[str] = (),
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """`db.events` as JSON-ready dicts {ts, kind, game, detail}, oldest first."""
    found = db.events(conn, since=since, game=game, kind=list(kinds) or None, limit=limit)
    return [{"ts": e.ts, "kind": e.kind, "game": e.game, "detail": e.detail} for e in found]


def parse_json(text: str | None) -> Any:
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return {"raw": text}


# ---- run directories ----------------------------------------------------------------------


def read_progress_tail(run_dir: Path, max_bytes: int = 96 * 1024) -> list[dict[str, str]]:
    """The last rows of `progress.csv` (about 20-40 min of 2 s rows), reading at most
    `max_bytes` from its end: status must not slow down as the file grows for weeks."""
    path = run_dir / PROGRESS_FILE
    try:
        with path.open("rb") as f:
            header_bytes = f.readline()
            size = f.seek(0, os.SEEK_END)
            start = max(len(header_bytes), size - max_bytes)
            f.seek(start)
            chunk = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = chunk.splitlines()
    if start > len(header_bytes) and lines:
        lines = lines[1:]  # the first line read may be partial
    names = header_bytes.decode("utf-8", "replace").strip().split(",")
    # The worker writes plain numbers (no quoting), so a split is a faithful CSV parse.
    return [dict(zip(names, line.split(","), strict=False)) for line in lines if line]


def read_progress(run_dir: Path) -> list[dict[str, str]]:
    """Every row of `progress.csv` (for plots)."""
    try:
        with (run_dir / PROGRESS_FILE).open(newline="", encoding="utf-8", errors="replace") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def to_float(value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


# ---- human formatting ---------------------------------------------------------------------


def fmt_duration(seconds: float | None) -> str:
    """Compact: 45s, 12m, 3h05m, 2d04h."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def fmt_ago(ts: float | None, now: float) -> str:
    return "-" if ts is None else f"{fmt_duration(now - ts)} ago"


def fmt_time(ts: float | None) -> str:
    """Local wall time, e.g. 2025-01-31 14:05:09."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def fmt_count(n: float | None) -> str:
    """1234 → 1.2k, 12_345_678 → 12.3M."""
    if n is None:
        return "-"
    a = abs(n)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{n / div:.1f}{suffix}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def fmt_num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_detail(detail: Any) -> str:
    """An event's detail dict as `key=value` pairs, one line."""
    if not isinstance(detail, dict):
        return str(detail)
    parts = []
    for k, v in detail.items():
        text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        parts.append(f"{k}={text}")
    return " ".join(parts)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain left-aligned text table (numbers right-aligned)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            numeric = bool(re.fullmatch(r"[-+]?[\d.,]+[kMG%]?", cell))
            out.append(cell.rjust(widths[i]) if numeric else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])
