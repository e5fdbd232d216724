"""The stability policy: a pure function from (incidents, vitals, modes, config, now) to decisions.

One clock for everything passed in: seconds since the epoch, as the supervisor's step-free clock
keeps them (read from the wall clock once at its start, then monotonic: `Supervisor.steady`).
Incidents outlive reboots (they come from the `events` table, timed by `events.mono`), and no
wall-clock step during a supervisor's life moves one out of its window or before a change.

Rules, per scope ('*' = the whole host, or one game), in this order:

=====================  ==========================================================================
pinned                 stay ("pinned"): automation is off for the scope.
above ceiling          host only: straight down to the ceiling (config changed; no cooldown).
down triggers          host: >= `reboots_to_step_host` unexpected reboots (default 2: one reboot
                       alone may be maintenance; it still restarts the calm clock);
                       >= `kernel_ooms_to_step_host` kernel OOM kills (default 1: host RAM ran
                       out); >= `host_failures_to_step` worker failures spread over >=
                       `host_failing_games` games; RAM available, GPU free memory under
                       threshold or GPU temperature over limit (pressure before failure).
                       game: >= `game_failures_to_step` failures of that game while failures are
                       not spread (spread failures step the host instead: one storm, one
                       rung); a worker OOM exit within `early_oom_s` of its start (do not retry
                       at the same size).
cooldown               a down trigger within `cooldown_s` of the scope's last change: stay.
                       Exception: an early OOM that happened *after* the last change is new
                       evidence at the new size, so it steps down regardless.
floor                  a down trigger at the lowest rung: stay, causes say why.
up                     no incident for the scope and no pressure for `calm_s`, and `calm_s`
                       since the last change: one rung up; never above the ceiling (host) or
                       the host's mode (game). Disk nearly full or no fresh vitals: no step up.
=====================  ==========================================================================

Only incidents after a scope's last change count toward its down triggers: those before it
were already acted on, so a storm still inside the window cannot walk a scope to the floor.
A game's effective mode is min(game mode, host mode) unless the game is pinned.

Per GPU (`GpuAttribution`, given when the supervisor knows which GPU each game runs on): GPU
memory pressure and temperature are the GPU's, so they step down the games placed on it, not
the host (CPU games and games on other GPUs are not touched; a hot GPU none of our games uses
steps nothing). A game moved to a calmer GPU (`gpumoves`) stays at its mode: the move acted on
the incidents before it, as a mode change does.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.gpu.vitals import GpuVitals

HOST = "*"


class IncidentKind(enum.StrEnum):
    HOST_REBOOT = "host_reboot"
    WORKER_CRASH = "worker_crash"
    WORKER_OOM = "worker_oom"  # the worker exited 76 (CUDA or host OOM it caught itself)
    KERNEL_OOM = "kernel_oom"  # the kernel's OOM killer, on the kernel's word
    WORKER_HANG = "worker_hang"


WORKER_FAILURES = frozenset(
    {
        IncidentKind.WORKER_CRASH,
        IncidentKind.WORKER_OOM,
        IncidentKind.KERNEL_OOM,
        IncidentKind.WORKER_HANG,
    }
)


@dataclass(frozen=True)
class Incident:
    ts: float
    kind: str
    game: str | None
    uptime_s: float | None = None
    """How long the worker had run when it failed (None: unknown)."""
    gpu: str | None = None
    """The UUID of the GPU the worker ran on, for a failure that is that GPU's (a CUDA OOM or
    a crash there; not a host-RAM OOM). None: not on a GPU, or unknown."""


@dataclass(frozen=True)
class Vitals:
    ts: float
    ram_available_pct: float
    swap_used_pct: float
    disk_free_pct: float
    gpus: tuple[GpuVitals, ...]
    cpu_pct: float = 0.0
    load_1m: float = 0.0


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    ceiling: str
    window_s: float = 3600.0
    """Incidents older than this are forgotten."""
    calm_s: float = 3600.0
    """No incident and no pressure this long (and this long since the last change): one rung up."""
    cooldown_s: float = 300.0
    """Minimum time between two changes of one scope."""
    min_ram_available_pct: float = 10.0
    max_gpu_temp_c: float = 85.0
    min_gpu_free_mb: float | None = 512.0
    """GPU memory 'near full'. None disables it (a caching allocator may hold a whole GPU)."""
    min_disk_free_pct: float = 5.0
    """Below this: no step up (a lighter mode does not free disk, so it is no down trigger)."""
    game_failures_to_step: int = 3
    reboots_to_step_host: int = 2
    kernel_ooms_to_step_host: int = 1
    host_failures_to_step: int = 3
    host_failing_games: int = 2
    early_oom_s: float = 120.0
    """A worker OOM within this many seconds of its start steps its game down at once."""
    vitals_max_age_s: float = 120.0
    """Older vitals are ignored: they can neither trigger a step down nor allow a step up."""

    def __post_init__(self) -> None:
        for name in ("window_s", "calm_s", "cooldown_s", "early_oom_s", "vitals_max_age_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "game_failures_to_step",
            "reboots_to_step_host",
            "kernel_ooms_to_step_host",
            "host_failures_to_step",
            "host_failing_games",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class ScopeState:
    scope: str
    """'*' for the whole host, or a game name."""
    mode: str
    pinned: bool
    last_change: float | None
    """When the scope's mode was last set (policy, operator or first start); persisted."""


