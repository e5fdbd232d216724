"""The GPU move decision, pure: which games leave their GPU for a calmer one, and why.

A game whose GPU is the trouble (it runs over `max_gpu_temp_c`, or the game ran out of memory
on it since its last change or move) moves to another GPU it may use that is calm: readable,
not over the temperature limit, no incident there within the window, not one this game was
moved off within `cooldown_s`, and with free memory for the game's need. The records it reads
and returns (`PlacedGame`, `LastMove`, `GpuMove`) are the GPUs' (`gpu/moves.py`): the policy
decides, the GpuPlacer moves.

No move, and the stability policy steps the mode down as before, when no GPU is calmer or the
game was already moved within `cooldown_s` (no ping-pong between two troubled GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from supervisor.gpu.moves import GpuMove, LastMove, PlacedGame
from supervisor.gpu.place import GpuId
from supervisor.gpu.vitals import GpuVitals
from supervisor.stability.policy import (
    WORKER_FAILURES,
    Incident,
    IncidentKind,
    PolicyConfig,
    gpu_hot,
)


def trouble(
    placed: PlacedGame,
    reading: GpuVitals | None,
    incidents: Sequence[Incident],
    last_move: LastMove | None,
    cfg: PolicyConfig,
    now: float,
) -> list[str]:
    """Why the game's own GPU is the trouble (empty: it is not)."""
    causes = []
    if reading is not None and gpu_hot(reading, cfg):
        causes.append(
            f"GPU {reading.index} temperature {reading.temp_c:.0f}C > {cfg.max_gpu_temp_c:.0f}C"
        )
    floors = [now - cfg.window_s, placed.since, last_move.ts if last_move else None]
    floor = max(f for f in floors if f is not None)
    ooms = [
        i
        for i in incidents
        if i.kind == IncidentKind.WORKER_OOM
        and i.game == placed.game
        and i.gpu == placed.gpu.uuid
        and i.ts > floor
    ]
    if ooms:
        causes.append(f"{placed.game} ran out of memory on GPU {placed.gpu.index} ×{len(ooms)}")
    return causes


def calm(
    gpu: GpuVitals, placed: PlacedGame, incidents: Sequence[Incident], cfg: PolicyConfig, now: float
) -> bool:
    """May the game move to `gpu`: another GPU, not hot, no failure there within the window,
    free memory for its need."""
    if gpu.uuid == placed.gpu.uuid or gpu_hot(gpu, cfg):
        return False
    troubled = any(
        i.gpu == gpu.uuid and i.kind in WORKER_FAILURES and i.ts > now - cfg.window_s
        for i in incidents
    )
    return not troubled and gpu.mem_free_mb >= placed.need_mb


def decide_moves(
    games: Sequence[PlacedGame],
    readings: Sequence[GpuVitals],
    incidents: Sequence[Incident],
    last_moves: Mapping[str, LastMove],
    cfg: PolicyConfig,
    now: float,
) -> list[GpuMove]:
    """The moves to make now. `readings`: the GPUs' latest fresh reading (empty when stale);
    `last_moves`: each game's last `gpu_moved` (any age; its GPU is avoided for `cooldown_s`)."""
    by_uuid = {g.uuid: g for g in readings if g.uuid}
    load: dict[str, int] = {}
    for p in games:
        load[p.gpu.uuid] = load.get(p.gpu.uuid, 0) + 1
    moves = []
    for p in games:
        last = last_moves.get(p.game)
        causes = trouble(p, by_uuid.get(p.gpu.uuid), incidents, last, cfg, now)
        if not causes or (last is not None and now - last.ts < cfg.cooldown_s):
            continue  # moved lately: its mode steps down instead (no ping-pong)
        calmer = [
            by_uuid[g.uuid]
            for g in p.allowed
            if g.uuid in by_uuid and calm(by_uuid[g.uuid], p, incidents, cfg, now)
        ]
        if not calmer:
            continue
        best = min(calmer, key=lambda g: (load.get(g.uuid, 0), -g.mem_free_mb, g.index))
        to = GpuId(best.index, best.uuid)
        load[p.gpu.uuid] -= 1
        load[to.uuid] = load.get(to.uuid, 0) + 1
        moves.append(GpuMove(p.game, p.gpu, to, (*causes, f"GPU {to.index} is calm")))
    return moves
