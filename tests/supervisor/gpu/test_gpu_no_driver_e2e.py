"""End to end under a real `rlsup run` on a host with no NVIDIA driver at all (no seam: the
real NVML, the real /proc): a `device = "cuda"` game can never start, so it ends FATAL at once,
naming CUDA and the fix, while a CPU game trains on (issue 24 #12)."""

from __future__ import annotations

import ctypes.util
import time
from pathlib import Path

import pytest

from harness.runs import (
    env_for,
    events,
    rlsup,
    start_supervisor,
    stop_supervisor,
    wait_for,
    worker_pids,
    write_config,
)
from training import torchbuild

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        torchbuild.driver_version() is not None
        or ctypes.util.find_library("nvidia-ml") is not None,
        reason="this host has an NVIDIA driver",
    ),
]


def test_a_cuda_game_on_a_host_without_a_driver_is_fatal_within_seconds(tmp_path: Path) -> None:
    config = write_config(tmp_path, [("gpu", 10_000_000), ("cart", 10_000_000)])
    text = config.read_text()
    first_cpu = text.index('device = "cpu"')
    config.write_text(text[:first_cpu] + 'device = "cuda"' + text[first_cpu + 14 :])
    env = env_for(tmp_path)
    env.pop("RLSUP_FAKE_NVML", None)
    env.pop(torchbuild.DRIVER_PATH_ENV, None)
    state = tmp_path / "state"
    started = time.monotonic()
    sup = start_supervisor(config, env)
    try:
        [fatal] = wait_for(lambda: events(state, "fatal", "gpu"), 60, "the cuda game FATAL")
        took_s = time.monotonic() - started
        reason = fatal["detail"]["reason"]
        assert 'device = "cuda"' in reason and "no NVIDIA driver" in reason, reason
        assert "install the NVIDIA driver" in reason and 'device = "auto"' in reason, reason
        assert took_s < 60, took_s  # was: still waiting for a driver 120 s after the start
        assert worker_pids(state, "gpu") == []
        status = rlsup("status", "--config", str(config), env=env)
        assert status.returncode == 4, status.stdout + status.stderr  # a game is FATAL
        assert sup.poll() is None, "the supervisor goes on for the other games"
    finally:
        stop_supervisor(sup)
    assert sup.returncode == 0
    assert worker_pids(state, "gpu") == [] and worker_pids(state, "cart") == []
