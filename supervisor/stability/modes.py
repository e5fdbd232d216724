"""Modes: the ladder from the config, the effective mode per scope, and the seams that change it.

Effective mode of a game = pinned `desired` for the game, else pinned `desired` for '*', else
the lighter of the `modes` table's mode for the game and for '*' (the host's, else
`initial_mode`): a host step down reaches every unpinned game. The automatic policy
(written elsewhere) calls `set_auto_mode`; the CLI calls `pin_mode`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.config import Config, ModeSpec
from supervisor.ledger import db
from supervisor.stability.policy import resume_mode

# How a writer hands over one database write: db.transaction at once (the CLI), or the
# supervisor's journal (written in order, kept and retried while the database fails).
Write = Callable[[Callable[[sqlite3.Connection], Any]], None]

HOST = db.HOST_SCOPE
AUTO = "auto"


def _valid(cfg: Config, name: str | None) -> str | None:
    return name if name in cfg.mode_names else None


def host_mode(conn: sqlite3.Connection, cfg: Config) -> ModeSpec:
    """The host-wide mode in force (its max_concurrent caps running workers)."""
    desired = db.get_desired(conn, HOST)
    if desired and desired[1] and _valid(cfg, desired[0]):
        return cfg.mode(desired[0])
    current = db.get_mode(conn, HOST)
    if current and _valid(cfg, current[0]):
        return cfg.mode(current[0])
    return cfg.mode(cfg.initial_mode)


def effective_mode(conn: sqlite3.Connection, cfg: Config, game: str) -> ModeSpec:
    """A game's mode: its pin, else the host's pin, else min(its automatic mode, the host's)."""
    for scope in (game, HOST):
        desired = db.get_desired(conn, scope)
        if desired and desired[1] and _valid(cfg, desired[0]):
            return cfg.mode(desired[0])
    host = host_mode_unpinned(conn, cfg)
    current = db.get_mode(conn, game)
    if current and _valid(cfg, current[0]):
        return lower(cfg, cfg.mode(current[0]), host)
    return host


def lower(cfg: Config, a: ModeSpec, b: ModeSpec) -> ModeSpec:
    """The lighter of two rungs."""
    return a if cfg.mode_names.index(a.name) <= cfg.mode_names.index(b.name) else b


def one_rung_lower(cfg: Config, mode: ModeSpec) -> ModeSpec | None:
    i = cfg.mode_names.index(mode.name)
    return cfg.modes[i - 1] if i > 0 else None


def host_mode_unpinned(conn: sqlite3.Connection, cfg: Config) -> ModeSpec:
    current = db.get_mode(conn, HOST)
    if current and _valid(cfg, current[0]):
        return cfg.mode(current[0])
    return cfg.mode(cfg.initial_mode)


@dataclass(frozen=True)
class ModeView:
    """The modes in force, read once: the host's (its cap), each game's, and the pins."""

    host: ModeSpec
    games: dict[str, ModeSpec]
    pinned: frozenset[str]  # scopes with a pin ('*' and/or game names)

    def game(self, name: str) -> ModeSpec:
        return self.games.get(name, self.host)


def view(conn: sqlite3.Connection, cfg: Config) -> ModeView:
    return ModeView(
        host_mode(conn, cfg),
        {g.name: effective_mode(conn, cfg, g.name) for g in cfg.games},
        frozenset(s for s in (HOST, *(g.name for g in cfg.games)) if is_pinned(conn, s)),
    )


def _transaction(conn: sqlite3.Connection) -> Write:
    def write(op: Callable[[sqlite3.Connection], Any]) -> None:
        with db.transaction(conn):
            op(conn)

    return write


def ensure_initial_mode(
    conn: sqlite3.Connection, cfg: Config, now: float | None = None, write: Write | None = None
) -> None:
    """Persist initial_mode for the host on first start (or when the persisted one vanished)."""
    current = db.get_mode(conn, HOST)
    if current is None or not _valid(cfg, current[0]):
        since = time.time() if now is None else now
        (write or _transaction(conn))(
            lambda c: db.set_mode(c, HOST, cfg.initial_mode, since, "initial_mode")
        )


def resume_host_mode(
    conn: sqlite3.Connection, cfg: Config, now: float | None = None, write: Write | None = None
) -> str:
    """On (re)start, a reboot included: the persisted host mode, never above the ceiling.

    `initial_mode` applies only when nothing valid was persisted: a host stepped down because
    it kept rebooting must not climb back by rebooting again. `modes.since` is kept (the
    policy's cooldown and calm clocks survive restarts) unless the mode has to change.
    """
    now = time.time() if now is None else now
    current = db.get_mode(conn, HOST)
    persisted = current[0] if current and _valid(cfg, current[0]) else None
    if persisted is None:
        ensure_initial_mode(conn, cfg, now, write)
        persisted = cfg.initial_mode
    ceiling = cfg.stability.ceiling or cfg.mode_names[-1]
    mode = resume_mode(cfg.mode_names, persisted, cfg.initial_mode, ceiling)
    if mode != persisted:
        reason = [f"resumed at most at the ceiling ({ceiling})"]
        set_auto_mode(conn, cfg, HOST, mode, reason, now, write=write, current=persisted)
    return mode


def is_pinned(conn: sqlite3.Connection, scope: str) -> bool:
    desired = db.get_desired(conn, scope)
    return bool(desired and desired[1])


def set_auto_mode(
    conn: sqlite3.Connection,
    cfg: Config,
    scope: str,
    mode: str,
    reasons: list[str],
    now: float | None = None,
    *,
    write: Write | None = None,
    current: str | None = None,
) -> bool:
    """The stability policy's seam: change the automatic mode of a scope ('*' or a game).

    Writes `modes` and emits scale_down / scale_up naming the reasons. Returns False (and
    changes nothing) when the mode is already in force. A pinned scope keeps its pin: the
    automatic mode applies again after `rlsup scale --mode auto`. `current`: the scope's mode
    as the caller knows it (else read from the database). `now` is also the event's `mono`
    (the policy's clock) and `modes.since`; the event's `ts` is the wall clock.
    """
    if mode not in cfg.mode_names:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(cfg.mode_names)}")
    now = time.time() if now is None else now
    if current is None:
        row = db.get_mode(conn, scope)
        current = row[0] if row else None
    old = current if current is not None else host_mode_unpinned(conn, cfg).name
    if current is not None and old == mode:
        return False
    order = cfg.mode_names
    kind = "scale_down" if old in order and order.index(mode) < order.index(old) else "scale_up"
    detail = {"scope": scope, "from": old, "to": mode, "reasons": reasons}
    game = None if scope == HOST else scope
    wall = time.time()

    def op(c: sqlite3.Connection) -> None:
        db.set_mode(c, scope, mode, now, "; ".join(reasons))
        db.add_event(c, kind, game, detail, wall, mono=now)

    (write or _transaction(conn))(op)
    return True


def pin_mode(
    conn: sqlite3.Connection, cfg: Config, scope: str, mode: str, now: float | None = None
) -> None:
    """CLI `scale`: pin a rung for a scope, or `auto` to hand it back to the policy."""
    if mode != AUTO and mode not in cfg.mode_names:
        raise ValueError(
            f"unknown mode {mode!r}; expected one of {', '.join(cfg.mode_names)}, auto"
        )
    now = time.time() if now is None else now
    with db.transaction(conn):
        db.set_desired(conn, scope, mode, mode != AUTO, now)
        db.add_event(
            conn,
            "mode_pinned",
            None if scope == HOST else scope,
            {"scope": scope, "mode": mode, "pinned": mode != AUTO},
            now,
        )
