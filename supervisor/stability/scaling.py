"""The stability policy wired to the state database: the daemon's `PolicyStep`.

`stability.decide` is pure; this module feeds it and applies what it decides:

- incidents: the `events` table within `stability.window_s`, each through
  `stability.incident_from_event`, timed by the writing supervisor's step-free clock
  (`events.mono`: a wall-clock step cannot move an incident out of its window or before a
  mode change), or by `ts` for rows without it; an incident "in the future" (the wall clock
  was stepped back between two supervisor lives) counts as now;
- scopes: '*' and every configured game. A scope's mode is its pin (`desired`, pinned) or its
  `modes` row; a game without a row passes the host's mode and the host's last change.
  `last_change` is the persisted `modes.since`, never reset by a supervisor start;
- vitals: the sampler's latest reading.

Per GPU (when the daemon passes `gpu_games`: it places this host's games on GPUs): before
deciding modes, games whose GPU is the trouble are moved to a calmer one (`gpumoves`: a
`GpuMove` returned to the daemon, which records `gpu_moved` and requeues the worker); GPU
pressure is then attributed to the games on that GPU, not the host
(`stability.GpuAttribution`). Each game's last move is read back from the `gpu_moved` events,
so the cooldown outlives a restart.

Each 'down' / 'up' becomes a `modes.ModeChange` (the `modes` row and its scale_down /
scale_up event naming the scope, the rungs and the causes), returned to the daemon after the
moves, which records it through its Recorder (so hooks hear of it). 'stay' decisions are logged
only when their causes change (numbers aside: ages tick on). The step runs every `every_s`
(monotonic) and at once after `request()` (the daemon calls it when a worker fails, so an
early OOM steps its game down before the restart, and the restart happens at the new size).
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import time
from collections.abc import Callable, Sequence

import structlog

from supervisor.config import Config
from supervisor.gpu.moves import GpuMove, LastMove, PlacedGame
from supervisor.ledger import db
from supervisor.stability import modes
from supervisor.stability.gpumoves import decide_moves
from supervisor.stability.policy import (
    HOST,
    Decision,
    GpuAttribution,
    Incident,
    PolicyConfig,
    ScopeState,
    Vitals,
    decide,
    incident_from_event,
)

log = structlog.get_logger("rlsup.scaling")

# What a policy step decides, for the daemon to carry out in order (None: nothing changed).
Decided = GpuMove | modes.ModeChange | None

INCIDENT_KINDS = ["host_reboot", "worker_crash", "worker_oom", "worker_hang"]
MAX_EVERY_S = 5.0
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _gist(causes: Sequence[str]) -> tuple[str, ...]:
    """Causes without their numbers ("last change 12s ago" ticks on): what a change is."""
    return tuple(_NUMBER.sub("#", c) for c in causes)


def policy_config(cfg: Config) -> PolicyConfig:
    s = cfg.stability
    return PolicyConfig(
        ceiling=s.ceiling or cfg.mode_names[-1],
        window_s=s.window_s,
        calm_s=s.calm_s,
        cooldown_s=s.cooldown_s,
        min_ram_available_pct=s.min_ram_available_pct,
        max_gpu_temp_c=s.max_gpu_temp_c,
    )


def policy_every_s(cfg: Config) -> float:
    """How often the policy runs: every 5 s, sooner when the cooldown is test-sized."""
    return max(cfg.tick_s, min(MAX_EVERY_S, cfg.stability.cooldown_s / 4))


def incidents(conn: sqlite3.Connection, now: float, window_s: float) -> list[Incident]:
    out = []
    for e in db.events(conn, since_mono=now - window_s, kind=INCIDENT_KINDS):
        ts = min(now, e.mono if e.mono is not None else e.ts)
        incident = incident_from_event(ts, e.kind, e.game, e.detail)
        if incident is not None:
            out.append(incident)
    return out


def _scope_state(
    conn: sqlite3.Connection, cfg: Config, scope: str, fallback: ScopeState | None
) -> ScopeState:
    desired = db.get_desired(conn, scope)
    row = db.get_mode(conn, scope)
    row_mode = row[0] if row and row[0] in cfg.mode_names else None
    if desired and desired[1] and desired[0] in cfg.mode_names:
        since = row[1] if row else (fallback.last_change if fallback else None)
        return ScopeState(scope, desired[0], True, since)
    if row_mode is not None:
        assert row is not None
        return ScopeState(scope, row_mode, False, row[1])
    if fallback is not None:  # a game without a row passes the host's mode
        return ScopeState(scope, fallback.mode, False, fallback.last_change)
    return ScopeState(scope, cfg.initial_mode, False, None)


def scope_states(conn: sqlite3.Connection, cfg: Config) -> list[ScopeState]:
    """'*' first, then every configured game."""
    host = _scope_state(conn, cfg, HOST, None)
    unpinned_host = host
    if host.pinned:  # games without their own row follow the host's automatic mode
        row = db.get_mode(conn, HOST)
        mode = row[0] if row and row[0] in cfg.mode_names else cfg.initial_mode
        unpinned_host = ScopeState(HOST, mode, False, host.last_change)
    return [host, *(_scope_state(conn, cfg, g.name, unpinned_host) for g in cfg.games)]


def last_moves(conn: sqlite3.Connection, now: float, since_s: float) -> dict[str, LastMove]:
    """Each game's last `gpu_moved` within `since_s`."""
    out = {}
    for e in db.events(conn, since_mono=now - since_s, kind="gpu_moved"):
        source = e.detail.get("from")
        if e.game is not None and isinstance(source, dict):
            ts = min(now, e.mono if e.mono is not None else e.ts)
            out[e.game] = LastMove(ts, str(source.get("uuid") or ""))
    return out


