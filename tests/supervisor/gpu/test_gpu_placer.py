"""The GPU placer on its own: where a game's worker goes, the memory gate's wait and its timeout
to one rung lower, a lost GPU, a move off a GPU and the cooldown that keeps it away. NVML is
faked at the placer's seam (the sampler's last snapshot, or a bare free-memory probe); the clocks
are fake; the events it records are collected. No process, no driver, no sleep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.runs import FakeNvml
from supervisor.config import (
    Config,
    GameSpec,
    GpuConfig,
    ModeSpec,
    RestartConfig,
    StabilityConfig,
    WatchdogConfig,
)
from supervisor.gpu.moves import GpuMove, PlacedGame
from supervisor.gpu.nvml import LIBRARY_NOT_FOUND, NO_READING, GpuSnapshot, LostGpu, NvmlProbe
from supervisor.gpu.place import GpuId
from supervisor.gpu.placer import Admission, GameAsk, GpuPlacer, PlacedAsk
from supervisor.gpu.vitals import GpuVitals

LIGHT = ModeSpec("light", num_envs=2, batch_size=2, n_steps=4, max_concurrent=4)
HEAVY = ModeSpec("heavy", num_envs=4, batch_size=4, n_steps=4, max_concurrent=4)
MIN_FREE_MB = 2048.0  # the need of a game with no observed peak
POLL_S = 30.0
TIMEOUT_S = 600.0
COOLDOWN_S = 300.0
GPU0 = GpuId(0, "GPU-aaaa")
GPU1 = GpuId(1, "GPU-bbbb")
TOTAL_MB = 80_000.0

Event = tuple[str, str | None, dict[str, Any]]


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class SnapshotProbe(NvmlProbe):
    """NVML as the placer reads it: the sampler's last snapshot, set by the test (the probe's
    `free_mb` reads it too, so the gate sees the same GPUs). Never calls the driver."""

    def __init__(self, snap: GpuSnapshot) -> None:
        super().__init__()
        self.snap = snap

    def latest(self) -> GpuSnapshot:
        return self.snap


def reading(gpu: GpuId, free_mb: float) -> GpuVitals:
    return GpuVitals(gpu.index, TOTAL_MB - free_mb, TOTAL_MB, 0.0, 40.0, None, gpu.uuid)


def snapshot(*gpus: tuple[GpuId, float], lost: tuple[LostGpu, ...] = ()) -> GpuSnapshot:
    """NVML answering, with each (GPU, free MB) readable and `lost` ones fallen off the bus."""
    return GpuSnapshot(1.0, True, "ok", tuple(reading(g, free) for g, free in gpus), lost)


def game(name: str, device: str = "cuda", gpu: tuple[int, ...] | None = None) -> GameSpec:
    return GameSpec(name, "CartPole-v1", "ppo", 1000, 1, device, gpu=gpu)


def config(*games: GameSpec) -> Config:
    return Config(
        path=Path("/nonexistent/rlsup.toml"),
        state_dir=Path("/nonexistent/state"),
        initial_mode="heavy",
        checkpoint_every_s=60.0,
        stop_grace_s=30.0,
        cost_per_hour=0.0,
        modes=(LIGHT, HEAVY),
        games=games,
        restart=RestartConfig(),
        watchdog=WatchdogConfig(),
        stability=StabilityConfig(cooldown_s=COOLDOWN_S),
        gpu=GpuConfig(min_free_mb=MIN_FREE_MB, poll_s=POLL_S, timeout_s=TIMEOUT_S),
    )


class Placed:
    """A placer over a fake NVML, with what it recorded and its steady clock."""

    def __init__(
        self,
        probe: SnapshotProbe | FakeNvml,
        *games: GameSpec,
        visible: str | None = None,
        local: bool = True,
    ) -> None:
        self.probe = probe
        self.events: list[Event] = []
        self.steady = Clock()
        self.specs = {g.name: g for g in games or (game("a"), game("b"))}
        self.placer = GpuPlacer(
            config(*self.specs.values()),
            probe,
            record=lambda kind, name, detail: self.events.append((kind, name, detail)),
            steady=self.steady,
            visible=visible,
            local=local,
        )

    def admit(
        self,
        name: str,
        now: float,
        *,
        mode: ModeSpec = HEAVY,
        lighter: ModeSpec | None = LIGHT,
        pinned: bool = False,
        peak_mb: float | None = None,
    ) -> Admission:
        ask = GameAsk(self.specs[name], mode, lighter, pinned, peak_mb)
        return self.placer.admit(ask, now)

    def start(self, name: str, now: float = 0.0) -> GpuId | None:
        """Admitted and spawned: the GPU it was placed on, now its own."""
        admission = self.admit(name, now)
        assert admission.ok, admission
        self.placer.assign(name)
        return admission.gpu

    def see(self, snap: GpuSnapshot) -> None:
        """The sampler's next NVML reading."""
        assert isinstance(self.probe, SnapshotProbe)
        self.probe.snap = snap

    def kinds(self) -> list[tuple[str, str | None]]:
        return [(kind, name) for kind, name, _ in self.events]

    def last(self, kind: str) -> dict[str, Any]:
        return [detail for k, _, detail in self.events if k == kind][-1]


