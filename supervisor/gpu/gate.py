"""The GPU memory gate: a CUDA worker starts only when the GPU's free memory covers its need.

A non-blocking state machine for the tick loop (which never sleeps in here): each tick calls
`check(game, need_mb, now)` for every CUDA worker that wants to (re)start and gets

- 'start':    enough free memory (or no NVIDIA driver: the gate is a no-op);
- 'wait':     not enough; ask again next tick (NVML is read at most every `poll_s` per game);
- 'fallback': still short after `timeout_s`: start one rung lower now, and record the reason.
              At the lowest rung there is nothing lower, so the gate keeps answering 'wait'.

'start' and 'fallback' end the wait. A game told 'start' holds a reservation of its need for
`reserve_s` on its GPU, so two workers cleared in the same tick do not both count the same free
memory (the race in which the second one hits OOM in its first optimizer step). `now` is
`time.monotonic()`: waits never outlive the process.

Which GPU a game waits on is placement's choice (`gpuplace`), made again every tick while it
waits; `free_mb` is the vitals sampler's last reading of that GPU (`gpus.NvmlProbe`): the tick
loop never calls NVML itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_CONF_DEFAULT = "expandable_segments:True"

Action = Literal["start", "wait", "fallback"]


class NvmlLike(Protocol):
    """The seam: `gpus.NvmlProbe` in production (its last snapshot), a fake in tests."""

    def free_mb(self, index: int) -> float | None:
        """Free memory of GPU `index` (NVML's index) in MB; None when there is no driver (or
        no such GPU)."""
        ...


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    min_free_mb: float = 2048.0
    """Need of a game with no observed peak yet (`gpu.min_free_mb`)."""
    poll_s: float = 30.0
    timeout_s: float = 7200.0
    margin_pct: float = 20.0
    """Added to an observed peak: peak + max(margin_pct% of it, margin_min_mb)."""
    margin_min_mb: float = 512.0
    """At least this much margin (covers the CUDA context, which the allocator's peak omits)."""
    reserve_s: float = 120.0
    """How long a started worker's need is held back from the free memory others see."""


@dataclass(frozen=True)
class GateResult:
    action: Action
    free_mb: float | None
    need_mb: float
    waited_s: float
    reason: str
    event: dict[str, Any] | None = None  # from admit(): a `gpu_wait` event to record


@dataclass(frozen=True)
class _Wait:
    since: float
    polled_at: float
    free_mb: float
    index: int


def need_mb(cfg: GateConfig, observed_peak_mb: float | None) -> float:
    """What a worker needs free before it starts.

    `observed_peak_mb`: the game's last heartbeat `gpu_mem_mb` at the same mode (sizes), or
    None when unknown; then the configured `min_free_mb`.
    """
    if observed_peak_mb is None or observed_peak_mb <= 0:
        return cfg.min_free_mb
    return observed_peak_mb + max(observed_peak_mb * cfg.margin_pct / 100.0, cfg.margin_min_mb)


def worker_env(base_env: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment: expandable segments (less fragmentation) unless the operator
    already chose an allocator configuration."""
    env = dict(base_env)
    env.setdefault(ALLOC_CONF, ALLOC_CONF_DEFAULT)
    return env


class GpuGate:
    def __init__(self, nvml: NvmlLike, cfg: GateConfig) -> None:
        self.nvml = nvml
        self.cfg = cfg
        self._waits: dict[str, _Wait] = {}
        self._reserved: dict[str, tuple[float, float, int]] = {}  # game → (mb, until, GPU)

    def check(
        self, game: str, need_mb: float, now: float, index: int = 0, at_floor: bool = False
    ) -> GateResult:
        """Where `game`'s wait stands. `at_floor`: the game is at the lowest rung already."""
        wait = self._poll(game, index, now)
        if wait is None:
            return self._start(
                game, need_mb, now, None, 0.0, "no NVIDIA driver: gate is a no-op", index
            )
        waited_s = now - wait.since
        free = wait.free_mb - self.reserved_mb(index, now, but=game)
        if free >= need_mb:
            reason = f"GPU {index}: {free:.0f} MB free >= {need_mb:.0f} MB needed"
            return self._start(game, need_mb, now, free, waited_s, reason, index)
        short = f"GPU {index}: {free:.0f} MB free < {need_mb:.0f} MB needed"
        if waited_s < self.cfg.timeout_s:
            return GateResult("wait", free, need_mb, waited_s, f"{short}; waited {waited_s:.0f}s")
        timed_out = f"{short} after {waited_s:.0f}s (timeout {self.cfg.timeout_s:.0f}s)"
        if at_floor:
            return GateResult(
                "wait", free, need_mb, waited_s, f"{timed_out}; at the lowest mode: waiting on"
            )
        self._waits.pop(game, None)
        return GateResult(
            "fallback", free, need_mb, waited_s, f"{timed_out}: starting one mode lower"
        )

    def admit(
        self,
        game: str,
        mode: str,
        lighter: str | None,
        *,
        pinned: bool,
        peak_mb: float | None,
        now: float,
        index: int = 0,
    ) -> GateResult:
        """`check` for a game at `mode` (`lighter`: the rung below, if any; `pinned`: no
        automatic fallback; `index`: the GPU placement chose), with what the loop records:
        `event`, the `gpu_wait` detail to write when a wait starts or times out (None
        otherwise). The gate alone knows whether a game is waiting."""
        waiting = self.waiting(game)
        need = need_mb(self.cfg, peak_mb)
        result = self.check(game, need, now, index, at_floor=not lighter or pinned)
        detail: dict[str, Any] = {
            "reason": result.reason,
            "free_mb": None if result.free_mb is None else round(result.free_mb),
            "need_mb": round(result.need_mb),
        }
        if result.action == "wait" and not waiting:
            return replace(result, event={**detail, "mode": mode})
        if result.action == "fallback":
            return replace(result, event={"timed_out": True, **detail, "from": mode, "to": lighter})
        return result

    def waiting(self, game: str) -> bool:
        return game in self._waits

    def clear(self, game: str) -> None:
        """Forget `game`'s wait and reservation (stopped, mode changed, or now running)."""
        self._waits.pop(game, None)
        self._reserved.pop(game, None)

    def _poll(self, game: str, index: int, now: float) -> _Wait | None:
        """The game's wait, with NVML re-read if `poll_s` has passed; None without a driver."""
        wait = self._waits.get(game)
        if wait is not None and wait.index == index and now - wait.polled_at < self.cfg.poll_s:
            return wait
        free = self.nvml.free_mb(index)
        if free is None:
            self._waits.pop(game, None)
            return None
        wait = _Wait(now if wait is None else wait.since, now, free, index)
        self._waits[game] = wait
        return wait

    def reserved_mb(self, index: int, now: float, but: str | None = None) -> float:
        """Memory held on GPU `index` for games started there lately (all but `but`)."""
        live = {g: r for g, r in self._reserved.items() if r[1] > now}
        self._reserved = live
        return sum(mb for g, (mb, _, i) in live.items() if g != but and i == index)

    def _start(
        self,
        game: str,
        need: float,
        now: float,
        free: float | None,
        waited_s: float,
        reason: str,
        index: int,
    ) -> GateResult:
        self._waits.pop(game, None)
        if free is not None:
            self._reserved[game] = (need, now + self.cfg.reserve_s, index)
        return GateResult("start", free, need, waited_s, reason)
