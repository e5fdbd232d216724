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
- `down`: the supervisor was not running (an operator's stop, a crash, a host reboot: the
  `downtime_s` that `supervisor_start` measured).

`downtime` is starting + waiting + backoff + down; `lost` (to instability) is redone +
starting + backoff + down: what a run without failures, restarts or stops would not have
spent (waiting is not in it: a queue is the operator's choice). With a host price
(`cost_per_hour`), each instant's cost is shared equally among the games alive then (in any
category), but the GPUs' part (`gpu_cost_share`), which the games placed on each GPU share;
each game's money splits as its time does.

Stdlib only; pure functions over the events (tested without a supervisor) plus one query.
"""

from __future__ import annotations

import bisect
import itertools
import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATEGORIES = ("training", "evaluation", "redone", "setup", "starting", "waiting", "backoff",
              "down")  # fmt: skip
DOWNTIME = ("starting", "waiting", "backoff", "down")
LOST = ("redone", "starting", "backoff", "down")
GAME_KINDS = ("worker_start", "restart", "worker_training", "worker_exit", "backoff",
              "game_done", "fatal", "evaluation")  # fmt: skip
HOST_KINDS = ("supervisor_start", "supervisor_stop")
KINDS = GAME_KINDS + HOST_KINDS


@dataclass
class Segment:
    start: float
    end: float
    category: str  # "running" until split, then one of CATEGORIES
    gpu: int | None = None  # the GPU its worker was placed on (worker_start's `gpu.index`)


@dataclass
class GameTime:
    """One game's time split (seconds) and, with a price, its money split."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    money: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    first: float | None = None  # its first worker_start
    end: float | None = None  # its game_done / fatal, or now
    redone_steps: int = 0
    segments: list[Segment] = field(default_factory=list)
    open: str | None = None  # the part it is in at `now` (None: not started, or ended)

    @property
    def wall_s(self) -> float:
        return sum(self.seconds.values())

    def as_json(self, priced: bool) -> dict[str, Any]:
        secs = self.seconds
        out: dict[str, Any] = {
            "wall_s": round(self.wall_s, 3),
            **{f"{c}_s": round(secs[c], 3) for c in CATEGORIES},
            "downtime_s": round(sum(secs[c] for c in DOWNTIME), 3),
            "lost_s": round(sum(secs[c] for c in LOST), 3),
            "redone_steps": self.redone_steps,
            "since": self.first,
        }
        if priced:
            out["money"] = round(sum(self.money.values()), 4)
            out["money_lost"] = round(sum(self.money[c] for c in LOST), 4)
        return out


def _segments(
    events: Iterable[Mapping[str, Any]], game: str, now: float
) -> tuple[list[Segment], list[Mapping[str, Any]], float | None, float | None]:
    """Replay the ledger: the game's segments (category "running" for stepping), its exits
    and evaluations (for the split), its first start and its end."""
    segs: list[Segment] = []
    cat: str | None = None  # None: not started, or ended
    since = 0.0
    first = end = None
    exits: list[Mapping[str, Any]] = []

    gpu: int | None = None  # the current worker's GPU

    def switch(ts: float, new: str | None) -> None:
        nonlocal cat, since
        if cat is not None and ts > since:
            on = gpu if cat in ("setup", "starting", "running") else None
            segs.append(Segment(since, ts, cat, on))
        cat, since = new, ts

    for e in events:
        ts, kind, detail = float(e["ts"]), e["kind"], e.get("detail") or {}
        if e.get("game") not in (None, game):
            continue
        if kind == "supervisor_start":
            if cat is None:
                continue
            gap = detail.get("downtime_s")
            if isinstance(gap, int | float) and gap > 0 and cat != "down":
                switch(max(since, ts - float(gap)), "down")
            switch(ts, "waiting")  # until its worker starts again
        elif kind == "supervisor_stop":
            if cat is not None:
                switch(ts, "down")
        elif e.get("game") is None:
            continue
        elif kind in ("worker_start", "restart"):  # a spawn (`restart`: after a failure)
            label = "setup" if first is None else "starting"
            first = ts if first is None else first
            end = None
            if cat is None:
                cat, since = label, ts
            else:
                switch(ts, label)
            placed = detail.get("gpu")
            index = placed.get("index") if isinstance(placed, dict) else None
            gpu = index if isinstance(index, int) and not isinstance(index, bool) else None
        elif cat is None:
            continue
        elif kind == "worker_training":
            switch(ts, "running")
        elif kind == "worker_exit":
            exits.append(detail)
            switch(ts, "waiting")
        elif kind == "backoff":
            switch(ts, "backoff")
        elif kind in ("game_done", "fatal"):
            switch(ts, None)
            end = ts
        elif kind == "evaluation":
            exits.append({"evaluation": detail})
    still = cat
    if cat is not None:
        switch(max(now, since), None)
        end = max(now, since)
    exits.append({"open": still})
    return segs, exits, first, end