def two_gpus(free0: float = 30_000.0, free1: float = 20_000.0) -> SnapshotProbe:
    return SnapshotProbe(snapshot((GPU0, free0), (GPU1, free1)))


# ---- assign and unassign --------------------------------------------------------------------


def test_a_cuda_game_is_placed_on_the_roomiest_gpu_and_assign_makes_it_its_own() -> None:
    p = Placed(two_gpus())
    admission = p.admit("a", now=0.0)
    assert (admission.ok, admission.gpu, admission.fallback) == (True, GPU0, None)
    assert p.placer.env_for("a") == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}
    assert p.events == []  # chosen, not spawned yet
    assert p.placer.assign("a") == {"gpu": {"index": 0, "uuid": "GPU-aaaa"}}
    assert p.events == [
        ("gpu_assigned", "a", {"index": 0, "uuid": "GPU-aaaa", "CUDA_VISIBLE_DEVICES": "GPU-aaaa"})
    ]
    assert p.placer.on_gpu("a") == {"gpu": {"index": 0, "uuid": "GPU-aaaa"}}
    assert json.loads(p.placer.row_gpu("a") or "") == {"index": 0, "uuid": "GPU-aaaa"}


def test_games_placed_in_one_tick_are_spread_over_the_gpus() -> None:
    p = Placed(two_gpus())
    assert p.admit("a", now=0.0).gpu == GPU0
    # a is chosen, not spawned yet: b still counts it (and its reservation) on GPU 0.
    assert p.admit("b", now=0.0).gpu == GPU1


def test_unassign_after_a_failed_spawn_frees_the_chosen_gpu() -> None:
    p = Placed(two_gpus())
    p.admit("a", now=0.0)
    p.placer.unassign("a")
    assert p.placer.env_for("a") is None
    assert p.placer.assign("a") == {} and p.events == []  # nothing was placed
    assert p.placer.on_gpu("a") == {} and p.placer.row_gpu("a") is None


def test_unassign_after_a_failed_spawn_gives_back_the_reservation() -> None:
    p = Placed(SnapshotProbe(snapshot((GPU0, 4000.0))), game("a"), game("b"))
    assert p.admit("a", now=0.0).ok
    p.placer.unassign("a")  # its spawn failed: no worker holds any memory
    assert p.admit("b", now=1.0).ok


def test_deferred_games_are_placed_afresh_next_tick() -> None:
    p = Placed(two_gpus())
    p.admit("a", now=0.0)
    p.placer.defer(["a"])
    assert p.placer.env_for("a") is None
    assert p.admit("b", now=0.0).gpu == GPU0  # a no longer counts as placed on GPU 0


def test_a_worker_gone_frees_its_gpu_and_the_next_one_says_where_it_moved_from() -> None:
    p = Placed(SnapshotProbe(snapshot((GPU0, 30_000.0))), game("a"), game("b"))
    p.start("a")
    p.placer.gone("a")
    assert p.placer.on_gpu("a") == {} and p.placer.row_gpu("a") is None
    p.see(snapshot((GPU1, 30_000.0)))
    p.start("a", now=1.0)
    assert p.last("gpu_assigned")["moved_from"] == {"index": 0, "uuid": "GPU-aaaa"}


