"""Modes: the ladder from the config, the effective mode per scope, and the seams that change it.

Effective mode of a game = pinned `desired` for the game, else pinned `desired` for '*', else
the lighter of the `modes` table's mode for the game and for '*' (the host's, else
`initial_mode`): a host step down reaches every unpinned game.

Steps return, the loop records: `auto_mode_change` (the policy's, the GPU gate's, a resume's)
returns a `ModeChange`, and `PinWatch` the operators' new pins; the supervisor records each
through its Recorder (the one funnel for events, which runs the hooks). The CLI's `pin_mode`
writes the wish (`desired`) only: the supervisor records `mode_pinned` when it reads it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from supervisor.config import Config, ModeSpec
from supervisor.ledger import db
from supervisor.ledger.recorder import Recorder
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
) -> tuple[str, ModeChange | None]:
    """On (re)start, a reboot included: the persisted host mode, never above the ceiling, and
    the change (for the caller to record) when the ceiling lowers it.

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
    if mode == persisted:
        return mode, None
    reason = [f"resumed at most at the ceiling ({ceiling})"]
    return mode, auto_mode_change(conn, cfg, HOST, mode, reason, now, current=persisted)


def is_pinned(conn: sqlite3.Connection, scope: str) -> bool:
    desired = db.get_desired(conn, scope)
    return bool(desired and desired[1])


@dataclass(frozen=True)
class ModeChange:
    """A scope's automatic mode changed: its `modes` row and its scale_down / scale_up event
    (naming the reasons), recorded together by the loop (`record`)."""

    scope: str
    old: str
    new: str
    reasons: tuple[str, ...]
    since: float  # modes.since and the event's mono: the policy's step-free clock
    kind: str  # scale_down | scale_up

    @property
    def game(self) -> str | None:
        return None if self.scope == HOST else self.scope

    def detail(self) -> dict[str, Any]:
        return {"scope": self.scope, "from": self.old, "to": self.new, "reasons": [*self.reasons]}

    def write(self, conn: sqlite3.Connection) -> None:
        db.set_mode(conn, self.scope, self.new, self.since, "; ".join(self.reasons))

    def record(self, recorder: Recorder) -> None:
        # One transaction: the row and its event land (or wait through an outage) together.
        recorder.event(self.kind, self.game, self.detail(), along=self.write, mono=self.since)


def auto_mode_change(
    conn: sqlite3.Connection,
    cfg: Config,
    scope: str,
    mode: str,
    reasons: list[str],
    now: float | None = None,
    *,
    current: str | None = None,
) -> ModeChange | None:
    """The stability policy's seam: the change that puts a scope ('*' or a game) on `mode`,
    or None when that mode is already in force. Writes nothing: the caller records it. A
    pinned scope keeps its pin: the automatic mode applies again after `rlsup scale --mode
    auto`. `current`: the scope's mode as the caller knows it (else read from the database).
    `now` is the change's `modes.since` and its event's `mono` (the policy's clock)."""
    if mode not in cfg.mode_names:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(cfg.mode_names)}")
    now = time.time() if now is None else now
    if current is None:
        row = db.get_mode(conn, scope)
        current = row[0] if row else None
    old = current if current is not None else host_mode_unpinned(conn, cfg).name
    if current is not None and old == mode:
        return None
    order = cfg.mode_names
    kind = "scale_down" if old in order and order.index(mode) < order.index(old) else "scale_up"
    return ModeChange(scope, old, mode, tuple(reasons), now, kind)


def pin_mode(
    conn: sqlite3.Connection, cfg: Config, scope: str, mode: str, now: float | None = None
) -> None:
    """CLI `scale`: pin a rung for a scope, or `auto` to hand it back to the policy. Writes
    the wish only; the supervisor records `mode_pinned` when it reads it (`PinWatch`)."""
    if mode != AUTO and mode not in cfg.mode_names:
        raise ValueError(
            f"unknown mode {mode!r}; expected one of {', '.join(cfg.mode_names)}, auto"
        )
    now = time.time() if now is None else now
    with db.transaction(conn):
        db.set_desired(conn, scope, mode, mode != AUTO, now)


@dataclass(frozen=True)
class Pin:
    """An operator's wish for a scope, as `desired` holds it (`updated`: when it was written)."""

    scope: str
    mode: str
    pinned: bool
    updated: float

    def detail(self) -> dict[str, Any]:
        return {"scope": self.scope, "mode": self.mode, "pinned": self.pinned}

    def record(self, recorder: Recorder) -> None:
        recorder.event("mode_pinned", None if self.scope == HOST else self.scope, self.detail())


class PinWatch:
    """The operators' pins as they arrive in `desired`: each new or changed row once, for the
    loop to record as `mode_pinned`. At the first read, a row already recorded (the newest
    `mode_pinned` of its scope says the same and was recorded after the row was written) is
    not recorded again: a restart does not repeat a pin, a pin written while no supervisor
    ran is recorded at its start."""

    def __init__(self) -> None:
        self._seen: dict[str, Pin] | None = None

    def read(self, conn: sqlite3.Connection) -> list[Pin]:
        rows = [
            Pin(str(r["scope"]), str(r["mode"]), bool(r["pinned"]), float(r["updated"]))
            for r in db.desired_rows(conn).values()
        ]
        if self._seen is None:
            self._seen = {p.scope: p for p in rows if _recorded(conn, p)}
        new = [p for p in rows if self._seen.get(p.scope) != p]
        self._seen.update((p.scope, p) for p in new)
        return new


def record(recorder: Recorder, steps: Iterable[ModeChange | Pin | None]) -> None:
    """The loop's half: record what the mode steps returned (None: nothing changed)."""
    for step in steps:
        if step is not None:
            step.record(recorder)


def _recorded(conn: sqlite3.Connection, pin: Pin) -> bool:
    last = db.events(conn, kind="mode_pinned", game=None if pin.scope == HOST else pin.scope)
    last = [e for e in last if e.detail.get("scope") == pin.scope][-1:]
    return bool(last) and last[0].detail == pin.detail() and last[0].ts >= pin.updated
