"""End to end under a real `rlsup run`: a recorded 2-GPU NVML (the test-only RLSUP_FAKE_NVML
seam), real workers (device "auto" on this CPU-only torch: they train on the CPU, placed or
not). Asserts the placements, each worker's CUDA_VISIBLE_DEVICES (/proc/<pid>/environ), the
events, status --json's `gpu`, and a GPU lost mid-run: its game moves to the other GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.runs import (
    env_for,
    events,
    heartbeat,
    rlsup,
    start_supervisor,
    stop_supervisor,
    wait_for,
    worker_pids,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

UUIDS = ["GPU-aaaa0000-0000-0000", "GPU-bbbb1111-1111-1111"]


def scenario(path: Path, used_mb: list[float], lost: int | None = None) -> None:
    gpus: list[dict[str, Any]] = [
        {"uuid": UUIDS[i], "total_mb": 16_000, "used_mb": used, "temp_c": 45}
        for i, used in enumerate(used_mb)
    ]
    if lost is not None:
        gpus[lost]["lost"] = True
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"init": "ok", "gpus": gpus}))
    tmp.replace(path)  # the supervisor's sampler never reads half a file


def cuda_visible(pid: int) -> str | None:
    """The worker's CUDA_VISIBLE_DEVICES; None when it exited since it was listed (a worker
    moved off a lost GPU is stopped: its pid goes at any moment)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    env = dict(e.decode().split("=", 1) for e in raw if b"=" in e)
    return env.get("CUDA_VISIBLE_DEVICES")


def live_gpu(state: Path, game: str) -> str | None:
    pids = worker_pids(state, game)
    return cuda_visible(pids[0]) if len(pids) == 1 else None


def test_real_supervisor_places_workers_and_moves_one_off_a_lost_gpu(tmp_path: Path) -> None:
    fake = tmp_path / "nvml.json"
    scenario(fake, [1_000, 3_000])
    config = write_config(tmp_path, [("a", 10_000_000), ("b", 10_000_000)])
    config.write_text(config.read_text().replace('device = "cpu"', 'device = "auto"'))
    env = env_for(tmp_path, RLSUP_FAKE_NVML=str(fake))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    state = tmp_path / "state"
    sup = start_supervisor(config, env)
    try:
        wait_for(lambda: all(heartbeat(state, g) for g in "ab"), 240, "both workers beating")
        # a first, on the emptier GPU 0; b on GPU 1 (one game per GPU while they fit).
        assert live_gpu(state, "a") == UUIDS[0]
        assert live_gpu(state, "b") == UUIDS[1]
        assigned = {e["game"]: e["detail"] for e in events(state, "gpu_assigned")}
        assert assigned["a"]["index"] == 0 and assigned["b"]["uuid"] == UUIDS[1]
        assert [e["detail"]["available"] for e in events(state, "gpu_driver")] == [True]
        out = rlsup("status", "--json", "--config", str(config), env=env)
        games = {g["name"]: g for g in json.loads(out.stdout)["games"]}
        assert games["a"]["gpu"] == {"index": 0, "uuid": UUIDS[0]}

        scenario(fake, [1_000, 3_000], lost=0)  # NVMLError_GpuIsLost on GPU 0
        wait_for(lambda: events(state, "gpu_lost"), 60, "gpu_lost")
        wait_for(lambda: live_gpu(state, "a") == UUIDS[1], 240, "a moved to GPU 1")
        lost = events(state, "gpu_lost")[0]["detail"]
        assert (lost["index"], lost["uuid"], lost["games"]) == (0, UUIDS[0], ["a"])
        moved = events(state, "gpu_assigned", "a")[-1]["detail"]
        assert moved["moved_from"] == {"index": 0, "uuid": UUIDS[0]}
        assert events(state, "worker_crash") == []
        assert live_gpu(state, "b") == UUIDS[1]  # untouched
    finally:
        stop_supervisor(sup)
    assert worker_pids(state, "a") == [] and worker_pids(state, "b") == []
