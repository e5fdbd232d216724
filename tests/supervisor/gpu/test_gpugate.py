"""The GPU memory gate, driven like the tick loop drives it: a fake clock and a fake NVML."""

from __future__ import annotations

import pytest

from harness.runs import FakeNvml
from supervisor.gpu.gate import GateConfig, GpuGate, need_mb, worker_env
from supervisor.stability.vitals import NvmlProbe

CFG = GateConfig(min_free_mb=2048, poll_s=30, timeout_s=7200)


def test_waits_while_memory_is_short() -> None:
    gate = GpuGate(FakeNvml(500), CFG)
    r = gate.check("pong", 2048, now=0.0)
    r2 = gate.check("pong", 2048, now=60.0)
    assert (r.action, r2.action) == ("wait", "wait")
    assert r2.waited_s == 60.0
    assert "500 MB free < 2048 MB needed" in r2.reason


def test_starts_when_memory_frees() -> None:
    nvml = FakeNvml(500)
    gate = GpuGate(nvml, CFG)
    assert gate.check("pong", 2048, now=0.0).action == "wait"
    nvml.free = 10_000
    r = gate.check("pong", 2048, now=30.0)
    assert (r.action, r.free_mb, r.waited_s) == ("start", 10_000, 30.0)
    nvml.free = 500  # the wait is over: a later shortage is a new wait
    assert gate.check("pong", 2048, now=100.0).waited_s == 0.0


def test_reads_nvml_at_most_every_poll_s() -> None:
    nvml = FakeNvml(500)
    gate = GpuGate(nvml, CFG)
    for tick in range(30):  # one tick a second
        gate.check("pong", 2048, now=float(tick))
    assert nvml.reads == 1
    gate.check("pong", 2048, now=30.0)
    assert nvml.reads == 2


def test_falls_back_a_rung_after_the_timeout() -> None:
    gate = GpuGate(FakeNvml(500), CFG)
    gate.check("pong", 2048, now=0.0)
    assert gate.check("pong", 2048, now=7199.0).action == "wait"
    r = gate.check("pong", 2048, now=7200.0)
    assert r.action == "fallback"
    assert "starting one mode lower" in r.reason
    # The wait is over (the lower rung starts now): a later shortage is a new wait.
    assert gate.check("pong", 2048, now=7300.0).waited_s == 0.0


def test_at_the_lowest_rung_the_timeout_keeps_waiting() -> None:
    gate = GpuGate(FakeNvml(500), CFG)
    gate.check("pong", 2048, now=0.0, at_floor=True)
    r = gate.check("pong", 2048, now=8000.0, at_floor=True)
    assert r.action == "wait"
    assert "lowest mode" in r.reason


def test_no_driver_starts_immediately() -> None:
    nvml = FakeNvml(None)
    r = GpuGate(nvml, CFG).check("pong", 1e9, now=0.0)
    assert (r.action, r.free_mb, r.waited_s) == ("start", None, 0.0)
    assert "no NVIDIA driver" in r.reason


def test_real_probe_on_a_machine_without_driver_is_a_no_op() -> None:
    probe = NvmlProbe()
    if probe.available():
        pytest.skip("this machine has an NVIDIA driver")
    assert GpuGate(probe, CFG).check("pong", 2048, now=0.0).action == "start"


def test_two_workers_do_not_count_the_same_free_memory() -> None:
    gate = GpuGate(FakeNvml(3000), CFG)
    assert gate.check("pong", 2048, now=0.0).action == "start"
    r = gate.check("breakout", 2048, now=0.0)
    assert r.action == "wait"  # 3000 - 2048 reserved for pong
    assert r.free_mb == 3000 - 2048


def test_reservation_expires_or_is_cleared() -> None:
    gate = GpuGate(FakeNvml(3000), CFG)
    gate.check("pong", 2048, now=0.0)
    assert gate.check("breakout", 2048, now=CFG.reserve_s + 1).action == "start"
    gate.clear("breakout")
    gate.check("qbert", 2048, now=CFG.reserve_s + 2)
    gate.clear("qbert")
    assert gate.check("seaquest", 2048, now=CFG.reserve_s + 3).action == "start"


def test_clear_restarts_the_wait() -> None:
    gate = GpuGate(FakeNvml(500), CFG)
    gate.check("pong", 2048, now=0.0)
    gate.clear("pong")
    assert gate.check("pong", 2048, now=7300.0).waited_s == 0.0


@pytest.mark.parametrize(
    "peak,expected",
    [
        (None, 2048.0),  # nothing observed yet: the configured minimum
        (1000.0, 1512.0),  # small peak: +512 MB floor on the margin
        (10_000.0, 12_000.0),  # large peak: +20%
    ],
)
def test_need_is_learned_from_the_observed_peak_plus_margin(
    peak: float | None, expected: float
) -> None:
    assert need_mb(CFG, peak) == expected


def test_worker_env_sets_expandable_segments() -> None:
    env = worker_env({"PATH": "/usr/bin"})
    assert env == {"PATH": "/usr/bin", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_worker_env_keeps_the_operators_alloc_conf() -> None:
    base = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    assert worker_env(base) == base
    assert worker_env(base) is not base