@dataclass(frozen=True)
class GpuAttribution:
    """Which GPU each game runs on, for per-GPU attribution of GPU pressure."""

    placed: Mapping[str, str] = field(default_factory=dict)
    """Game → the UUID of the GPU its worker runs on (or ran on last). CPU games: absent."""
    moved_at: Mapping[str, float] = field(default_factory=dict)
    """Game → when it was last moved to another GPU: incidents before that were acted on."""
    moving: Mapping[str, str] = field(default_factory=dict)
    """Game → the move made this step: it stays at its mode (the move is the action)."""


@dataclass(frozen=True)
class Decision:
    scope: str
    action: str  # 'stay' | 'down' | 'up'
    from_mode: str
    to_mode: str
    causes: tuple[str, ...]


def incident_from_event(
    ts: float, kind: str, game: str | None, detail: Mapping[str, Any] | None
) -> Incident | None:
    """An `events` row as a policy incident (None: not an incident).

    A worker killed by the kernel's OOM killer is a kernel OOM only on the kernel's word: the
    daemon sets detail `{"kernel_oom": true}` when the kernel log or the cgroup's oom_kill
    counter says so, never for a SIGKILL merely because rlsup did not send it.
    `detail["uptime_s"]`, when present, lets an OOM right after start step its game down.
    `detail["gpu"]` (`{index, uuid}`) attributes it to that GPU, unless the worker said it ran
    out of host RAM (`error_kind` "host_oom").
    """
    detail = detail or {}
    if detail.get("kernel_oom") is True:
        kind = IncidentKind.KERNEL_OOM
    if kind not in set(IncidentKind):
        return None
    uptime = detail.get("uptime_s")
    gpu = detail.get("gpu")
    uuid = gpu.get("uuid") if isinstance(gpu, dict) else None
    gpus_own = kind != IncidentKind.KERNEL_OOM and detail.get("error_kind") != "host_oom"
    gpu_uuid = uuid if isinstance(uuid, str) and uuid and gpus_own else None
    return Incident(ts, str(kind), game, None if uptime is None else float(uptime), gpu_uuid)


# --- small helpers -------------------------------------------------------------------------


def rung(ladder: Sequence[str], mode: str) -> int:
    if mode not in ladder:
        raise ValueError(f"unknown mode {mode!r}; the ladder is {', '.join(ladder)}")
    return list(ladder).index(mode)


def lower_mode(ladder: Sequence[str], a: str, b: str) -> str:
    return a if rung(ladder, a) <= rung(ladder, b) else b


def effective_mode(ladder: Sequence[str], host: ScopeState, game: ScopeState) -> str:
    """The mode a game runs at: its own when pinned, else min(game mode, host mode)."""
    return game.mode if game.pinned else lower_mode(ladder, game.mode, host.mode)


def resume_mode(ladder: Sequence[str], persisted: str | None, initial: str, ceiling: str) -> str:
    """The mode to resume at after a restart or reboot: the one it had, never above the ceiling.

    The configured starting mode is used only when nothing (valid) was persisted: a host that
    was stepped down because it kept rebooting must not climb back by rebooting again.
    """
    mode = persisted if persisted in ladder else initial
    assert mode is not None
    return lower_mode(ladder, mode, ceiling)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f}s"


