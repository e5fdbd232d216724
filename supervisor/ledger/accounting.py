"""Where each game's time (and money) went, from the event ledger alone.

A game's life runs from its first spawn (`worker_start`; `restart` after a failure) to its
`game_done` / `fatal` (or now), and every second of it falls in exactly one category, so
the parts sum to its wall time:

- `training`: a worker stepped (from its `worker_training` to its exit), less the two below;
- `evaluation`: the seconds its evaluations took (`evaluation` events, as the worker timed
  them; an evaluation reported again by a resumed worker counts once);
- `redone`: steps trained again after a resume: at each exit that was not a clean stop, the
  steps past the last committed checkpoint (`worker_exit`'s `global_step` -
  `last_checkpoint_step`), at the game's own average speed;
- `setup`: its first worker's start, from the spawn to the first step (imports, building the
  envs): what any run pays once;
- `starting`: the same for every later worker (restarts: the checkpoint load, the spare's
  hand-off);
- `waiting`: queued after an exit or a mode change (slots, the GPU gate);
- `backoff`: the restart backoff after a failure;
- `down`: the supervisor was not running because something went wrong (a crash, an
  unexpected reboot, a preemption: the `downtime_s` that `supervisor_start` measured);
- `paused`: the supervisor was stopped cleanly (`rlsup stop`, `systemctl stop`) until it
  started again: the operator's choice, never lost.

`downtime` is starting + waiting + backoff + down + paused; `lost` (to instability) is redone +
starting + backoff + down: what a run without failures, restarts or stops would not have
spent (waiting is not in it: a queue is the operator's choice; nor is a pause). With a host
price (`cost_per_hour`), each instant's cost is shared equally among the games alive then (in
any category), but the GPUs' part (`gpu_cost_share`), which the games placed on each GPU share;
each game's money splits as its time does. Once every game has ended, no game pays for the host.

The split is a fold over the events (ledger/fold.py), brought up to date from the last event
folded: the supervisor keeps it in memory and persists it in accounting.json, so neither a tick
nor `rlsup status` replays the ledger. Stdlib only.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from supervisor.ledger import fold_state
from supervisor.ledger.fold import GAME_KINDS, HOST_KINDS, KINDS, Bucket, Fold, GameTime, Row

# The categories and the snapshot's reading side live in time_split.py (what `rlsup status`
# reads without the fold); these names keep working here.
from supervisor.ledger.time_split import (
    CATEGORIES,
    DOWNTIME,
    LOST,
    RUNNING_PARTS,
    SNAPSHOT_EVERY_S,
    SNAPSHOT_FILE,
    SNAPSHOT_STALE_S,
    SNAPSHOT_VERSION,
    OnBad,
    carried,
    carry_part,
    read_snapshot,
)

__all__ = [
    "CATEGORIES", "DOWNTIME", "GAME_KINDS", "HOST_KINDS", "KINDS", "LOST", "RUNNING_PARTS",
    "SNAPSHOT_EVERY_S", "SNAPSHOT_FILE", "SNAPSHOT_STALE_S", "SNAPSHOT_VERSION",
    "Bucket", "Fold", "GameTime", "OnBad", "Row", "account", "account_db", "carried",
    "carry_part", "catch_up", "current_fold", "host_gpus", "read_rows", "read_snapshot",
    "resume_fold", "rows_of", "snapshot", "split_game",
]  # fmt: skip


def rows_of(events: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Events as dicts (ts, kind, game, detail; optionally id and mono), as the fold reads
    them."""
    out = []
    for n, e in enumerate(events, 1):
        detail = dict(e.get("detail") or {})
        placed = detail.pop("gpu", None)
        if isinstance(placed, dict) and "index" in placed:
            detail["gpu_index"] = placed["index"]
        mono = None if e.get("mono") is None else float(e["mono"])
        out.append(
            Row(int(e.get("id") or n), float(e["ts"]), mono, e["kind"], e.get("game"), detail)
        )
    return out


def account(
    events: Iterable[Mapping[str, Any]],
    games: Sequence[str],
    now: float,
    per_hour: float = 0.0,
    steps: Mapping[str, int] | None = None,
    eval_seconds: Mapping[str, float] | None = None,
    gpu_share: float = 0.0,
    gpus: int = 0,
    buckets: Sequence[Bucket] = (),
) -> dict[str, GameTime]:
    """Every game's split (and money with a price; each bucket's part of them) from one list
    of events, oldest first (`eval_seconds`: each game's, instead of its `evaluation`
    events')."""
    fold = Fold(games, gpus, buckets)
    fold.feed(rows_of(events))
    return fold.result(now, per_hour, gpu_share, steps, eval_seconds=eval_seconds)