def split_game(
    events: Sequence[Mapping[str, Any]],
    game: str,
    now: float,
    global_step: int | None = None,
    eval_seconds: float | None = None,
) -> GameTime:
    """One game's time split from the ledger's events (oldest first; the game's and the
    host-wide supervisor_start/stop ones), up to `now`; `global_step`: where it stands now
    (for its average speed; default: the newest step its exits name); `eval_seconds`: its
    evaluations' seconds as `load_eval_seconds` summed them (default: its `evaluation` events'
    in `events`)."""
    segs, notes, first, end = _segments(events, game, now)
    out = GameTime(first=first, end=end, segments=segs)
    running = 0.0
    for s in segs:
        if s.category == "running":
            running += s.end - s.start
        else:
            out.seconds[s.category] += s.end - s.start
    evals: dict[tuple[Any, Any], float] = {}
    newest = 0
    for d in notes:
        if "open" in d:
            out.open = d["open"]
            continue
        if "evaluation" in d:
            ev = d["evaluation"]
            if isinstance(ev.get("seconds"), int | float):
                evals[(ev.get("step"), ev.get("time"))] = float(ev["seconds"])
            continue
        step, ckpt = d.get("global_step"), d.get("last_checkpoint_step")
        if isinstance(step, int):
            newest = max(newest, step)
        clean = d.get("exit") in ("done", "stopped") or d.get("returncode") in (0, 75)
        if not clean and isinstance(step, int):
            out.redone_steps += max(0, step - (ckpt if isinstance(ckpt, int) else 0))
    evaluation = min(running, sum(evals.values()) if eval_seconds is None else eval_seconds)
    stepping = running - evaluation
    steps = max(global_step or 0, newest) + out.redone_steps
    redone = 0.0
    if out.redone_steps and steps > 0 and stepping > 0:
        redone = min(stepping, out.redone_steps / (steps / stepping))
    out.seconds["evaluation"] = evaluation
    out.seconds["redone"] = redone
    out.seconds["training"] = stepping - redone
    return out


RUNNING_PARTS = ("training", "evaluation", "redone")


@dataclass
class Bucket:
    """A stretch of time (a day of `rlsup report`): the games' seconds and money in it."""

    label: str
    start: float
    end: float
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    money: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))