def _recent(
    incidents: Sequence[Incident], now: float, window_s: float, since: float | None
) -> list[Incident]:
    """Incidents inside the window and after `since` (the scope's last change)."""
    floor = now - window_s if since is None else max(now - window_s, since)
    return [i for i in incidents if i.ts > floor]


def _is_early_oom(incident: Incident, cfg: PolicyConfig) -> bool:
    return (
        incident.kind == IncidentKind.WORKER_OOM
        and incident.uptime_s is not None
        and incident.uptime_s <= cfg.early_oom_s
    )


def _fresh(vitals: Vitals | None, cfg: PolicyConfig, now: float) -> Vitals | None:
    if vitals is None or now - vitals.ts > cfg.vitals_max_age_s:
        return None
    return vitals


# --- triggers: each returns human-readable causes ------------------------------------------


def gpu_pressure_causes(gpu: GpuVitals, cfg: PolicyConfig) -> list[str]:
    """One GPU's pressure: free memory near none, temperature over the limit."""
    causes = []
    if cfg.min_gpu_free_mb is not None and gpu.mem_free_mb < cfg.min_gpu_free_mb:
        causes.append(
            f"GPU {gpu.index} free memory {gpu.mem_free_mb:.0f} MB < {cfg.min_gpu_free_mb:.0f} MB"
        )
    if gpu_hot(gpu, cfg):
        causes.append(f"GPU {gpu.index} temperature {gpu.temp_c:.0f}C > {cfg.max_gpu_temp_c:.0f}C")
    return causes


def gpu_hot(gpu: GpuVitals, cfg: PolicyConfig) -> bool:
    return not math.isnan(gpu.temp_c) and gpu.temp_c > cfg.max_gpu_temp_c


def pressure_causes(vitals: Vitals | None, cfg: PolicyConfig, per_gpu: bool = False) -> list[str]:
    """Pressure before failure: RAM, and (unless `per_gpu`: then it is each GPU's games')
    GPU memory and temperature."""
    if vitals is None:
        return []
    causes = []
    if vitals.ram_available_pct < cfg.min_ram_available_pct:
        causes.append(
            f"RAM available {vitals.ram_available_pct:.0f}% < {cfg.min_ram_available_pct:.0f}%"
        )
    if not per_gpu:
        for gpu in vitals.gpus:
            causes += gpu_pressure_causes(gpu, cfg)
    return causes


def placed_gpu_causes(
    game: str, vitals: Vitals | None, gpus: GpuAttribution | None, cfg: PolicyConfig
) -> list[str]:
    """The pressure of the GPU the game is placed on (per-GPU attribution only)."""
    uuid = gpus.placed.get(game) if gpus is not None else None
    if vitals is None or uuid is None:
        return []
    reading = next((g for g in vitals.gpus if g.uuid == uuid), None)
    if reading is None:
        return []
    return [f"{c} ({game} runs there)" for c in gpu_pressure_causes(reading, cfg)]


def _failures_by_game(incidents: Sequence[Incident]) -> Counter[str]:
    return Counter(i.game or "?" for i in incidents if i.kind in WORKER_FAILURES)


def spread_failures_cause(incidents: Sequence[Incident], cfg: PolicyConfig) -> str | None:
    """Failures spread over several games: a host problem, not one game's."""
    by_game = _failures_by_game(incidents)
    total = sum(by_game.values())
    if len(by_game) >= cfg.host_failing_games and total >= cfg.host_failures_to_step:
        games = ", ".join(f"{g}×{n}" for g, n in sorted(by_game.items()))
        span = _fmt_s(cfg.window_s)
        return f"{total} worker failures over {len(by_game)} games in {span} ({games})"
    return None