def split_game(
    events: Iterable[Mapping[str, Any]],
    game: str,
    now: float,
    global_step: int | None = None,
    eval_seconds: float | None = None,
) -> GameTime:
    """One game's split (the game's events and the supervisor's, oldest first) up to `now`."""
    evals = None if eval_seconds is None else {game: eval_seconds}
    steps = None if global_step is None else {game: global_step}
    return account(events, [game], now, steps=steps, eval_seconds=evals)[game]


# ---- the ledger ------------------------------------------------------------------------------

# The detail fields the fold reads of each kind, extracted by SQLite (no JSON parsed in Python,
# and none of the kinds that need no field: most of a ledger).
_FIELDS: dict[str, dict[str, str]] = {
    "supervisor_start": {"downtime_s": "$.downtime_s", "after": "$.after", "pid": "$.pid"},
    "supervisor_stop": {"clean": "$.clean"},
    "worker_start": {"gpu_index": "$.gpu.index"},
    "restart": {"gpu_index": "$.gpu.index"},
    "worker_exit": {
        "global_step": "$.global_step",
        "last_checkpoint_step": "$.last_checkpoint_step",
        "exit": "$.exit",
        "returncode": "$.returncode",
    },
    "evaluation": {"seconds": "$.seconds", "step": "$.step", "time": "$.time"},
}
_COLUMNS = max(len(f) for f in _FIELDS.values())
_NAMES = {kind: list(f) for kind, f in _FIELDS.items()}


def _field_columns() -> str:
    """Column k: the k-th field of the row's kind (CASE on the kind)."""
    cols = []
    for k in range(_COLUMNS):
        whens = [
            f"WHEN '{kind}' THEN json_extract(detail, '{list(f.values())[k]}')"
            for kind, f in _FIELDS.items()
            if len(f) > k
        ]
        cols.append("CASE kind " + " ".join(whens) + " END")
    return ", ".join(cols)


CHUNK_ROWS = 5000  # rows folded at a time: memory bounded, the tick gets the GIL in between
# Between two chunks of a long catch-up (the first fold of a big ledger) the accounting thread
# sleeps, so that the tick never waits long for the GIL (a tick's p99 was 230 ms behind it).
CHUNK_PAUSE_S = 0.02


def _mono_column(conn: sqlite3.Connection) -> str:
    """A database the supervisor has not migrated yet (the CLI opens it read-only): no mono."""
    cols = {r[1] for r in conn.execute("PRAGMA table_info(events)")}
    return "mono" if "mono" in cols else "NULL"


def read_rows(conn: sqlite3.Connection, after_id: int = 0, limit: int | None = None) -> list[Row]:
    """The accounting events after `after_id`, oldest first (a range of the primary key: a
    tick reads only what is new), with the detail fields the fold reads."""
    kinds = list(KINDS)
    marks = ",".join("?" * len(kinds))
    mono = _mono_column(conn)
    tail = f" LIMIT {int(limit)}" if limit else ""
    # `+kind`: the range of ids, not the kind index (which would scan every event of the kinds)
    where = f"FROM events WHERE id > ? AND +kind IN ({marks}) ORDER BY id{tail}"
    try:
        raw = conn.execute(f"SELECT id, ts, {mono}, kind, game, {_field_columns()} {where}",
                           [after_id, *kinds]).fetchall()  # fmt: skip
    except sqlite3.Error:  # a detail that is not JSON: parse them one by one, leniently
        sql = f"SELECT id, ts, {mono}, kind, game, detail {where}"
        return [_lenient(r) for r in conn.execute(sql, [after_id, *kinds]) if _ok(r)]
    none: dict[str, Any] = {}
    out = []
    for r in raw:
        if not _ok(r):
            continue
        names = _NAMES.get(r[3])
        detail = none
        if names:
            detail = {k: v for k, v in zip(names, r[5:], strict=False) if v is not None}
        out.append(Row(r[0], float(r[1]), _finite(r[2]), r[3], r[4], detail))
    return out


def _ok(r: Sequence[Any]) -> bool:
    """A row the fold can place in time (a non-finite wall time would poison its clock)."""
    return isinstance(r[1], int | float) and math.isfinite(r[1]) and isinstance(r[3], str)


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _lenient(r: Sequence[Any]) -> Row:
    import json

    try:
        d = json.loads(r[5] or "{}")
    except ValueError:
        d = {}
    d = d if isinstance(d, dict) else {}
    placed = d.get("gpu")
    detail = {k: d[k] for k in _NAMES.get(r[3], ()) if k in d}
    if isinstance(placed, dict) and "index" in placed:
        detail["gpu_index"] = placed["index"]
    return Row(r[0], float(r[1]), _finite(r[2]), r[3], r[4], detail)