def price(
    games: Mapping[str, GameTime],
    per_hour: float,
    buckets: Sequence[Bucket] = (),
    gpu_share: float = 0.0,
    gpus: int = 0,
) -> None:
    """Share the host's price among the games alive at each instant (each game's money splits
    across its categories as its time does: a running stretch pro rata into training,
    evaluation and redone); with `buckets`, also add each stretch's seconds and money to the
    buckets it overlaps.

    `gpu_share` of the price is the host's `gpus` GPUs' (each an equal part): a GPU's part is
    shared among the games whose worker is placed on it at that instant, and a GPU with none
    is paid by all the games alive (the host's bill is the bill); the rest of the price is
    shared among all the games alive.

    With N(t) the games alive at t and F(t) the integral of 1/N up to t (piecewise constant
    between the segments' ends), a segment [a, b) costs rate * (F(b) - F(a)), and likewise
    per GPU: one sweep and a bisection per segment."""
    if per_hour <= 0 and not buckets:
        return
    indices = sorted({seg.gpu for g in games.values() for seg in g.segments if seg.gpu is not None})
    n_gpus = max(gpus, len(indices)) if gpu_share > 0 else 0
    share = min(1.0, max(0.0, gpu_share)) if n_gpus else 0.0
    delta: dict[float, int] = {}
    gdelta: dict[int, dict[float, int]] = {i: {} for i in indices}
    for g in games.values():
        for seg in g.segments:
            delta[seg.start] = delta.get(seg.start, 0) + 1
            delta[seg.end] = delta.get(seg.end, 0) - 1
            if seg.gpu is not None:
                d = gdelta[seg.gpu]
                d[seg.start] = d.get(seg.start, 0) + 1
                d[seg.end] = d.get(seg.end, 0) - 1
    marks = sorted(delta)
    if len(marks) < 2:
        return
    rate = max(0.0, per_hour) / 3600.0
    # cumulative integrals at each mark: 1/N (all games), 1/N_g (the games on GPU g), and
    # the idle GPUs' parts paid by all: (GPUs with no game) / N
    cum_all, cum_idle = [0.0], [0.0]
    cum_gpu = {i: [0.0] for i in indices}
    alive = 0
    on = dict.fromkeys(indices, 0)
    for a, b in itertools.pairwise(marks):
        alive += delta[a]
        for i in indices:
            on[i] += gdelta[i].get(a, 0)
        dt = b - a
        cum_all.append(cum_all[-1] + (dt / alive if alive > 0 else 0.0))
        idle = n_gpus - sum(1 for i in indices if on[i] > 0)
        cum_idle.append(cum_idle[-1] + (dt * idle / alive if alive > 0 else 0.0))
        for i in indices:
            cum_gpu[i].append(cum_gpu[i][-1] + (dt / on[i] if on[i] > 0 else 0.0))

    def at(cum: list[float], t: float) -> float:
        k = bisect.bisect_right(marks, t) - 1
        if k < 0:
            return 0.0
        if k >= len(marks) - 1:
            return cum[-1]
        span = marks[k + 1] - marks[k]
        return cum[k] + (cum[k + 1] - cum[k]) * ((t - marks[k]) / span if span > 0 else 0.0)

    rest, per_gpu = rate * (1.0 - share), (rate * share / n_gpus if n_gpus else 0.0)

    def cost(seg: Segment, lo: float, hi: float) -> float:
        out = rest * (at(cum_all, hi) - at(cum_all, lo))
        out += per_gpu * (at(cum_idle, hi) - at(cum_idle, lo))
        if seg.gpu is not None and per_gpu:
            out += per_gpu * (at(cum_gpu[seg.gpu], hi) - at(cum_gpu[seg.gpu], lo))
        return out

    for g in games.values():
        running = sum(seg.end - seg.start for seg in g.segments if seg.category == "running")
        ratio = {c: (g.seconds[c] / running if running > 0 else 0.0) for c in RUNNING_PARTS}
        for seg in g.segments:
            parts = ratio.items() if seg.category == "running" else [(seg.category, 1.0)]
            money = cost(seg, seg.start, seg.end)
            for c, r in parts:
                g.money[c] += money * r
            for bucket in buckets:
                lo, hi = max(seg.start, bucket.start), min(seg.end, bucket.end)
                if hi <= lo:
                    continue
                part = cost(seg, lo, hi)
                for c, r in parts:
                    bucket.seconds[c] += (hi - lo) * r
                    bucket.money[c] += part * r


# The detail fields this accounting reads, extracted by SQLite (no JSON parsed in Python:
# `rlsup status` reads a week of 30 games' events within its budget).
_FIELDS = {
    "downtime_s": "$.downtime_s",
    "global_step": "$.global_step",
    "last_checkpoint_step": "$.last_checkpoint_step",
    "exit": "$.exit",
    "returncode": "$.returncode",
    "gpu_index": "$.gpu.index",
}


