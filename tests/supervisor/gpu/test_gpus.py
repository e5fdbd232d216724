"""NVML's lifecycle (`gpus.NvmlProbe`): a late driver, a lost GPU, a hung call; the test seam."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.gpu.nvml import (
    FAKE_NVML_ENV,
    LIBRARY_NOT_FOUND,
    NvmlFailure,
    NvmlProbe,
    PynvmlBackend,
    ScenarioBackend,
    _failure,
    default_backend,
)

pytestmark = pytest.mark.timeout(30)

UUIDS = ["GPU-aaaa0000-0000", "GPU-bbbb1111-1111", "GPU-cccc2222-2222", "GPU-dddd3333-3333"]


def scenario(path: Path, n: int = 2, **extra: Any) -> Path:
    gpus = [{"uuid": UUIDS[i], "total_mb": 80_000, "used_mb": 1_000 * i} for i in range(n)]
    data = {"init": "ok", "gpus": gpus, **extra}
    path.write_text(json.dumps(data))
    return path


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_readings_name_each_gpu_by_index_and_uuid(tmp_path: Path) -> None:
    probe = NvmlProbe(ScenarioBackend(scenario(tmp_path / "s.json", 4)))
    snap = probe.refresh()
    assert snap.driver and not snap.hung
    assert [(g.index, g.uuid) for g in snap.gpus] == list(enumerate(UUIDS))
    assert probe.free_mb(2) == 80_000 - 2_000
    assert snap.by_uuid(UUIDS[3]) is not None and snap.by_uuid("GPU-nope") is None


def test_readers_never_call_nvml(tmp_path: Path) -> None:
    calls: list[str] = []

    class Counting(ScenarioBackend):
        def count(self) -> int:
            calls.append("count")
            return super().count()

    probe = NvmlProbe(Counting(scenario(tmp_path / "s.json")))
    assert probe.free_mb(0) is None and not probe.available()  # nothing read yet
    probe.refresh()
    for _ in range(5):
        probe.latest(), probe.free_mb(0), probe.available()
    assert calls == ["count"]


def test_a_late_driver_is_retried_with_backoff_until_it_answers(tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", init="Driver Not Loaded")
    clock = Clock()
    inits: list[float] = []

    class Late(ScenarioBackend):
        def init(self) -> None:
            inits.append(clock.t)
            super().init()

    probe = NvmlProbe(Late(path), retry_base_s=1.0, retry_max_s=4.0, clock=clock)
    for _ in range(12):  # every 0.5 s for 6 s
        snap = probe.refresh()
        clock.t += 0.5
    assert not snap.driver and "Driver Not Loaded" in snap.reason
    assert [t - 1000.0 for t in inits] == [0.0, 1.0, 3.0]  # waits 1, 2, then 4 (capped)
    scenario(path)  # the driver is loaded now
    clock.t = 1000.0 + 7.0
    assert probe.refresh().driver and len(probe.latest().gpus) == 2


def test_a_lost_gpu_is_reported_and_the_others_read_on(tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", 2)
    probe = NvmlProbe(ScenarioBackend(path))
    probe.refresh()
    data = json.loads(path.read_text())
    data["gpus"][0]["lost"] = True
    path.write_text(json.dumps(data))
    snap = probe.refresh()
    assert snap.driver
    assert [g.uuid for g in snap.gpus] == [UUIDS[1]]
    assert [(x.index, x.uuid) for x in snap.lost] == [(0, UUIDS[0])]
    assert "lost" in snap.lost[0].error.lower()
    assert probe.free_mb(0) is None


def test_the_library_failing_as_a_whole_drops_the_driver_then_reinitialises(
    tmp_path: Path,
) -> None:
    path = scenario(tmp_path / "s.json")
    clock = Clock()
    probe = NvmlProbe(ScenarioBackend(path), retry_base_s=2.0, clock=clock)
    assert probe.refresh().driver
    scenario(path, init="Unknown Error")
    assert not probe.refresh().driver
    scenario(path)
    clock.t += 1.0
    assert not probe.refresh().driver  # still backing off
    clock.t += 1.5
    assert probe.refresh().driver


def test_a_hung_call_times_out_and_no_new_call_is_made_until_it_returns(tmp_path: Path) -> None:
    # hang_s stands for a 30 s driver hang; long enough that the second refresh below still
    # finds the first call out on a loaded CI host.
    path = scenario(tmp_path / "s.json", hang_s=1.5)
    probe = NvmlProbe(ScenarioBackend(path), timeout_s=0.1)
    t0 = time.monotonic()
    snap = probe.refresh()
    assert time.monotonic() - t0 < 1.0
    assert snap.hung and "did not return" in snap.reason
    scenario(path)  # the next reads would not hang, but the first call is still out
    assert probe.refresh().hung
    assert "earlier NVML call" in probe.latest().reason
    deadline = time.monotonic() + 5
    while probe.refresh().hung:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert probe.latest().driver and len(probe.latest().gpus) == 2
    assert not [t for t in threading.enumerate() if t.name == "rlsup-nvml-call"]


def test_the_fake_nvml_seam_is_read_only_from_its_env_var(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FAKE_NVML_ENV, raising=False)
    assert isinstance(default_backend(), PynvmlBackend)
    monkeypatch.setenv(FAKE_NVML_ENV, str(scenario(tmp_path / "s.json")))
    backend = default_backend()
    assert isinstance(backend, ScenarioBackend) and backend.count() == 2


def test_an_unreadable_scenario_is_a_failed_init(tmp_path: Path) -> None:
    with pytest.raises(NvmlFailure):
        ScenarioBackend(tmp_path / "missing.json").init()


def test_without_a_driver_on_this_machine_the_real_probe_says_so() -> None:
    snap = NvmlProbe(timeout_s=5.0).refresh()
    if snap.driver:
        pytest.skip("this machine has an NVIDIA driver")
    assert snap.gpus == () and snap.reason


def test_no_driver_installed_is_told_apart_from_a_driver_not_loaded_yet(tmp_path: Path) -> None:
    """NVML's library missing: no driver is coming (`absent`, every snapshot until one
    answers); "Driver Not Loaded": a late driver, waited for."""
    clock = Clock()
    path = scenario(tmp_path / "s.json", init=LIBRARY_NOT_FOUND)
    probe = NvmlProbe(ScenarioBackend(path), retry_base_s=1.0, clock=clock)
    first = probe.refresh()
    clock.t += 0.5  # before the next try: the snapshot still says so
    assert first.absent and probe.refresh().absent and not probe.latest().driver
    scenario(path, init="Driver Not Loaded")
    clock.t += 10
    assert not probe.refresh().absent
    scenario(path)
    clock.t += 10
    snap = probe.refresh()
    assert snap.driver and not snap.absent


def test_the_real_backend_marks_a_missing_library_absent() -> None:
    import pynvml

    assert _failure(pynvml.NVMLError_LibraryNotFound()).absent
    assert not _failure(pynvml.NVMLError_DriverNotLoaded()).absent
    assert str(pynvml.NVMLError_LibraryNotFound()) == LIBRARY_NOT_FOUND  # the scenario's word
