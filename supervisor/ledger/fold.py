"""The games' time split folded over the ledger one event at a time, so that it can be brought up
to date from the events after the last one folded (`last_id`) instead of replaying the ledger.

The fold's state is small (a few numbers per game and per GPU, whatever the ledger holds) and
round-trips through JSON (`state` / `from_state`): the supervisor keeps it in memory and writes it
into accounting.json with the split, so that a restart or `rlsup status` folds only the tail.
A state read back is validated field by field; one that does not validate is never trusted
(`BadState`: the caller folds the ledger from the start instead).

Time: within one supervisor life the events' `mono` (the supervisor's step-free clock) measures
the time between them, so a wall-clock step neither loses nor adds a second; between two lives
(a `supervisor_start`, or an event without `mono`) only the wall clock can. The fold's own
clock `t` starts at the first event's wall time and advances by those differences.

Money without a price: the fold integrates, per game and part, the share of the host that the
game held (1/N of it, N the games alive; a GPU's part split among the games on that GPU, an idle
GPU's among all), so that any `cost_per_hour` and `gpu_cost_share` price it afterwards: a price
changed in the configuration needs no new fold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The categories are time_split.py's (read by `rlsup status` without this fold); handed on.
from supervisor.ledger.time_split import CATEGORIES as CATEGORIES
from supervisor.ledger.time_split import DOWNTIME as DOWNTIME
from supervisor.ledger.time_split import LOST as LOST
from supervisor.ledger.time_split import RUNNING_PARTS as RUNNING_PARTS

# What the fold tracks: "running" is split into RUNNING_PARTS only when a result is asked for
# (the split needs the game's average speed up to then).
PARTS = ("running", "setup", "starting", "waiting", "backoff", "down", "paused")
GPU_PARTS = frozenset({"setup", "starting", "running"})  # its worker holds its GPU
GAME_KINDS = ("worker_start", "restart", "worker_training", "worker_exit", "backoff",
              "game_done", "fatal", "evaluation")  # fmt: skip
HOST_KINDS = ("supervisor_start", "supervisor_stop")
KINDS = GAME_KINDS + HOST_KINDS
# A gap after a clean stop is the operator's pause, unless the host went away meanwhile.
UNEXPECTED_AFTER = frozenset({"host_reboot", "preempted"})
EVALS_KEPT = 8  # evaluations remembered per game: a resumed worker reports its newest again
STATE_VERSION = 1


@dataclass(frozen=True)
class Row:
    """One ledger event as the fold reads it: `detail` holds only the fields it uses."""

    id: int
    ts: float
    mono: float | None
    kind: str
    game: str | None
    detail: Mapping[str, Any]


@dataclass
class GameTime:
    """One game's time split (seconds) and, with a price, its money split."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    money: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    first: float | None = None  # its first worker_start (wall clock)
    end: float | None = None  # its game_done / fatal, or now
    redone_steps: int = 0
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
            out["money"] = round(sum(self.money.values()), 6)
            out["money_lost"] = round(sum(self.money[c] for c in LOST), 6)
        return out


@dataclass
class Bucket:
    """A stretch of time (a day of `rlsup report`): the games' seconds and money in it."""

    label: str
    start: float
    end: float
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    money: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))


# The host's share integrals: (all, none, idle, own GPU). `all`: ∫1/N while the host has GPUs,
# `none`: ∫1/N while it has none, `idle`: ∫idle/(n·N), `own`: ∫1/(n·on) on the game's GPU.
Share = tuple[float, float, float, float]
ZERO: Share = (0.0, 0.0, 0.0, 0.0)


def _sub(b: Share, a: Share) -> Share:
    return (b[0] - a[0], b[1] - a[1], b[2] - a[2], b[3] - a[3])


def _add(a: list[float], d: Share, scale: float = 1.0) -> None:
    for i in range(4):
        a[i] += d[i] * scale


def money_of(share: Sequence[float], per_hour: float, gpu_share: float) -> float:
    """A share integral priced: the GPUs' part (`gpu_share`) by the GPU integrals, the rest by
    1/N; a host without GPUs pays everything by 1/N."""
    s = min(1.0, max(0.0, gpu_share))
    rate = max(0.0, per_hour) / 3600.0
    return rate * (share[1] + (1.0 - s) * share[0] + s * (share[2] + share[3]))