def catch_up(
    conn: sqlite3.Connection, fold: Fold, pause_s: float = 0.0, chunk: int = CHUNK_ROWS
) -> int:
    """Fold the events after the fold's last one, `chunk` rows at a time (`pause_s` between
    chunks); returns the rows read."""
    total = 0
    while True:
        rows = read_rows(conn, fold.last_id, chunk)
        fold.feed(rows)
        total += len(rows)
        if len(rows) < chunk:
            return total
        if pause_s > 0:
            time.sleep(pause_s)


def account_db(
    conn: sqlite3.Connection | None,
    games: Sequence[str],
    now: float,
    per_hour: float = 0.0,
    gpu_share: float = 0.0,
    steps: Mapping[str, int] | None = None,
    buckets: Sequence[Bucket] = (),
) -> dict[str, GameTime]:
    """The split of the whole ledger in `conn` (read-only is enough), folded from its start
    (`rlsup report`, `rlsup results`; the supervisor and status fold only the tail)."""
    fold = Fold(games, host_gpus(conn), buckets)
    if conn is not None:
        catch_up(conn, fold)
    return fold.result(now, per_hour, gpu_share, steps)


def host_gpus(conn: sqlite3.Connection | None) -> int:
    """How many GPUs the host has, from the newest vitals sample (0: none seen)."""
    import json

    if conn is None:
        return 0
    try:
        row = conn.execute("SELECT data FROM samples ORDER BY rowid DESC LIMIT 1").fetchone()
        gpus = json.loads(row[0]).get("gpus") if row else None
    except (sqlite3.Error, ValueError, TypeError, AttributeError):
        return 0
    return len(gpus) if isinstance(gpus, list) else 0


# ---- the supervisor's snapshot (accounting.json) ---------------------------------------------
#
# The supervisor folds the new events every SNAPSHOT_EVERY_S (and at its exit) and writes each
# game's split, with the fold's state, to <state_dir>/accounting.json; `rlsup status` reads it
# (time_split.py) and carries each game's current part on to now, or folds the events after it.


def snapshot(
    times: Mapping[str, GameTime],
    now: float,
    per_hour: float,
    gpu_share: float,
    rates: Mapping[str, float],
    fold: Fold | None = None,
) -> dict[str, Any]:
    """accounting.json: each started game's split at `now` (`rate`: its money per second
    then) and, with `fold`, the fold's state for the next fold of the tail."""
    out: dict[str, Any] = {
        "version": SNAPSHOT_VERSION,
        "upto": now,
        "per_hour": per_hour,
        "gpu_share": gpu_share,
        "games": {
            name: {"time": t.as_json(per_hour > 0), "open": t.open, "rate": rates.get(name, 0.0)}
            for name, t in times.items()
            if t.first is not None
        },
    }
    if fold is not None:
        out["fold"] = fold_state.dump(fold)
    return out


def resume_fold(
    conn: sqlite3.Connection | None,
    snap: Mapping[str, Any] | None,
    games: Sequence[str],
    on_bad: OnBad | None = None,
) -> Fold | None:
    """The fold persisted in `snap` when it validates, holds `games` and was folded from this
    ledger (the event at its last id has its wall time); else None: fold from the start.
    `on_bad`: told what did not validate (a fold that does not is never trusted)."""
    if snap is None or snap.get("fold") is None or conn is None:
        return None
    try:
        fold = fold_state.load(snap["fold"])
    except fold_state.BadState as exc:
        if on_bad is not None:
            on_bad(exc.where, exc.value, exc.why.replace("not ", "", 1))
        return None
    if not set(games) <= set(fold.games):
        return None
    if fold.last_id > 0:
        try:
            row = conn.execute("SELECT ts FROM events WHERE id = ?", (fold.last_id,)).fetchone()
        except sqlite3.Error:
            return None
        if row is None or row[0] != fold.ts:
            return None  # another ledger (a database replaced): never trusted
    return fold


def current_fold(
    conn: sqlite3.Connection | None,
    snap: Mapping[str, Any] | None,
    games: Sequence[str],
    on_bad: OnBad | None = None,
    pause_s: float = 0.0,
) -> Fold:
    """The persisted fold (or, when it cannot be trusted, a new one) brought up to date with
    the ledger's events after it; `fold.rows`: how many it read."""
    fold = resume_fold(conn, snap, games, on_bad) or Fold(games)
    fold.rows = 0
    fold.gpus = host_gpus(conn)
    if conn is not None:
        catch_up(conn, fold, pause_s)
    return fold
