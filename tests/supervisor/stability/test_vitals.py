"""Host vitals: a real sample, the sampler thread, the NVML seam, the samples table."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped, unused-ignore]
import pytest

from supervisor.gpu.vitals import GpuVitals
from supervisor.ledger import db
from supervisor.stability.policy import Vitals
from supervisor.stability.vitals import (
    NvmlProbe,
    VitalsSampler,
    from_json,
    sample,
    to_json,
)

GIB = 1024**3


def wait_for(cond: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_real_sample_has_sane_ranges(tmp_path: Path) -> None:
    probe = NvmlProbe()
    v = sample(tmp_path, probe)
    assert abs(v.ts - time.time()) < 5
    assert 0 < v.ram_available_pct <= 100
    assert 0 <= v.swap_used_pct <= 100
    assert 0 < v.disk_free_pct <= 100
    assert 0 <= v.cpu_pct <= 100 * 1024
    assert v.load_1m >= 0
    if not probe.available():
        assert v.gpus == ()  # this machine: no driver, no GPU part, no error
    for g in v.gpus:
        assert 0 <= g.mem_used_mb <= g.mem_total_mb


def test_sample_of_a_state_dir_not_created_yet_reads_its_parent(tmp_path: Path) -> None:
    v = sample(tmp_path / "not" / "yet", NvmlProbe())
    assert 0 < v.disk_free_pct <= 100


def test_sampler_thread_samples_and_stops(tmp_path: Path) -> None:
    clock = iter(range(10**6))
    sampler = VitalsSampler(tmp_path, interval_s=0.01, clock=lambda: float(next(clock)))
    assert sampler.latest() is None
    sampler.start()
    try:
        assert wait_for(lambda: (v := sampler.latest()) is not None and v.ts >= 2.0)
    finally:
        sampler.stop()
    assert "rlsup-vitals" not in {t.name for t in threading.enumerate()}


def test_sampler_survives_a_failing_sample(tmp_path: Path) -> None:
    calls = []

    def flaky() -> Vitals:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("psutil hiccup")
        return Vitals(time.time(), 50.0, 0.0, 50.0, ())

    sampler = VitalsSampler(tmp_path, interval_s=0.01, sample_fn=flaky)
    sampler.start()
    try:
        assert wait_for(lambda: sampler.latest() is not None)
    finally:
        sampler.stop()


def test_stop_is_prompt_with_a_long_interval(tmp_path: Path) -> None:
    sampler = VitalsSampler(tmp_path, interval_s=3600)
    sampler.start()
    assert wait_for(lambda: sampler.latest() is not None)
    t0 = time.monotonic()
    sampler.stop()
    assert time.monotonic() - t0 < 1.0


# --- the NVML probe, patched at its seam ----------------------------------------------------


def nvml_error(code: int) -> Exception:
    err: Exception = pynvml.NVMLError(code)
    return err


def test_probe_without_driver_checks_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def no_library() -> None:
        calls.append(1)
        raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    probe = NvmlProbe()
    assert probe.gpus() == ()
    assert probe.free_mb(0) is None
    assert not probe.available()
    assert calls == [1]


@pytest.fixture
def two_fake_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU 0: 80 GiB, 20 GiB used; GPU 1: no power reading (unsupported)."""

    def power(handle: int) -> int:
        if handle == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 250_000  # mW

    fakes: dict[str, Any] = {
        "nvmlInit": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
            total=80 * GIB, used=20 * GIB, free=60 * GIB
        ),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=97, memory=40),
        "nvmlDeviceGetTemperature": lambda h, sensor: 71,
        "nvmlDeviceGetPowerUsage": power,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)


@pytest.mark.usefixtures("two_fake_gpus")
def test_probe_with_a_driver_returns_gpu_vitals() -> None:
    probe = NvmlProbe()
    gpus = probe.gpus()
    assert gpus == (
        GpuVitals(0, 20 * 1024.0, 80 * 1024.0, 97.0, 71.0, 250.0),
        GpuVitals(1, 20 * 1024.0, 80 * 1024.0, 97.0, 71.0, None),
    )
    assert probe.free_mb(1) == 60 * 1024.0


@pytest.mark.usefixtures("two_fake_gpus")
def test_sample_includes_gpus_from_the_probe(tmp_path: Path) -> None:
    assert len(sample(tmp_path, NvmlProbe()).gpus) == 2


@pytest.mark.usefixtures("two_fake_gpus")
def test_a_gpu_that_fails_its_query_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(h: int) -> Any:
        if h == 0:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(total=GIB, used=0, free=GIB)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lost)
    probe = NvmlProbe()
    assert [g.index for g in probe.gpus()] == [1]
    assert probe.free_mb(0) is None


# --- the samples table ------------------------------------------------------------------------


def test_json_round_trip_keeps_unsupported_readings() -> None:
    v = Vitals(
        ts=123.5,
        ram_available_pct=42.0,
        swap_used_pct=1.0,
        disk_free_pct=30.0,
        gpus=(GpuVitals(0, 100.0, 1000.0, math.nan, 60.0, None),),
        cpu_pct=12.0,
        load_1m=0.5,
    )
    text = json.dumps(to_json(v), allow_nan=False)  # strict JSON: NaN stored as null
    back = from_json(json.loads(text))
    assert math.isnan(back.gpus[0].util_pct)
    assert back == Vitals(
        **{**v.__dict__, "gpus": (GpuVitals(0, 100.0, 1000.0, back.gpus[0].util_pct, 60.0, None),)}
    )


def test_samples_keep_the_newest_rows_and_a_week(tmp_path: Path) -> None:
    conn = db.connect(tmp_path)
    for t in range(100):
        db.insert_sample(conn, float(t), "{}", keep_s=1000.0, max_rows=10)
    assert [r[0] for r in conn.execute("SELECT ts FROM samples ORDER BY ts")] == list(
        map(float, range(90, 100))
    )
    db.insert_sample(conn, 200.0, "{}", keep_s=105.0, max_rows=10)
    assert [r[0] for r in conn.execute("SELECT ts FROM samples ORDER BY ts")] == [
        95.0, 96.0, 97.0, 98.0, 99.0, 200.0,
    ]  # fmt: skip
