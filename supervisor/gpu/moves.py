"""A move of a game to a calmer GPU, as records: the game as placed, its last move, the move.

The stability policy decides the moves (`stability/gpumoves.py`: which game's GPU is the
trouble, which GPU is calm); the supervisor carries one out: it stops the worker with a
checkpoint (when it still runs), the GpuPlacer places it again avoiding the GPU it left, and
`gpu_moved` is recorded; the policy then leaves its mode alone (`stability.GpuAttribution`).
CPU games are never here: only games placed on a GPU are moved.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.gpu.place import GpuId


@dataclass(frozen=True)
class PlacedGame:
    """A game on a GPU, as the move decision sees it."""

    game: str
    gpu: GpuId
    """The GPU its worker runs on (or ran on last, when it failed)."""
    need_mb: float
    """Free memory it needs on a GPU to start."""
    allowed: tuple[GpuId, ...]
    """The visible GPUs its `games.gpu` allows."""
    since: float | None = None
    """Its mode's last change: OOMs before it were already acted on."""


@dataclass(frozen=True)
class LastMove:
    ts: float
    from_uuid: str


@dataclass(frozen=True)
class GpuMove:
    game: str
    from_gpu: GpuId
    to_gpu: GpuId
    causes: tuple[str, ...]

    def detail(self) -> dict[str, object]:
        """Its `gpu_moved` event's detail."""
        return {"from": self.from_gpu.as_json(), "to": self.to_gpu.as_json(),
                "causes": list(self.causes)}  # fmt: skip
