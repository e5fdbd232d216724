"""The incremental fold's state as JSON (in accounting.json), and read back: every field
validated where it is read (a finite number, the right type, the keys it needs). A state that
does not validate raises `BadState`, naming the field: the caller folds the ledger again from
its start, never trusts it."""

from __future__ import annotations

import math
from typing import Any

from supervisor.ledger.fold import EVALS_KEPT, PARTS, STATE_VERSION, Fold, GameFold, plain_key


def dump(fold: Fold) -> dict[str, Any]:
    """The fold as JSON (not its buckets: those are one report's)."""
    return {
        "version": STATE_VERSION,
        "games": list(fold.games),
        "last_id": fold.last_id,
        "t": fold.t,
        "ts": fold.ts,
        "mono": None if fold.mono is None else list(fold.mono),
        "pid": fold.pid,
        "gpus": fold.gpus,
        "seen": sorted(fold.seen),
        "cum": list(fold.cum),
        "own": [[i, v] for i, v in sorted(fold.own.items())],
        "game": {name: _game_state(g) for name, g in fold.games.items()},
    }


def load(data: Any) -> Fold:
    """The fold `dump` wrote; BadState (naming the field) when anything does not
    validate: a value that is not a finite number, a wrong type, a missing key."""
    d = _dict(data, "fold")
    if d.get("version") != STATE_VERSION:
        raise BadState("fold.version", d.get("version"), f"not {STATE_VERSION}")
    names = _list(d.get("games"), "fold.games")
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise BadState("fold.games", names, "not a list of distinct names")
    fold = Fold(names, _int(d.get("gpus"), "fold.gpus"))
    fold.last_id = _int(d.get("last_id"), "fold.last_id")
    fold.t = _opt_num(d.get("t"), "fold.t")
    fold.ts = _opt_num(d.get("ts"), "fold.ts")
    mono = d.get("mono")
    if mono is not None:
        pair = _list(mono, "fold.mono", 2)
        fold.mono = (_num(pair[0], "fold.mono"), _num(pair[1], "fold.mono"))
    pid = d.get("pid")
    fold.pid = None if pid is None else _int(pid, "fold.pid")
    fold.seen = {_int(i, "fold.seen") for i in _list(d.get("seen"), "fold.seen")}
    fold.cum = [_num(v, "fold.cum") for v in _list(d.get("cum"), "fold.cum", 3)]
    for pair in _list(d.get("own"), "fold.own"):
        i, v = _list(pair, "fold.own", 2)
        fold.own[_int(i, "fold.own")] = _num(v, "fold.own")
    if (fold.t is None) != (fold.ts is None):
        raise BadState("fold.t", fold.t, "without its wall time")
    games = _dict(d.get("game"), "fold.game")
    if set(games) != set(names):
        raise BadState("fold.game", sorted(games), "not the fold's games")
    for name in names:
        fold.games[name] = _load_game(games[name], f"fold.game.{name}")
    fold.recount()
    return fold


class BadState(ValueError):
    """A persisted fold that does not validate: `where` names the field."""

    def __init__(self, where: str, value: Any, why: str) -> None:
        super().__init__(f"{where} = {str(value)[:80]!s}: {why}")
        self.where, self.value, self.why = where, value, why


def _num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise BadState(where, v, "not a finite number")
    return float(v)


def _opt_num(v: Any, where: str) -> float | None:
    return None if v is None else _num(v, where)


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadState(where, v, "not a whole number >= 0")
    return v


def _dict(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadState(where, v, "not an object")
    return v


def _list(v: Any, where: str, n: int | None = None) -> list[Any]:
    if not isinstance(v, list) or (n is not None and len(v) != n):
        raise BadState(where, v, "not a list" if n is None else f"not a list of {n}")
    return v


def _load_game(data: Any, where: str) -> GameFold:
    d = _dict(data, where)
    g = GameFold()
    part = d.get("part")
    if part is not None and part not in PARTS:
        raise BadState(f"{where}.part", part, "not a part")
    g.part = part
    g.since = _num(d.get("since"), f"{where}.since")
    at = [_num(v, f"{where}.at") for v in _list(d.get("at"), f"{where}.at", 4)]
    g.at = (at[0], at[1], at[2], at[3])
    gpu = d.get("gpu")
    g.gpu = None if gpu is None else _int(gpu, f"{where}.gpu")
    g.first = _opt_num(d.get("first"), f"{where}.first")
    g.end = _opt_num(d.get("end"), f"{where}.end")
    secs = _dict(d.get("seconds"), f"{where}.seconds")
    share = _dict(d.get("share"), f"{where}.share")
    for p in PARTS:
        g.seconds[p] = _num(secs.get(p), f"{where}.seconds.{p}")
        at_p = f"{where}.share.{p}"
        g.share[p] = [_num(v, at_p) for v in _list(share.get(p), at_p, 4)]
    g.redone_steps = _int(d.get("redone_steps"), f"{where}.redone_steps")
    g.newest = _int(d.get("newest"), f"{where}.newest")
    for ev in _list(d.get("evals"), f"{where}.evals")[-EVALS_KEPT:]:
        step, when, secs_ = _list(ev, f"{where}.evals", 3)
        g.evals.append([plain_key(step), plain_key(when), _num(secs_, f"{where}.evals")])
    g.eval_s = _num(d.get("eval_s"), f"{where}.eval_s")
    return g


def _game_state(g: GameFold) -> dict[str, Any]:
    return {
        "part": g.part,
        "since": g.since,
        "at": list(g.at),
        "gpu": g.gpu,
        "first": g.first,
        "end": g.end,
        "seconds": dict(g.seconds),
        "share": {p: list(v) for p, v in g.share.items()},
        "redone_steps": g.redone_steps,
        "newest": g.newest,
        "evals": [list(e) for e in g.evals],
        "eval_s": g.eval_s,
    }