@dataclass
class GameFold:
    part: str | None = None  # None: not started, or ended
    since: float = 0.0  # fold time it entered `part`
    at: Share = ZERO  # the share integrals then (`own`: of its GPU)
    gpu: int | None = None  # its current worker's GPU
    first: float | None = None
    end: float | None = None
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    share: dict[str, list[float]] = field(default_factory=lambda: {p: [0.0] * 4 for p in PARTS})
    redone_steps: int = 0
    newest: int = 0  # the newest global_step its exits named
    evals: list[list[Any]] = field(default_factory=list)  # [step, time, seconds], newest last
    eval_s: float = 0.0

    @property
    def holds_gpu(self) -> int | None:
        return self.gpu if self.part in GPU_PARTS else None


class Fold:
    """The split of `games` over the ledger's events, fed in id order (`feed`)."""

    def __init__(self, games: Sequence[str], gpus: int = 0, buckets: Sequence[Bucket] = ()):
        self.games = {g: GameFold() for g in dict.fromkeys(games)}
        self.gpus = gpus  # the host's GPUs (the newest vitals sample's)
        self.last_id = 0
        self.t: float | None = None  # the fold's clock at the last event
        self.ts: float | None = None  # that event's wall time
        self.mono: tuple[float, float] | None = None  # (t, mono) of this life's newest mono
        self.pid: int | None = None  # the supervisor of the current life
        self.seen: set[int] = set()  # GPU indices any worker was placed on
        self.cum: list[float] = [0.0, 0.0, 0.0]  # all, none, idle
        self.own: dict[int, float] = {}
        self.rows = 0  # rows fed (what a tick read)
        self._alive = 0
        self._on: dict[int, int] = {}
        self._rated: tuple[int, tuple[float, float, float, dict[int, float]]] | None = None
        self._buckets = list(buckets)
        self._marks: dict[float, tuple[list[float], dict[int, float]]] = {}
        self._parts: list[dict[str, list[float]]] = [{} for _ in self._buckets]  # per part
        self._running: list[dict[str, list[float]]] = [{} for _ in self._buckets]  # per game

    # ---- the clock -----------------------------------------------------------------------

    def _clock(self, row: Row) -> float:
        """The fold time of `row`: mono differences within a life, wall time across."""
        if self.t is None or self.ts is None:
            t = row.ts
        elif row.kind != "supervisor_start" and row.mono is not None and self.mono is not None:
            t = max(self.t, self.mono[0] + (row.mono - self.mono[1]))
        else:
            t = self.t + max(0.0, row.ts - self.ts)
        if row.kind == "supervisor_start":
            self.mono = None
            pid = row.detail.get("pid")
            self.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        if row.mono is not None:
            self.mono = (t, row.mono)
        self.ts = row.ts
        return t

    def t_at(self, now: float, steady: float | None = None, pid: int | None = None) -> float:
        """The fold time of `now` (wall): by `steady` (the caller's step-free clock) when the
        caller is the supervisor of the life folded last (`pid`), else by the wall clock."""
        if self.t is None or self.ts is None:
            return now
        if steady is not None and self.mono is not None and pid is not None and pid == self.pid:
            return max(self.t, self.mono[0] + (steady - self.mono[1]))
        return self.t + max(0.0, now - self.ts)

    # ---- the share integrals ---------------------------------------------------------------

    def _n_gpus(self) -> int:
        return max(self.gpus, len(self.seen))

    def _rates(self) -> tuple[float, float, float, dict[int, float]]:
        """d(all, none, idle)/dt and d(own)/dt per GPU, with the games alive now (kept until
        a game enters or leaves a part, or the GPUs known change: most events change none)."""
        n = self._n_gpus()
        if self._rated is not None and self._rated[0] == n:
            return self._rated[1]
        rates: tuple[float, float, float, dict[int, float]]
        if self._alive <= 0:
            rates = (0.0, 0.0, 0.0, {})
        elif n == 0:
            rates = (0.0, 1.0 / self._alive, 0.0, {})
        else:
            alive = float(self._alive)
            held = {i: c for i, c in self._on.items() if c > 0}
            own = {i: 1.0 / (n * c) for i, c in held.items()}
            rates = (1.0 / alive, 0.0, (n - len(held)) / (n * alive), own)
        self._rated = (n, rates)
        return rates

    def _advance(self, t: float) -> None:
        """Integrate up to `t` (the games alive constant since the last event), marking the
        buckets' bounds on the way."""
        if self.t is None:
            self.t = t
            return
        if self._buckets:
            for bound in self._bounds_between(self.t, t):
                self._integrate(bound)
                self._marks[bound] = (list(self.cum), dict(self.own))
        self._integrate(t)

    def _integrate(self, t: float) -> None:
        assert self.t is not None
        dt = t - self.t
        if dt > 0:
            a, z, idle, own = self._rates()
            self.cum[0] += a * dt
            self.cum[1] += z * dt
            self.cum[2] += idle * dt
            for i, r in own.items():
                self.own[i] = self.own.get(i, 0.0) + r * dt
        self.t = max(self.t, t)

    def _share_at(self, t: float, gpu: int | None) -> Share:
        """The integrals at `t`: marked (a bucket's bound), now, or carried on from now."""
        if t in self._marks:
            cum, own = self._marks[t]
        else:
            cum, own = self.cum, self.own
        base = (cum[0], cum[1], cum[2], own.get(gpu, 0.0) if gpu is not None else 0.0)
        if self.t is None or t <= self.t or t in self._marks:
            return base
        a, z, idle, rates = self._rates()
        dt = t - self.t
        r_own = rates.get(gpu, 0.0) if gpu is not None else 0.0
        return (base[0] + a * dt, base[1] + z * dt, base[2] + idle * dt, base[3] + r_own * dt)

    def _bounds_between(self, a: float, b: float) -> list[float]:
        out = {x for bk in self._buckets for x in (bk.start, bk.end) if a < x < b}
        return sorted(out)

    # ---- the games' parts ------------------------------------------------------------------

    def _leave(self, g: GameFold) -> None:
        self._rated = None
        if g.part is not None:
            self._alive -= 1
            if (i := g.holds_gpu) is not None:
                self._on[i] -= 1

    def _enter(self, g: GameFold, t: float) -> None:
        self._rated = None
        g.since = t
        if g.part is not None:
            self._alive += 1
            if (i := g.holds_gpu) is not None:
                self._on[i] = self._on.get(i, 0) + 1
        g.at = self._share_at(t, g.holds_gpu)

    def _close(self, name: str, g: GameFold, t: float) -> None:
        """Add the game's part from `since` to `t` (and, with buckets, each bound's piece)."""
        if g.part is None or t <= g.since:
            return
        d = _sub(self._share_at(t, g.holds_gpu), g.at)
        g.seconds[g.part] += t - g.since
        _add(g.share[g.part], d)
        if self._buckets:
            self._bucket_pieces(name, g, t)

    def _bucket_pieces(self, name: str, g: GameFold, t: float) -> None:
        assert g.part is not None
        for k, bk in enumerate(self._buckets):
            lo, hi = max(g.since, bk.start), min(t, bk.end)
            if hi <= lo:
                continue
            d = _sub(self._share_at(hi, g.holds_gpu), self._piece_start(g, lo))
            key, into = (
                (name, self._running[k]) if g.part == "running" else (g.part, self._parts[k])
            )
            acc = into.setdefault(key, [0.0] * 5)
            acc[4] += hi - lo
            _add(acc, d)

    def _piece_start(self, g: GameFold, lo: float) -> Share:
        """The integrals where a bucket's piece of the game's open part starts: when it
        entered the part, or at the bucket's bound."""
        return g.at if lo <= g.since else self._share_at(lo, g.holds_gpu)

    def _switch(self, name: str, g: GameFold, t: float, part: str | None) -> None:
        self._close(name, g, t)
        self._leave(g)
        g.part = part
        self._enter(g, t)

    # ---- the events ------------------------------------------------------------------------

    def feed(self, rows: Iterable[Row]) -> int:
        """Fold `rows` (ids above `last_id`, oldest first); returns how many were read."""
        n = 0
        for row in rows:
            n += 1
            if row.id <= self.last_id:
                continue
            self.last_id = row.id
            t = self._clock(row)
            if row.kind == "supervisor_start":
                self._started(row, t)
            elif row.kind == "supervisor_stop":
                self._advance(t)
                part = "paused" if row.detail.get("clean", True) else "down"
                for name, g in self.games.items():
                    if g.part is not None and g.part not in ("down", "paused"):
                        self._switch(name, g, t, part)
            else:
                self._advance(t)
                game = self.games.get(row.game or "")
                if game is not None:
                    self._game_event(row.game or "", game, row, t)
        self.rows += n
        return n

    def _started(self, row: Row, t: float) -> None:
        """A new life: the gap since the last one is down (its measured `downtime_s`; after a
        clean stop: paused, unless the host went away meanwhile), then each game waits for its
        worker to start again."""
        before = self.t
        gap = row.detail.get("downtime_s")
        unexpected = row.detail.get("after") in UNEXPECTED_AFTER
        if isinstance(gap, int | float) and not isinstance(gap, bool) and math.isfinite(gap):
            cut = max(before if before is not None else t, t - max(0.0, float(gap)))
            self._advance(cut)
            for name, g in self.games.items():
                if g.part is not None and g.part not in ("down", "paused"):
                    self._switch(name, g, cut, "down")
        self._advance(t)
        for name, g in self.games.items():
            if g.part == "paused" and unexpected:
                g.part = "down"  # the open piece: not closed yet, so relabelled whole
            if g.part is not None:
                self._switch(name, g, t, "waiting")

    def _game_event(self, name: str, g: GameFold, row: Row, t: float) -> None:
        kind, d = row.kind, row.detail
        if kind in ("worker_start", "restart"):
            label = "setup" if g.first is None else "starting"
            if g.first is None:
                g.first = row.ts
            g.end = None
            self._close(name, g, t)
            self._leave(g)
            index = d.get("gpu_index")
            g.gpu = index if isinstance(index, int) and not isinstance(index, bool) else None
            if g.gpu is not None:
                self.seen.add(g.gpu)
            g.part = label
            self._enter(g, t)
        elif kind == "evaluation":
            self._evaluation(g, d)
        elif g.part is None:
            return
        elif kind == "worker_training":
            self._switch(name, g, t, "running")
        elif kind == "worker_exit":
            self._exit(g, d)
            self._switch(name, g, t, "waiting")
        elif kind == "backoff":
            self._switch(name, g, t, "backoff")
        elif kind in ("game_done", "fatal"):
            self._switch(name, g, t, None)
            g.end = row.ts

    @staticmethod
    def _exit(g: GameFold, d: Mapping[str, Any]) -> None:
        step, ckpt = d.get("global_step"), d.get("last_checkpoint_step")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        g.newest = max(g.newest, step)
        clean = d.get("exit") in ("done", "stopped") or d.get("returncode") in (0, 75)
        if not clean:
            base = ckpt if isinstance(ckpt, int) and not isinstance(ckpt, bool) else 0
            g.redone_steps += max(0, step - base)

    @staticmethod
    def _evaluation(g: GameFold, d: Mapping[str, Any]) -> None:
        """Its seconds, once per (step, time): a resumed worker reports its newest again."""
        secs = d.get("seconds")
        if not isinstance(secs, int | float) or isinstance(secs, bool) or not math.isfinite(secs):
            return
        key = [plain_key(d.get("step")), plain_key(d.get("time"))]
        for ev in g.evals:
            if ev[:2] == key:
                if secs > ev[2]:
                    g.eval_s += secs - ev[2]
                    ev[2] = float(secs)
                return
        g.evals.append([*key, float(secs)])
        del g.evals[:-EVALS_KEPT]
        g.eval_s += float(secs)

    # ---- results ---------------------------------------------------------------------------

    def result(
        self,
        now: float,
        per_hour: float = 0.0,
        gpu_share: float = 0.0,
        steps: Mapping[str, int] | None = None,
        t_now: float | None = None,
        eval_seconds: Mapping[str, float] | None = None,
    ) -> dict[str, GameTime]:
        """Every game's split at `now` (wall; `t_now`: its fold time, default `t_at(now)`),
        each open part carried on to then; the fold itself is not changed (the buckets are
        filled). `steps`: where each game stands now (its speed, for the redone seconds)."""
        t_end = self.t_at(now) if t_now is None else t_now
        out: dict[str, GameTime] = {}
        running_ratio: dict[str, dict[str, float]] = {}
        for name, g in self.games.items():
            secs = dict(g.seconds)
            share = {p: list(v) for p, v in g.share.items()}
            if g.part is not None and t_end > g.since:
                secs[g.part] += t_end - g.since
                _add(share[g.part], _sub(self._share_at(t_end, g.holds_gpu), g.at))
            evals = g.eval_s if eval_seconds is None else eval_seconds.get(name, 0.0)
            gt, ratio = _split(g, secs, (steps or {}).get(name), evals)
            gt.end = g.end if g.part is None else (now if g.first is not None else None)
            gt.open = g.part
            for p in PARTS:
                m = money_of(share[p], per_hour, gpu_share)
                for c, r in ratio.items() if p == "running" else [(p, 1.0)]:
                    gt.money[c] += m * r
            out[name] = gt
            running_ratio[name] = ratio
        self._fill_buckets(t_end, per_hour, gpu_share, running_ratio)
        return out

    def _fill_buckets(
        self, t_end: float, per_hour: float, gpu_share: float, ratios: Mapping[str, Any]
    ) -> None:
        if not self._buckets:
            return
        parts = [{k: list(v) for k, v in p.items()} for p in self._parts]
        running = [{k: list(v) for k, v in p.items()} for p in self._running]
        for name, g in self.games.items():
            if g.part is None or t_end <= g.since:
                continue
            for k, bk in enumerate(self._buckets):
                lo, hi = max(g.since, bk.start), min(t_end, bk.end)
                if hi <= lo:
                    continue
                d = _sub(self._share_at(hi, g.holds_gpu), self._piece_start(g, lo))
                into, key = (running[k], name) if g.part == "running" else (parts[k], g.part)
                acc = into.setdefault(key, [0.0] * 5)
                acc[4] += hi - lo
                _add(acc, d)
        for k, bk in enumerate(self._buckets):
            for part, acc in parts[k].items():
                bk.seconds[part] += acc[4]
                bk.money[part] += money_of(acc, per_hour, gpu_share)
            for name, acc in running[k].items():
                m = money_of(acc, per_hour, gpu_share)
                for c, r in ratios.get(name, {}).items():
                    bk.seconds[c] += acc[4] * r
                    bk.money[c] += m * r

    def money_rates(self, per_hour: float, gpu_share: float) -> dict[str, float]:
        """Each open game's money per second now (what status carries a snapshot on with)."""
        a, z, idle, own = self._rates()
        out = {}
        for name, g in self.games.items():
            if g.part is None:
                continue
            i = g.holds_gpu
            mine = own.get(i, 0.0) if i is not None else 0.0
            out[name] = money_of((a, z, idle, mine), per_hour, gpu_share)
        return out

    def recount(self) -> None:
        """The games alive and on each GPU, from the games' parts (after a state is loaded)."""
        self._alive, self._on, self._rated = 0, {}, None
        for g in self.games.values():
            if g.part is not None:
                self._alive += 1
                if (i := g.holds_gpu) is not None:
                    self._on[i] = self._on.get(i, 0) + 1


def plain_key(v: Any) -> Any:
    """A key part as JSON keeps it (an evaluation's step or time)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int | float) and math.isfinite(v):
        return v
    return None


def _split(
    g: GameFold, secs: Mapping[str, float], global_step: int | None, eval_s: float
) -> tuple[GameTime, dict[str, float]]:
    """The running seconds split into training, evaluation and redone (the redone steps at
    the game's own average speed); returns the split and each running part's ratio."""
    out = GameTime(first=g.first, redone_steps=g.redone_steps)
    for p in PARTS:
        if p != "running":
            out.seconds[p] = secs[p]
    running = secs["running"]
    evaluation = min(running, max(0.0, eval_s))
    stepping = running - evaluation
    steps = max(global_step or 0, g.newest) + g.redone_steps
    redone = 0.0
    if g.redone_steps and steps > 0 and stepping > 0:
        redone = min(stepping, g.redone_steps / (steps / stepping))
    out.seconds["evaluation"] = evaluation
    out.seconds["redone"] = redone
    out.seconds["training"] = stepping - redone
    ratio = {c: (out.seconds[c] / running if running > 0 else 0.0) for c in RUNNING_PARTS}
    return out, ratio
