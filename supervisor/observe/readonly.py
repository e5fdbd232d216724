"""Read-only access to the state database and the run directories, for everything that reports
(the status document, `rlsup events`, `rlsup plot`, the metrics exporter). Stdlib only: `rlsup
status` must start in milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from supervisor.ledger import reads, schema
from training.run_files import MAX_UNIX_TIME, PROGRESS_FILE

# The contract's event kinds (schema.EVENT_KINDS), in display order. A kind found in the
# database is accepted too, so that a newer supervisor's kinds can be queried by an older CLI.
EVENT_KINDS = tuple(sorted(schema.EVENT_KINDS))


MODE_EVENT_KINDS = ("scale_down", "scale_up", "mode_pinned")


# The incidents marked on learning curves (`rlsup plot`, `rlsup dashboard`): event kind ->
# (colour, legend label). The colours are names both matplotlib and CSS know.
MARKERS: dict[str, tuple[str, str]] = {
    "host_reboot": ("red", "reboot"),
    "worker_crash": ("darkorange", "crash/OOM"),
    "worker_oom": ("darkorange", "crash/OOM"),
    "worker_hang": ("purple", "hang"),
    "scale_down": ("royalblue", "mode change"),
    "scale_up": ("royalblue", "mode change"),
    "mode_pinned": ("royalblue", "mode change"),
}


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


def query_events(
    conn: sqlite3.Connection,
    *,
    since: float | None = None,
    game: str | None = None,
    kinds: Sequence[str] = (),
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """`reads.events` as JSON-ready dicts {ts, kind, game, detail}, oldest first."""
    found = reads.events(conn, since=since, game=game, kind=list(kinds) or None, limit=limit)
    return [{"ts": e.ts, "kind": e.kind, "game": e.game, "detail": e.detail} for e in found]


def parse_json(text: str | None) -> Any:
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return {"raw": text}


class ProgressRows(Sequence[dict[str, str]]):
    """The rows of a progress.csv tail, each made a dict only when asked for (`rlsup status`
    reads 30 games' tails: building ~20,000 dicts it never looks at was most of its time)."""

    def __init__(self, names: list[str], lines: list[str]) -> None:
        self.names, self.lines = names, lines

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [dict(zip(self.names, line.split(","), strict=False)) for line in self.lines[i]]
        return dict(zip(self.names, self.lines[i].split(","), strict=False))

    def column_pairs(self, a: str, b: str) -> Iterator[tuple[str, str]]:
        """(row[a], row[b]) for each row, newest first, without making the rows."""
        try:
            ia, ib = self.names.index(a), self.names.index(b)
        except ValueError:
            return
        for line in reversed(self.lines):
            cells = line.split(",")
            if len(cells) > max(ia, ib):
                yield cells[ia], cells[ib]


def read_progress_tail(run_dir: Path, max_bytes: int = 96 * 1024) -> ProgressRows:
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
        return ProgressRows([], [])
    lines = chunk.splitlines()
    if start > len(header_bytes) and lines:
        lines = lines[1:]  # the first line read may be partial
    names = header_bytes.decode("utf-8", "replace").strip().split(",")
    # The worker writes plain numbers (no quoting), so a split is a faithful CSV parse.
    return ProgressRows(names, [line for line in lines if line])


def read_progress(run_dir: Path) -> list[dict[str, str]]:
    """Every row of `progress.csv` (for plots)."""
    import csv  # plots only: status reads the tail as lines (read_progress_tail)

    try:
        with (run_dir / PROGRESS_FILE).open(newline="", encoding="utf-8", errors="replace") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def to_float(value: Any) -> float | None:
    """A cell's (or a JSON value's) finite number, else None: `inf`, `nan` or text is no
    figure a curve or a rate can use."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def to_time(value: Any) -> float | None:
    """A cell's Unix time (seconds in [0, MAX_UNIX_TIME]: datetime can show it), else None."""
    t = to_float(value)
    return t if t is not None and 0.0 <= t <= MAX_UNIX_TIME else None
