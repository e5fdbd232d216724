"""Which game is on which GPU of this host: one owner for placement, the memory gate, lost GPUs,
moves off an unstable GPU and the GPUs a game avoids after a move.

The daemon asks and applies: `admit` says whether a game may start now (and on which GPU, or
one rung lower, or never here), `watch` which games must leave a lost GPU, `move` whether a
worker must stop to leave one, `gone` releases a game's GPU when its worker is gone. Every
reading is of the sampler's last NVML snapshot: the tick never calls NVML.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from supervisor.config import Config, GameSpec, ModeSpec
from supervisor.gpu import devices
from supervisor.gpu import place as gpuplace
from supervisor.gpu.gate import GateConfig, GpuGate, NvmlLike, need_mb
from supervisor.gpu.moves import GpuMove, PlacedGame
from supervisor.gpu.nvml import GpuSnapshot, NvmlProbe
from supervisor.gpu.place import GpuId
from supervisor.ledger import db

log = structlog.get_logger("rlsup.supervisor")

CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
Record = Callable[[str, str | None, dict[str, Any]], None]


def gate_config(cfg: Config) -> GateConfig:
    return GateConfig(
        min_free_mb=cfg.gpu.min_free_mb, poll_s=cfg.gpu.poll_s, timeout_s=cfg.gpu.timeout_s
    )


def cuda_visible_for(gpu: GpuId) -> str:
    """A worker's CUDA_VISIBLE_DEVICES: its GPU's UUID (inside, that GPU is cuda:0), or the
    index when NVML could not read the UUID."""
    return gpu.uuid or str(gpu.index)


@dataclass(frozen=True)
class Admission:
    """The gate's answer for one game: start (`ok`), on `gpu`; `fallback`: start one rung
    lower (the mode to put in force first); `never`: why it can never start on this host."""

    ok: bool
    gpu: GpuId | None = None
    fallback: ModeSpec | None = None
    never: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class GameAsk:
    """What the placer needs to know of a game: its spec, its mode now, the mode one rung
    lower, whether its mode is pinned, and its peak GPU memory at this mode's sizes."""

    spec: GameSpec
    mode: ModeSpec
    lighter: ModeSpec | None
    pinned: bool
    peak_mb: float | None