def host_down_causes(
    incidents: Sequence[Incident], vitals: Vitals | None, cfg: PolicyConfig, per_gpu: bool = False
) -> list[str]:
    """Why the host should step down, from incidents already filtered to this scope."""
    causes = []
    reboots = sum(1 for i in incidents if i.kind == IncidentKind.HOST_REBOOT)
    if reboots >= cfg.reboots_to_step_host:
        causes.append(f"{reboots} unexpected reboots in {_fmt_s(cfg.window_s)}")
    kernel_ooms = [i for i in incidents if i.kind == IncidentKind.KERNEL_OOM]
    if len(kernel_ooms) >= cfg.kernel_ooms_to_step_host:
        games = ", ".join(sorted({i.game or "?" for i in kernel_ooms}))
        causes.append(f"{len(kernel_ooms)} kernel OOM kills in {_fmt_s(cfg.window_s)} ({games})")
    spread = spread_failures_cause(incidents, cfg)
    if spread:
        causes.append(spread)
    return causes + pressure_causes(vitals, cfg, per_gpu)


def game_down_causes(
    game: str, incidents: Sequence[Incident], spread: bool, cfg: PolicyConfig
) -> list[str]:
    """Why one game should step down alone, from incidents already filtered to its scope."""
    mine = [i for i in incidents if i.game == game and i.kind in WORKER_FAILURES]
    causes = []
    early = [i for i in mine if _is_early_oom(i, cfg)]
    if early:
        causes.append(
            f"{game} hit OOM {early[-1].uptime_s:.0f}s after start (exit 76): not retrying"
            " at the same size"
        )
    if not spread and len(mine) >= cfg.game_failures_to_step:
        kinds = ", ".join(f"{k}×{n}" for k, n in sorted(Counter(i.kind for i in mine).items()))
        causes.append(f"{game} failed {len(mine)} times in {_fmt_s(cfg.window_s)} ({kinds})")
    return causes


# --- the step itself -----------------------------------------------------------------------


def _stay(state: ScopeState, causes: Sequence[str]) -> Decision:
    return Decision(state.scope, "stay", state.mode, state.mode, tuple(causes))


def _step_down(
    ladder: Sequence[str],
    state: ScopeState,
    current: str,
    causes: list[str],
    now: float,
    cfg: PolicyConfig,
    bypass_cooldown: bool = False,
) -> Decision:
    """Step one rung below `current` (the scope's effective mode), unless cooling down or at
    the floor."""
    idx = rung(ladder, current)
    if idx == 0:
        return _stay(state, [*causes, f"at the lowest mode ({current}): cannot step down"])
    since = None if state.last_change is None else now - state.last_change
    if since is not None and since < cfg.cooldown_s and not bypass_cooldown:
        return _stay(
            state,
            [*causes, f"cooldown: last change {_fmt_s(since)} ago < {_fmt_s(cfg.cooldown_s)}"],
        )
    return Decision(state.scope, "down", state.mode, ladder[idx - 1], tuple(causes))


def _calm_causes(
    state: ScopeState, incidents: Sequence[Incident], now: float, cfg: PolicyConfig
) -> list[str]:
    """Why the scope is NOT calm yet (empty: calm). `incidents` are the scope's own."""
    if state.last_change is None:
        return ["no change recorded: the calm clock starts when a mode is set"]
    since_change = now - state.last_change
    if since_change < cfg.calm_s:
        return [f"last change {_fmt_s(since_change)} ago < calm {_fmt_s(cfg.calm_s)}"]
    calm_from = now - min(cfg.calm_s, cfg.window_s)
    recent = [i for i in incidents if i.ts > calm_from]
    if recent:
        last = max(recent, key=lambda i: i.ts)
        who = f" ({last.game})" if last.game else ""
        return [f"{last.kind}{who} {_fmt_s(now - last.ts)} ago < calm {_fmt_s(cfg.calm_s)}"]
    return []


def _step_up(
    ladder: Sequence[str],
    state: ScopeState,
    current: str,
    limit: str,
    blockers: list[str],
    calm: str,
) -> Decision:
    """One rung above `current` (the scope's effective mode), never above `limit`."""
    if blockers:
        return _stay(state, blockers)
    idx = rung(ladder, current)
    if idx >= rung(ladder, limit):
        return _stay(state, [calm, f"at the upper limit ({limit})"])
    return Decision(state.scope, "up", state.mode, ladder[idx + 1], (calm,))