def test_cuda_visible_devices_limits_the_gpus_placed_on() -> None:
    p = Placed(two_gpus(), visible="GPU-bbbb")
    assert p.admit("a", now=0.0).gpu == GPU1  # GPU 0 is roomier, but not ours
    q = Placed(two_gpus(), game("a", gpu=(1,)))
    assert q.admit("a", now=0.0).gpu == GPU1  # games.gpu = 1: the second visible GPU


def test_cpu_games_and_several_hosts_skip_placement_and_the_gate() -> None:
    probe = FakeNvml(free=0.0)
    p = Placed(probe, game("cpu", device="cpu"))
    assert p.admit("cpu", now=0.0).ok and probe.reads == 0
    remote = FakeNvml(free=0.0)
    ray = Placed(remote, game("a"), local=False)  # Ray's num_gpus places it
    assert ray.admit("a", now=0.0).ok and remote.reads == 0
    assert p.events == ray.events == []


# ---- the memory gate ------------------------------------------------------------------------


def test_the_gate_waits_for_free_memory_then_starts() -> None:
    p = Placed(SnapshotProbe(snapshot((GPU0, 1000.0))), game("a"))
    assert p.admit("a", now=0.0).ok is False
    assert p.events == [
        (
            "gpu_wait",
            "a",
            {
                "reason": "GPU 0: 1000 MB free < 2048 MB needed; waited 0s",
                "free_mb": 1000,
                "need_mb": 2048,
                "mode": "heavy",
                "gpu": {"index": 0, "uuid": "GPU-aaaa"},
            },
        )
    ]
    assert p.admit("a", now=10.0).ok is False
    assert len(p.events) == 1  # one gpu_wait per wait, not one per tick
    p.see(snapshot((GPU0, 8000.0)))
    assert p.admit("a", now=20.0).ok is False  # read again only every poll_s
    admission = p.admit("a", now=POLL_S)
    assert (admission.ok, admission.gpu, admission.fallback) == (True, GPU0, None)
    assert admission.reason == "GPU 0: 8000 MB free >= 2048 MB needed"
    assert len(p.events) == 1


def test_the_need_is_the_observed_peak_plus_a_margin() -> None:
    p = Placed(SnapshotProbe(snapshot((GPU0, 4000.0))), game("a"))
    assert p.admit("a", now=0.0, peak_mb=4000.0).ok is False
    assert p.last("gpu_wait")["need_mb"] == 4800  # 4000 + 20 %


def test_the_gate_times_out_to_one_rung_lower() -> None:
    p = Placed(SnapshotProbe(snapshot((GPU0, 1000.0))), game("a"))
    p.admit("a", now=0.0)
    assert p.admit("a", now=TIMEOUT_S - 1).ok is False
    admission = p.admit("a", now=TIMEOUT_S)
    assert (admission.ok, admission.gpu, admission.fallback) == (True, GPU0, LIGHT)
    assert admission.reason.endswith("(timeout 600s): starting one mode lower")
    timed_out = p.last("gpu_wait")
    assert {k: timed_out[k] for k in ("timed_out", "from", "to", "gpu")} == {
        "timed_out": True, "from": "heavy", "to": "light",
        "gpu": {"index": 0, "uuid": "GPU-aaaa"},
    }  # fmt: skip
    assert p.placer.env_for("a") == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}


def test_a_pinned_game_or_one_at_the_lowest_rung_waits_on_past_the_timeout() -> None:
    p = Placed(SnapshotProbe(snapshot((GPU0, 1000.0))), game("a"), game("b"))
    p.admit("a", now=0.0, pinned=True)
    p.admit("b", now=0.0, mode=LIGHT, lighter=None)
    assert p.admit("a", now=TIMEOUT_S * 2, pinned=True).ok is False
    assert p.admit("b", now=TIMEOUT_S * 2, mode=LIGHT, lighter=None).ok is False
    assert p.kinds() == [("gpu_wait", "a"), ("gpu_wait", "b")]  # no timed-out fallback


