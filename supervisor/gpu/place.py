"""Which GPU a game's worker gets: pure functions, no NVML (they read a snapshot's GPUs).

Visibility (`visible`): the supervisor's own `CUDA_VISIBLE_DEVICES`, read as CUDA reads it,
mapped onto NVML's GPUs. Unset: every GPU. Empty: none. Otherwise a comma-separated list of
entries, each an index (NVML's order, which is CUDA's with `CUDA_DEVICE_ORDER=PCI_BUS_ID`;
name GPUs by UUID to be independent of that order) or a UUID or a unique UUID prefix
(`GPU-8f1a`). As in CUDA, the list ends at the first entry that names no GPU (an unknown or
ambiguous entry, an index out of range, a `MIG-` device), and a GPU named twice ends it too.

Placement (`place`): a game may use the visible GPUs its `games.gpu` allows ("auto": all;
`N` / `[N, M]`: positions in the visible list, so `gpu = 0` is the first GPU the supervisor
may use). Among those that are readable (not lost) and fit the game's need once the
reservations of games placed there lately are counted, it takes the one with the fewest games
placed on it (games are spread: they compete for its compute, not only its memory), then the
one with the most free memory. When none fits, the roomiest one is still chosen (the gate then
waits on it and, past its timeout, starts one rung lower). GPUs the game was moved off lately
(`avoid`: it ran hot or out of memory there) are left out while another readable one is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuId:
    """A GPU as NVML names it: its index and its UUID."""

    index: int
    uuid: str

    def as_json(self) -> dict[str, int | str]:
        return {"index": self.index, "uuid": self.uuid}


def visible(spec: str | None, gpus: Sequence[GpuId]) -> list[GpuId]:
    """The GPUs `CUDA_VISIBLE_DEVICES=spec` makes visible, in the order CUDA numbers them."""
    if spec is None:
        return sorted(gpus, key=lambda g: g.index)
    out: list[GpuId] = []
    for raw in spec.split(","):
        gpu = _resolve(raw.strip(), gpus)
        if gpu is None or gpu in out:
            break
        out.append(gpu)
    return out


def _resolve(entry: str, gpus: Sequence[GpuId]) -> GpuId | None:
    if entry.isdigit():
        return next((g for g in gpus if g.index == int(entry)), None)
    if not entry.startswith("GPU-"):
        return None  # "", "MIG-…", garbage: CUDA stops here
    matches = [g for g in gpus if g.uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


@dataclass(frozen=True)
class Slot:
    """A visible GPU as placement sees it."""

    gpu: GpuId
    free_mb: float | None  # None: not readable now (lost, or missing from the reading)
    reserved_mb: float = 0.0  # held for games placed there whose memory NVML may not show yet
    games: int = 0  # games placed there now

    @property
    def room_mb(self) -> float:
        return (self.free_mb or 0.0) - self.reserved_mb


@dataclass(frozen=True)
class Placement:
    gpu: GpuId | None  # None: no usable GPU; the game waits
    fits: bool
    reason: str


def allowed(slots: Sequence[Slot], choice: tuple[int, ...] | None) -> tuple[list[Slot], str]:
    """The slots `games.gpu` allows (None = "auto": all), and what is wrong when some are
    named that are not visible."""
    if choice is None:
        return list(slots), ""
    out = [slots[i] for i in choice if i < len(slots)]
    missing = [i for i in choice if i >= len(slots)]
    why = ""
    if missing:
        names = ", ".join(map(str, missing))
        why = f"games.gpu names visible GPU {names} but {len(slots)} GPU(s) are visible"
    return out, why


def place(
    slots: Sequence[Slot],
    choice: tuple[int, ...] | None,
    need_mb: float,
    avoid: frozenset[str] = frozenset(),
) -> Placement:
    """The GPU for a game needing `need_mb` free, among `slots` (the visible GPUs, in CUDA's
    order) as `choice` (`games.gpu`; None = auto) allows, avoiding the UUIDs in `avoid` while
    another readable GPU is allowed."""
    candidates, why = allowed(slots, choice)
    others = [s for s in candidates if s.gpu.uuid not in avoid]
    if any(s.free_mb is not None for s in others):
        candidates = others
    readable = [s for s in candidates if s.free_mb is not None]
    if not readable:
        lost = [s for s in candidates if s.free_mb is None]
        detail = why or (
            f"GPU {', '.join(str(s.gpu.index) for s in lost)} not readable (lost?)"
            if lost
            else "no visible GPU"
        )
        return Placement(None, False, f"no usable GPU: {detail}")
    best = max(readable, key=lambda s: (s.room_mb >= need_mb, -s.games, s.room_mb, -s.gpu.index))
    fits = best.room_mb >= need_mb
    cmp = ">=" if fits else "<"
    reason = (
        f"GPU {best.gpu.index} ({best.gpu.uuid}): {best.room_mb:.0f} MB free after "
        f"reservations {cmp} {need_mb:.0f} MB needed; {best.games} game(s) there"
    )
    return Placement(best.gpu, fits, reason if not why else f"{reason}; {why}")