class GpuPlacer:
    def __init__(
        self,
        cfg: Config,
        probe: NvmlLike,
        *,
        record: Record,
        steady: Callable[[], float],
        visible: str | None,
        local: bool,
    ) -> None:
        self.cfg = cfg
        self.gate = GpuGate(probe, gate_config(cfg))
        # The NVML snapshots where the probe is NVML's; a bare free-memory probe gives the
        # gate alone, on GPU 0 (no placement).
        self.nvml = probe if isinstance(probe, NvmlProbe) else None
        self.record, self.steady = record, steady
        self.local = local  # several hosts: Ray's num_gpus places GPU games, not this
        self.cuda_visible = visible  # the supervisor's own CUDA_VISIBLE_DEVICES
        self.placed: dict[str, GpuId] = {}  # game → the GPU of its current worker
        self.chosen: dict[str, GpuId] = {}  # placed by the gate this tick, not spawned yet
        self.last: dict[str, GpuId] = {}  # game → the GPU its previous worker had
        self.waiting: dict[str, str] = {}  # game → why no GPU (its gpu_wait written)
        self.lost: set[str] = set()  # UUIDs reported lost (gpu_lost written)
        self.avoid: dict[str, dict[str, float]] = {}  # game → UUID moved off → until (steady)
        self.driver_up: bool | None = None  # NVML answered at the last snapshot seen
        # The auto games that will train on the CPU (device_fallback), for the config read.
        self._cpu_fallback: tuple[Config | None, frozenset[str]] = (None, frozenset())

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg
        self.gate.cfg = gate_config(cfg)

    def snapshot(self) -> GpuSnapshot | None:
        return self.nvml.latest() if self.nvml is not None else None

    # ---- a game's worker: may it start, where; its GPU gone --------------------------------

    def admit(self, ask: GameAsk, now: float) -> Admission:
        """May this game's worker start now? CPU games always; CUDA (or auto) games once a
        GPU is placed for them and its free memory covers their need, or past gpu.timeout_s
        one rung lower (the gate)."""
        spec = ask.spec
        if spec.device == "cpu" or not self.local:
            return Admission(True)
        if self.trains_on_cpu(spec.name):
            return Admission(True)  # auto with a CPU-only torch: no GPU to wait for
        if (never := self._cuda_never_here(spec)) is not None:
            return Admission(False, never=never)
        placed, gpu = self._place(spec, need_mb(self.gate.cfg, ask.peak_mb), now)
        if not placed:
            return Admission(False)
        result = self.gate.admit(
            spec.name,
            ask.mode.name,
            ask.lighter.name if ask.lighter else None,
            pinned=ask.pinned,
            peak_mb=ask.peak_mb,
            now=now,
            index=gpu.index if gpu else 0,
        )
        if result.event is not None:
            gpu_json = gpu.as_json() if gpu else None
            self.record("gpu_wait", spec.name, {**result.event, "gpu": gpu_json})
        if result.action == "wait":
            return Admission(False)
        if result.action == "start" and result.waited_s > 0:
            log.info("gpu_ready", game=spec.name, reason=result.reason)
        if gpu is not None:
            self.chosen[spec.name] = gpu
        fallback = ask.lighter if result.action == "fallback" else None
        return Admission(True, gpu, fallback, reason=result.reason)

    def defer(self, names: Iterable[str]) -> None:
        """Games admitted this tick that will not be spawned in it: placed afresh next tick."""
        for name in names:
            self.chosen.pop(name, None)

    def env_for(self, name: str) -> dict[str, str] | None:
        """The environment of the game's new worker: the GPU chosen for it, if any."""
        gpu = self.chosen.get(name)
        return {CUDA_VISIBLE: cuda_visible_for(gpu)} if gpu is not None else None

    def assign(self, name: str) -> dict[str, Any]:
        """The new worker started: the GPU chosen for it is its own. `gpu_assigned` says
        where (`moved_from` when it changed); returns the detail for its worker_start."""
        gpu = self.chosen.pop(name, None)
        if gpu is None:
            return {}
        self.placed[name] = gpu
        before = self.last.get(name)
        detail: dict[str, Any] = {**gpu.as_json(), CUDA_VISIBLE: cuda_visible_for(gpu)}
        if before is not None and before != gpu:
            detail["moved_from"] = before.as_json()
        self.record("gpu_assigned", name, detail)
        return {"gpu": gpu.as_json()}

    def unassign(self, name: str) -> None:
        """The spawn failed: the GPU chosen is free again, and so is the memory the gate held
        for the worker that never started (else the others count it until `reserve_s`)."""
        self.chosen.pop(name, None)
        self.gate.clear(name)

    def gone(self, name: str) -> None:
        """The game's worker is gone or its wait abandoned: its GPU and reservation free."""
        self.gate.clear(name)
        if (gpu := self.placed.pop(name, None)) is not None:
            self.last[name] = gpu
        self.waiting.pop(name, None)

    def seen_memory(self, name: str) -> None:
        """The worker reported its GPU memory: NVML sees it now, the reservation can go."""
        self.gate.clear(name)

    def on_gpu(self, name: str) -> dict[str, Any]:
        """The GPU of the game's worker, for its events: OOMs and crashes per GPU."""
        gpu = self.placed.get(name)
        return {"gpu": gpu.as_json()} if gpu else {}

    def row_gpu(self, name: str) -> str | None:
        gpu = self.placed.get(name)
        return json.dumps(gpu.as_json()) if gpu else None

    # ---- CPU fallbacks and games that can never start here ---------------------------------

    def cpu_fallbacks(self) -> list[tuple[str, dict[str, Any]]]:
        """The auto games that will train on the CPU of this host (its torch is CPU-only, its
        NVIDIA driver unused), with their `device_fallback` detail; remembered for this
        configuration (reads torch's metadata: not once a tick). None on several hosts."""
        if not self.local:
            return []
        warnings = devices.cpu_fallback_warnings(self.cfg.games)
        self._cpu_fallback = (self.cfg, frozenset(name for name, _ in warnings))
        return warnings

    def starts_placed(self, spec: GameSpec) -> bool:
        """Will this game's worker start placed on a GPU (its own CUDA_VISIBLE_DEVICES, so
        always cold: a spare warmed before the placement cannot take it)? A CUDA (or auto)
        game where NVML answers and sees a visible GPU. Command games never are."""
        if spec.command is not None or spec.device == "cpu" or self.trains_on_cpu(spec.name):
            return False
        snap = self.snapshot()
        if snap is None or snap.ts == 0.0 or snap.hung or not snap.driver:
            return False
        return bool(gpuplace.visible(self.cuda_visible, _ids(snap)))

    def trains_on_cpu(self, name: str) -> bool:
        """Decided before the gate: an auto game rlsup said will train on the CPU."""
        if self._cpu_fallback[0] is not self.cfg:  # a reload: decide again for its games
            self.cpu_fallbacks()
        return name in self._cpu_fallback[1]

    def _cuda_never_here(self, spec: GameSpec) -> str | None:
        """Why a `device = "cuda"` game can never start on this host (no NVIDIA driver is
        installed: NVML's library is missing), or None. A driver installed but not loaded
        yet (late at boot) is waited for instead."""
        snap = self.snapshot()
        if spec.device != "cuda" or snap is None:
            return None
        if snap.ts == 0.0 or snap.hung or snap.driver or not snap.absent:
            return None
        return devices.no_driver_refusal(snap.reason)

    # ---- placement --------------------------------------------------------------------------

    def _place(self, spec: GameSpec, need: float, now: float) -> tuple[bool, GpuId | None]:
        """(may it go on to the gate, the GPU it is placed on)."""
        snap = self.snapshot()
        if snap is None:
            return True, None  # a bare free-memory probe: the gate alone, on GPU 0
        if snap.ts == 0.0:
            return False, None  # the sampler's first reading is moments away
        why = self._unplaceable(spec, snap)
        if why is not None:
            return self._wait(spec.name, why) if why else (True, None)
        slots = self._slots(spec.name, snap, now)
        if not slots:
            return True, None  # no GPU visible: the worker inherits that (auto: on the CPU)
        choice = gpuplace.place(slots, spec.gpu, need, self._avoided(spec.name))
        if choice.gpu is None:
            return self._wait(spec.name, choice.reason)
        if self.waiting.pop(spec.name, None) is not None:
            log.info("gpu_placed", game=spec.name, reason=choice.reason)
        return True, choice.gpu

    @staticmethod
    def _unplaceable(spec: GameSpec, snap: GpuSnapshot) -> str | None:
        """Why the game cannot be placed now: a reason to wait, "" to start unplaced (NVML
        does not answer and the game may run without it), None: place it."""
        if snap.hung:
            return f"NVML does not answer: {snap.reason}"
        if not snap.driver:
            if spec.device == "cuda":
                return f"NVML not available ({snap.reason}): waiting for the driver"
            return ""  # auto: the worker finds CUDA or runs on the CPU
        return None

    def _slots(self, name: str, snap: GpuSnapshot, now: float) -> list[gpuplace.Slot]:
        readings = {g.index: g for g in snap.gpus}
        placed = {**self.placed, **self.chosen}  # with those placed this tick, not spawned
        out = []
        for gpu in gpuplace.visible(self.cuda_visible, _ids(snap)):
            reading = readings.get(gpu.index)
            out.append(
                gpuplace.Slot(
                    gpu,
                    reading.mem_free_mb if reading else None,
                    self.gate.reserved_mb(gpu.index, now, but=name),
                    sum(1 for g, on in placed.items() if on == gpu and g != name),
                )
            )
        return out

    def _wait(self, name: str, why: str) -> tuple[bool, None]:
        """The game waits for a GPU: one gpu_wait event per reason."""
        if self.waiting.get(name) != why:
            self.waiting[name] = why
            self.record("gpu_wait", name, {"reason": why, "gpu": None})
        return False, None

    # ---- the driver and lost GPUs -----------------------------------------------------------

    def watch(self) -> list[str]:
        """Once a tick: the driver coming or going (`gpu_driver`), GPUs lost (`gpu_lost`).
        Returns the games whose worker must leave a lost GPU (to be placed again)."""
        snap = self.snapshot()
        if snap is None or snap.ts == 0.0 or snap.hung:
            return []
        if snap.driver != self.driver_up:
            first, self.driver_up = self.driver_up is None, snap.driver
            if snap.driver or not first or any(g.device != "cpu" for g in self.cfg.games):
                gpus = [{"index": g.index, "uuid": g.uuid} for g in snap.gpus]
                detail = {"available": snap.driver, "reason": snap.reason, "gpus": gpus}
                self.record("gpu_driver", None, {**detail, "visible": self.cuda_visible})
        if not snap.driver:
            return []
        present = {g.uuid for g in snap.gpus}
        errors = {lost.uuid: lost.error for lost in snap.lost}
        gone = {gpu for gpu in self.placed.values() if gpu.uuid not in present}
        gone |= {GpuId(lost.index, lost.uuid) for lost in snap.lost}
        leaving: list[str] = []
        for gpu in sorted(gone, key=lambda g: g.index):
            if gpu.uuid not in self.lost:
                self.lost.add(gpu.uuid)
                leaving += self._gpu_lost(gpu, errors.get(gpu.uuid, "missing from NVML's devices"))
        self.lost &= {gpu.uuid for gpu in gone}  # one back (reset) may be lost again
        return leaving

    def _gpu_lost(self, gpu: GpuId, error: str) -> list[str]:
        games = sorted(name for name, on in self.placed.items() if on == gpu)
        self.record("gpu_lost", None, {**gpu.as_json(), "error": error, "games": games})
        for name in games:
            self.last[name] = self.placed.pop(name)
        return games

    # ---- per-GPU stability: moving a game off a hot or OOM-prone GPU ------------------------

    def games_on_gpus(self, games: Iterable[PlacedAsk]) -> list[PlacedGame] | None:
        """The games on a GPU, for the policy (per-GPU attribution): those running on one,
        and those failed there and waiting for their restart. None where this supervisor
        does not place games on GPUs (several hosts, no NVML): GPU pressure stays the host's."""
        snap = self.snapshot()
        if snap is None or not snap.driver or not self.local:
            return None
        visible = gpuplace.visible(self.cuda_visible, _ids(snap))
        out = []
        for g in games:
            gpu = self.placed.get(g.spec.name)
            if gpu is None and g.backoff:
                gpu = self.last.get(g.spec.name)
            if gpu is None or g.spec.device == "cpu" or g.stopping:
                continue  # a stopping worker is leaving its GPU already
            choice = g.spec.gpu
            allowed = (
                visible if choice is None else [visible[i] for i in choice if i < len(visible)]
            )
            need = need_mb(self.gate.cfg, g.peak_mb)
            out.append(PlacedGame(g.spec.name, gpu, need, tuple(allowed)))
        return out

    def move(self, move: GpuMove) -> bool:
        """Carry out the policy's move: `gpu_moved`, the GPU it left avoided for the
        cooldown. True: the game's worker still runs there and must stop (with a checkpoint,
        requeued, not a failure); placement then picks another GPU."""
        self.record("gpu_moved", move.game, move.detail())
        until = self.steady() + self.cfg.stability.cooldown_s
        self.avoid.setdefault(move.game, {})[move.from_gpu.uuid] = until
        return self.placed.get(move.game) == move.from_gpu

    def _avoided(self, name: str) -> frozenset[str]:
        now = self.steady()
        return frozenset(uuid for uuid, until in self.avoid.get(name, {}).items() if until > now)

    def restore_avoided(self, conn: sqlite3.Connection) -> None:
        """The GPUs games were moved off within the cooldown, from the events of a
        predecessor: a restart does not send a game back to the GPU it just left."""
        now, cooldown = self.steady(), self.cfg.stability.cooldown_s
        for e in db.events(conn, since_mono=now - cooldown, kind="gpu_moved"):
            source = e.detail.get("from")
            if e.game is not None and isinstance(source, dict) and source.get("uuid"):
                ts = min(now, e.mono if e.mono is not None else e.ts)
                self.avoid.setdefault(e.game, {})[str(source["uuid"])] = ts + cooldown


@dataclass(frozen=True)
class PlacedAsk:
    """A game as the per-GPU policy needs it: spec, waiting for its restart (`backoff`),
    its worker leaving (`stopping`), its peak GPU memory at the mode in force."""

    spec: GameSpec
    backoff: bool
    stopping: bool
    peak_mb: float | None


def _ids(snap: GpuSnapshot) -> list[GpuId]:
    ids = [GpuId(g.index, g.uuid) for g in snap.gpus]
    return ids + [GpuId(lost.index, lost.uuid) for lost in snap.lost]