def test_a_started_workers_reservation_holds_back_the_next_until_its_memory_is_seen() -> None:
    p = Placed(SnapshotProbe(snapshot((GPU0, 4000.0))), game("a"), game("b"))
    p.start("a")
    assert p.admit("b", now=1.0).ok is False  # 4000 - a's 2048 held < 2048
    assert p.last("gpu_wait")["free_mb"] == 1952
    # a reported its memory (1500 MB): NVML sees it, the reservation goes.
    p.see(snapshot((GPU0, 2500.0)))
    p.placer.seen_memory("a")
    assert p.admit("b", now=1.0 + POLL_S).ok is True


def test_a_worker_gone_gives_back_its_reservation() -> None:
    p = Placed(SnapshotProbe(snapshot((GPU0, 4000.0))), game("a"), game("b"))
    p.start("a")
    p.placer.gone("a")  # died before NVML saw its memory
    assert p.admit("b", now=1.0).ok is True


def test_a_bare_free_memory_probe_gates_on_gpu_0_without_placing() -> None:
    probe = FakeNvml(free=1000.0)
    p = Placed(probe, game("a"))
    assert p.admit("a", now=0.0).ok is False
    assert p.last("gpu_wait")["gpu"] is None
    probe.free = 8000.0
    admission = p.admit("a", now=POLL_S)
    assert (admission.ok, admission.gpu) == (True, None)
    assert probe.reads == 2  # once per poll_s
    assert p.placer.env_for("a") is None and p.placer.assign("a") == {}
    none = Placed(FakeNvml(free=None), game("a"))  # no driver: the gate is a no-op
    assert none.admit("a", now=0.0).ok and none.events == []


# ---- the driver ---------------------------------------------------------------------------


def test_nothing_starts_before_the_first_reading() -> None:
    p = Placed(SnapshotProbe(NO_READING), game("a"))
    assert p.admit("a", now=0.0).ok is False
    assert p.placer.watch() == [] and p.events == []


def test_a_cuda_game_waits_for_a_driver_not_loaded_yet() -> None:
    late = GpuSnapshot(1.0, False, "Driver Not Loaded")
    p = Placed(SnapshotProbe(late), game("a"))
    admission = p.admit("a", now=0.0)
    assert (admission.ok, admission.never) == (False, None)
    p.admit("a", now=1.0)
    assert p.events == [
        ("gpu_wait", "a", {
            "reason": "NVML not available (Driver Not Loaded): waiting for the driver",
            "gpu": None,
        }),
    ]  # fmt: skip


def test_a_cuda_game_can_never_start_without_a_driver_installed() -> None:
    absent = GpuSnapshot(1.0, False, LIBRARY_NOT_FOUND, absent=True)
    p = Placed(SnapshotProbe(absent), game("a"))
    admission = p.admit("a", now=0.0)
    assert admission.ok is False and admission.never is not None
    assert admission.never.startswith('device = "cuda", but this host has no NVIDIA driver')


def test_the_driver_coming_and_going_is_recorded_once_each() -> None:
    p = Placed(two_gpus())
    assert p.placer.watch() == []
    assert p.events == [
        ("gpu_driver", None, {
            "available": True, "reason": "ok", "visible": None,
            "gpus": [{"index": 0, "uuid": "GPU-aaaa"}, {"index": 1, "uuid": "GPU-bbbb"}],
        }),
    ]  # fmt: skip
    p.placer.watch()
    p.see(GpuSnapshot(2.0, False, "Driver Not Loaded"))
    p.placer.watch()
    p.placer.watch()
    assert p.kinds() == [("gpu_driver", None), ("gpu_driver", None)]
    assert p.last("gpu_driver")["available"] is False


# ---- a lost GPU -----------------------------------------------------------------------------