def load_events(conn: sqlite3.Connection | None, games: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The ledger's events this accounting reads, oldest first (one indexed query), but the
    evaluations (`load_eval_seconds`), each with the detail fields it reads."""
    if conn is None:
        return []
    kinds = [k for k in KINDS if k != "evaluation"]  # summed by load_eval_seconds
    marks = ",".join("?" * len(kinds))
    cols = ", ".join(f"json_extract(detail, '{path}')" for path in _FIELDS.values())
    sql = f"SELECT ts, kind, game, {cols} FROM events WHERE kind IN ({marks}) ORDER BY id"
    try:
        rows = conn.execute(sql, kinds).fetchall()
    except sqlite3.Error:  # a detail that is not JSON: read them one by one, leniently
        return _load_events_leniently(conn, kinds, games)
    wanted = set(games)
    names = list(_FIELDS)
    out = []
    for r in rows:
        if r[2] is not None and wanted and r[2] not in wanted:
            continue
        detail = {k: v for k, v in zip(names, r[3:], strict=True) if v is not None}
        if "gpu_index" in detail:
            detail["gpu"] = {"index": detail.pop("gpu_index")}
        out.append({"ts": r[0], "kind": r[1], "game": r[2], "detail": detail})
    return out


def _load_events_leniently(
    conn: sqlite3.Connection, kinds: Sequence[str], games: Sequence[str]
) -> list[dict[str, Any]]:
    marks = ",".join("?" * len(kinds))
    sql = f"SELECT ts, kind, game, detail FROM events WHERE kind IN ({marks}) ORDER BY id"
    wanted = set(games)
    return [
        {"ts": r[0], "kind": r[1], "game": r[2], "detail": _detail(r[3])}
        for r in conn.execute(sql, list(kinds))
        if r[2] is None or not wanted or r[2] in wanted
    ]


def load_eval_seconds(conn: sqlite3.Connection | None) -> dict[str, float]:
    """Each game's evaluation seconds, summed by SQLite (a week of evaluations of 30 games is
    tens of thousands of events: `rlsup status` must not parse them); an evaluation a resumed
    worker reports again (same step and time) counts once."""
    if conn is None:
        return {}
    sql = (
        "SELECT game, SUM(s) FROM (SELECT game, MAX(json_extract(detail, '$.seconds')) AS s "
        "FROM events WHERE kind = 'evaluation' AND game IS NOT NULL GROUP BY game, "
        "json_extract(detail, '$.step'), json_extract(detail, '$.time')) GROUP BY game"
    )
    try:
        return {r[0]: float(r[1] or 0.0) for r in conn.execute(sql)}
    except sqlite3.Error:  # malformed JSON in a detail: count none rather than fail status
        return {}


def _detail(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        d = json.loads(text or "{}")
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def account(
    events: Sequence[Mapping[str, Any]],
    games: Sequence[str],
    now: float,
    per_hour: float = 0.0,
    steps: Mapping[str, int] | None = None,
    eval_seconds: Mapping[str, float] | None = None,
    gpu_share: float = 0.0,
    gpus: int = 0,
) -> dict[str, GameTime]:
    """Every game's split (and money with a price) from one list of events (`eval_seconds`:
    `load_eval_seconds`'s, when the events hold no `evaluation`)."""
    by: dict[str, list[Mapping[str, Any]]] = {g: [] for g in games}
    for e in events:
        if e.get("game") is None:
            for lst in by.values():
                lst.append(e)
        elif e["game"] in by:
            by[e["game"]].append(e)
    evals = eval_seconds
    out = {
        g: split_game(by[g], g, now, (steps or {}).get(g),
                      None if evals is None else evals.get(g, 0.0))
        for g in games
    }  # fmt: skip
    price(out, per_hour, gpu_share=gpu_share, gpus=gpus)
    return out


def host_gpus(conn: sqlite3.Connection | None) -> int:
    """How many GPUs the host has, from the newest vitals sample (0: none seen)."""
    if conn is None:
        return 0
    try:
        row = conn.execute("SELECT data FROM samples ORDER BY rowid DESC LIMIT 1").fetchone()
    except sqlite3.Error:
        return 0
    gpus = _detail(row[0]).get("gpus") if row else None
    return len(gpus) if isinstance(gpus, list) else 0


