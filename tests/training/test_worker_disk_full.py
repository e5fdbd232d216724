"""A worker's own small files on a full disk (a real tmpfs): the heartbeat keeps going in place,
progress rows wait in memory and are appended once space returns (never half a row), a lost
log line is counted, not a crash."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from training.heartbeat import HeartbeatWriter, initial_heartbeat
from training.progress import ProgressLog
from training.protocol import HEARTBEAT_FILE, PROGRESS_FILE, read_heartbeat
from training.streams import TolerantStream

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs"),
]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs")
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> Path:
    ballast = directory / "ballast"
    with contextlib.suppress(OSError), open(ballast, "wb") as f:
        while True:
            f.write(b"\0" * 1024)
            f.flush()
    return ballast


def test_heartbeat_goes_on_in_place_on_a_full_disk(disk: Path) -> None:
    hb = HeartbeatWriter(disk, initial_heartbeat("CartPole-v1", "ppo", 100, "cpu"))
    hb.publish()
    fill(disk)
    for step in (10, 20, 30):
        hb.update(global_step=step)
        hb.publish()
    seen = read_heartbeat(disk)
    assert seen is not None and seen.global_step == 30, "the supervisor still sees progress"
    assert seen.write_failures["heartbeat"] == 3
    assert (disk / HEARTBEAT_FILE).stat().st_size % 4096 == 0
    assert not [p for p in disk.iterdir() if p.name.startswith(".heartbeat")], "no temp left"


def test_progress_rows_wait_for_space_and_never_land_half_written(disk: Path) -> None:
    failures: list[int] = []
    log = ProgressLog(disk, lambda: failures.append(1))
    log.append({"time": 1, "global_step": 1})
    ballast = fill(disk)
    for step in range(2, 400):  # more than any free block can hold
        log.append({"time": step, "global_step": step, "mean_return": "x" * 50})
    assert failures and len(log.pending) > 1
    rows = list(csv.DictReader(io.StringIO((disk / PROGRESS_FILE).read_text())))
    assert all(r["time"] and r["global_step"] for r in rows), "a half-written row"
    ballast.unlink()
    log.append({"time": 400, "global_step": 400})
    rows = list(csv.DictReader(io.StringIO((disk / PROGRESS_FILE).read_text())))
    assert [int(r["global_step"]) for r in rows] == list(range(1, 401)), "nothing lost"
    assert not log.pending


def test_a_log_line_that_cannot_be_written_is_counted_not_raised(disk: Path) -> None:
    raw = open(disk / "worker.log", "w", buffering=1)  # noqa: SIM115 - stderr is never closed
    fill(disk)
    stream = TolerantStream(raw)
    for _ in range(3):
        print(json.dumps({"event": "x" * 8192}), file=stream, flush=True)  # type: ignore[call-overload]
    assert stream.failures >= 3
    with contextlib.suppress(OSError):
        raw.close()