def decide_host(
    ladder: Sequence[str],
    host: ScopeState,
    incidents: Sequence[Incident],
    vitals: Vitals | None,
    cfg: PolicyConfig,
    now: float,
    per_gpu: bool = False,
) -> Decision:
    if host.pinned:
        return _stay(host, ["pinned"])
    if rung(ladder, host.mode) > rung(ladder, cfg.ceiling):
        return Decision(
            HOST, "down", host.mode, cfg.ceiling, (f"above the ceiling ({cfg.ceiling})",)
        )
    fresh = _fresh(vitals, cfg, now)
    scoped = _recent(incidents, now, cfg.window_s, host.last_change)
    causes = host_down_causes(scoped, fresh, cfg, per_gpu)
    if causes:
        return _step_down(ladder, host, host.mode, causes, now, cfg)
    blockers = _calm_causes(host, _recent(incidents, now, cfg.window_s, None), now, cfg)
    if fresh is None:
        blockers.append("no fresh vitals sample")
    elif fresh.disk_free_pct < cfg.min_disk_free_pct:
        blockers.append(f"disk free {fresh.disk_free_pct:.0f}% < {cfg.min_disk_free_pct:.0f}%")
    calm = f"calm: no incident or pressure for {_fmt_s(cfg.calm_s)}"
    return _step_up(ladder, host, host.mode, cfg.ceiling, blockers, calm)


def decide_game(
    ladder: Sequence[str],
    game: ScopeState,
    host: ScopeState,
    incidents: Sequence[Incident],
    spread: bool,
    cfg: PolicyConfig,
    now: float,
    vitals: Vitals | None = None,
    gpus: GpuAttribution | None = None,
) -> Decision:
    """`vitals` and `gpus`: the pressure of the game's own GPU (per-GPU attribution only)."""
    if game.pinned:
        return _stay(game, ["pinned"])
    if gpus is not None and game.scope in gpus.moving:
        return _stay(game, [gpus.moving[game.scope]])
    current = effective_mode(ladder, host, game)
    moved = gpus.moved_at.get(game.scope) if gpus is not None else None
    since = game.last_change if moved is None else max(moved, game.last_change or moved)
    scoped = _recent(incidents, now, cfg.window_s, since)
    causes = game_down_causes(game.scope, scoped, spread, cfg)
    causes += placed_gpu_causes(game.scope, _fresh(vitals, cfg, now), gpus, cfg)
    if causes:
        new_early_oom = any(_is_early_oom(i, cfg) and i.game == game.scope for i in scoped)
        return _step_down(ladder, game, current, causes, now, cfg, bypass_cooldown=new_early_oom)
    mine = [i for i in _recent(incidents, now, cfg.window_s, None) if i.game == game.scope]
    if rung(ladder, game.mode) >= rung(ladder, host.mode):
        return _stay(game, [f"follows the host mode ({host.mode})"])
    calm = f"calm: no incident of {game.scope} for {_fmt_s(cfg.calm_s)}"
    return _step_up(ladder, game, current, host.mode, _calm_causes(game, mine, now, cfg), calm)


def decide(
    ladder: Sequence[str],
    scopes: Sequence[ScopeState],
    incidents: Sequence[Incident],
    vitals: Vitals | None,
    cfg: PolicyConfig,
    now: float,
    gpus: GpuAttribution | None = None,
) -> list[Decision]:
    """One decision per scope, in the order given; every decision names its causes.

    `scopes` should hold the host scope '*' (without it, games are judged against the
    ceiling as the host mode). `gpus`: per-GPU attribution (None: GPU pressure is the
    host's). Raises ValueError for a mode or ceiling not on the ladder.
    """
    rung(ladder, cfg.ceiling)
    host = next((s for s in scopes if s.scope == HOST), ScopeState(HOST, cfg.ceiling, True, None))
    host_scoped = _recent(incidents, now, cfg.window_s, host.last_change)
    # Spread failures are the host's to act on; a pinned host leaves them to the games.
    spread = not host.pinned and spread_failures_cause(host_scoped, cfg) is not None
    out = []
    for state in scopes:
        if state.scope == HOST:
            out.append(decide_host(ladder, state, incidents, vitals, cfg, now, gpus is not None))
        else:
            out.append(decide_game(ladder, state, host, incidents, spread, cfg, now, vitals, gpus))
    return out