def account_db(
    conn: sqlite3.Connection | None,
    games: Sequence[str],
    now: float,
    per_hour: float = 0.0,
    gpu_share: float = 0.0,
    steps: Mapping[str, int] | None = None,
) -> dict[str, GameTime]:
    """`account` over the ledger in `conn` (read-only is enough): its events, its evaluations
    summed by SQLite, the host's GPU count."""
    return account(
        load_events(conn, games), games, now, per_hour, steps, load_eval_seconds(conn),
        gpu_share, host_gpus(conn),
    )  # fmt: skip


# ---- the supervisor's snapshot, for `rlsup status` ---------------------------------------
#
# A replay of the whole ledger costs what the ledger holds (a week of 30 games on a host that
# reboots every 20 minutes: ~70,000 events, a third of a second). The supervisor writes each
# game's split to <state_dir>/accounting.json every SNAPSHOT_EVERY_S (and at its exit);
# `rlsup status` reads it and carries each game's current part on to now.

SNAPSHOT_FILE = "accounting.json"
SNAPSHOT_EVERY_S = 30.0
SNAPSHOT_STALE_S = 4 * SNAPSHOT_EVERY_S  # older while the supervisor runs: replay instead


def rates_now(
    times: Mapping[str, GameTime], per_hour: float, gpu_share: float = 0.0, gpus: int = 0
) -> dict[str, float]:
    """Each open game's money per second at the end of the replay (`price`'s rule)."""
    open_ = {n: t for n, t in times.items() if t.open is not None}
    if per_hour <= 0 or not open_:
        return dict.fromkeys(open_, 0.0)
    placed = {n: (t.segments[-1].gpu if t.segments else None) for n, t in open_.items()}
    indices = {i for i in placed.values() if i is not None}
    n_gpus = max(gpus, len(indices)) if gpu_share > 0 else 0
    share = min(1.0, max(0.0, gpu_share)) if n_gpus else 0.0
    rate = per_hour / 3600.0
    rest, per_gpu = rate * (1 - share), (rate * share / n_gpus if n_gpus else 0.0)
    on = {i: sum(1 for g in placed.values() if g == i) for i in indices}
    idle = n_gpus - len(indices)
    n = len(open_)
    return {
        name: rest / n + per_gpu * idle / n + (per_gpu / on[g] if g is not None else 0.0)
        for name, g in placed.items()
    }


def snapshot(
    times: Mapping[str, GameTime], now: float, per_hour: float, gpu_share: float, gpus: int
) -> dict[str, Any]:
    rates = rates_now(times, per_hour, gpu_share, gpus)
    return {
        "upto": now,
        "per_hour": per_hour,
        "gpu_share": gpu_share,
        "games": {
            name: {"time": t.as_json(per_hour > 0), "open": t.open, "rate": rates.get(name, 0.0)}
            for name, t in times.items()
            if t.first is not None
        },
    }


def read_snapshot(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / SNAPSHOT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("games"), dict)
    return data if ok and isinstance(data.get("upto"), int | float) else None


def carried(entry: Mapping[str, Any], dt: float, part: str | None) -> dict[str, Any]:
    """A snapshot's game split carried `dt` seconds on in `part` (its open part; "down" when
    the supervisor is not running; None: ended, nothing added)."""
    t = dict(entry["time"])
    if part is None or dt <= 0:
        return t
    key = "training" if part == "running" else part
    if f"{key}_s" not in t:
        return t
    t[f"{key}_s"] = round(t[f"{key}_s"] + dt, 3)
    t["wall_s"] = round(t["wall_s"] + dt, 3)
    if key in DOWNTIME:
        t["downtime_s"] = round(t["downtime_s"] + dt, 3)
    if key in LOST:
        t["lost_s"] = round(t["lost_s"] + dt, 3)
    if t.get("money") is not None:
        extra = float(entry.get("rate") or 0.0) * dt
        t["money"] = round(t["money"] + extra, 4)
        if key in LOST:
            t["money_lost"] = round(t["money_lost"] + extra, 4)
    return t