def test_a_lost_gpu_sends_its_games_away_once_and_they_are_placed_on_another() -> None:
    p = Placed(two_gpus())
    p.placer.watch()
    p.start("a")
    p.start("b")
    p.see(snapshot((GPU1, 20_000.0), lost=(LostGpu(0, "GPU-aaaa", "GPU is lost"),)))
    assert p.placer.watch() == ["a"]  # the daemon stops it (GPU_LOST), requeued
    assert p.last("gpu_lost") == {
        "index": 0, "uuid": "GPU-aaaa", "error": "GPU is lost", "games": ["a"],
    }  # fmt: skip
    assert p.placer.on_gpu("a") == {}
    assert p.placer.watch() == []  # once
    p.placer.gone("a")  # its worker exited
    assert p.start("a", now=40.0) == GPU1  # GPU 0 is not readable
    assert p.last("gpu_assigned")["moved_from"] == {"index": 0, "uuid": "GPU-aaaa"}
    assert [kind for kind, _ in p.kinds()].count("gpu_lost") == 1


def test_a_gpu_missing_from_nvmls_devices_is_lost_too() -> None:
    p = Placed(two_gpus())
    p.start("a")
    p.see(snapshot((GPU1, 20_000.0)))
    assert p.placer.watch() == ["a"]
    assert p.last("gpu_lost")["error"] == "missing from NVML's devices"


def test_no_usable_gpu_waits_and_says_why() -> None:
    lost = snapshot(lost=(LostGpu(0, "GPU-aaaa", "GPU is lost"),))
    p = Placed(SnapshotProbe(lost), game("a"))
    assert p.admit("a", now=0.0).ok is False
    assert p.last("gpu_wait") == {
        "reason": "no usable GPU: GPU 0 not readable (lost?)",
        "gpu": None,
    }


# ---- moves off a GPU ------------------------------------------------------------------------


def test_a_move_is_recorded_and_the_gpu_it_left_is_avoided_for_the_cooldown() -> None:
    p = Placed(two_gpus())
    p.start("a")  # on GPU 0, the roomier
    assert p.placer.move(GpuMove("a", GPU0, GPU1, ("gpu_hot",))) is True  # still runs there
    assert p.last("gpu_moved") == {
        "from": {"index": 0, "uuid": "GPU-aaaa"}, "to": {"index": 1, "uuid": "GPU-bbbb"},
        "causes": ["gpu_hot"],
    }  # fmt: skip
    p.placer.gone("a")  # stopped with a checkpoint, requeued
    assert p.start("a", now=40.0) == GPU1
    p.placer.gone("a")
    p.steady.t += COOLDOWN_S  # the cooldown is over: the roomiest again
    assert p.start("a", now=80.0) == GPU0


def test_a_move_of_a_worker_no_longer_on_that_gpu_needs_no_stop() -> None:
    p = Placed(two_gpus())
    p.start("a")
    p.placer.gone("a")  # it failed there and waits for its restart
    assert p.placer.move(GpuMove("a", GPU0, GPU1, ("oom",))) is False
    assert p.start("a", now=40.0) == GPU1  # its restart avoids GPU 0 all the same


def test_the_games_on_gpus_for_the_policy() -> None:
    p = Placed(two_gpus(), game("a"), game("b"), game("c"), game("cpu", device="cpu"))
    p.start("a")
    p.start("b")
    p.start("c")
    p.placer.gone("b")  # failed on GPU 1, waiting out its backoff
    asks = [
        PlacedAsk(p.specs["a"], backoff=False, stopping=False, peak_mb=4000.0),
        PlacedAsk(p.specs["b"], backoff=True, stopping=False, peak_mb=None),
        PlacedAsk(p.specs["c"], backoff=False, stopping=True, peak_mb=None),  # leaving it
        PlacedAsk(p.specs["cpu"], backoff=False, stopping=False, peak_mb=None),
    ]
    both = (GPU0, GPU1)
    assert p.placer.games_on_gpus(asks) == [
        PlacedGame("a", GPU0, 4800.0, both),
        PlacedGame("b", GPU1, MIN_FREE_MB, both),
    ]
    assert Placed(FakeNvml(free=0.0)).placer.games_on_gpus(asks) is None  # nothing placed