def move_games(
    conn: sqlite3.Connection,
    pcfg: PolicyConfig,
    scopes: Sequence[ScopeState],
    placed: Sequence[PlacedGame],
    found: Sequence[Incident],
    vitals: Vitals | None,
    now: float,
) -> tuple[list[GpuMove], GpuAttribution]:
    """The GPU moves to make now, and the per-GPU attribution the mode decision then uses."""
    since = {s.scope: s.last_change for s in scopes}
    placed = [dataclasses.replace(p, since=since.get(p.game)) for p in placed]
    moved = last_moves(conn, now, max(pcfg.window_s, pcfg.cooldown_s))
    fresh = vitals if vitals is not None and now - vitals.ts <= pcfg.vitals_max_age_s else None
    moves = decide_moves(placed, fresh.gpus if fresh else (), found, moved, pcfg, now)
    attribution = GpuAttribution(
        placed={p.game: p.gpu.uuid for p in placed},
        moved_at={**{g: m.ts for g, m in moved.items()}, **{m.game: now for m in moves}},
        moving={m.game: f"moved to GPU {m.to_gpu.index}: {'; '.join(m.causes)}" for m in moves},
    )
    return moves, attribution


def step(
    conn: sqlite3.Connection,
    cfg: Config,
    vitals: Vitals | None,
    now: float,
    placed: Sequence[PlacedGame] | None = None,
) -> tuple[list[Decision], list[GpuMove], list[modes.ModeChange]]:
    """One policy step: GPU moves (when `placed` is known), then decide every down/up.
    Returns all mode decisions, the moves and the changes they make, for the caller to carry
    out (the moves first: the mode decisions already count them)."""
    pcfg = policy_config(cfg)
    scopes = scope_states(conn, cfg)
    found = incidents(conn, now, pcfg.window_s)
    attribution: GpuAttribution | None = None
    moves: list[GpuMove] = []
    if placed is not None:
        moves, attribution = move_games(conn, pcfg, scopes, placed, found, vitals, now)
        for move in moves:
            log.warning("gpu_moved", game=move.game, **move.detail())
    decisions = decide(cfg.mode_names, scopes, found, vitals, pcfg, now, attribution)
    changes = [
        change
        for d in decisions
        if d.action in ("down", "up")
        and (change := modes.auto_mode_change(conn, cfg, d.scope, d.to_mode, [*d.causes], now))
    ]
    return decisions, moves, changes


class StabilityPolicy:
    """The daemon's policy step (`PolicyStep`): `policy(conn, cfg, now)` once a tick returns
    the GPU moves for the daemon to carry out and the mode changes for it to record."""

    def __init__(
        self,
        latest_vitals: Callable[[], Vitals | None],
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        gpu_games: Callable[[], Sequence[PlacedGame] | None] | None = None,
    ) -> None:
        """`gpu_games`: the games placed on GPUs now (None from it: this supervisor does not
        place games on GPUs; GPU pressure stays the host's)."""
        self.latest_vitals = latest_vitals
        self.gpu_games = gpu_games
        self.every_s = every_s
        self.clock = clock
        self._next = 0.0
        self._stay_causes: dict[str, tuple[str, ...]] = {}
        self.last_decisions: Sequence[Decision] = ()

    def request(self) -> None:
        """Run at the next call (a worker just failed)."""
        self._next = 0.0

    def __call__(self, conn: sqlite3.Connection, cfg: Config, now: float) -> list[Decided]:
        mono = self.clock()
        if mono < self._next:
            return []
        self._next = mono + (self.every_s if self.every_s is not None else policy_every_s(cfg))
        placed = self.gpu_games() if self.gpu_games is not None else None
        self.last_decisions, moves, changes = step(
            conn, cfg, self.latest_vitals(), now, placed=placed
        )
        for d in self.last_decisions:
            if d.action != "stay":
                self._stay_causes.pop(d.scope, None)
            elif self._stay_causes.get(d.scope) != _gist(d.causes):
                self._stay_causes[d.scope] = _gist(d.causes)
                log.info("policy_stay", scope=d.scope, mode=d.from_mode, causes=list(d.causes))
        return [*moves, *changes]
