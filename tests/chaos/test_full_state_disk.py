"""The whole state dir on a filesystem that fills up for a while, then frees: SQLite, worker
logs, heartbeats, progress.csv and checkpoints all fail to write at once. The supervisor keeps
supervising from memory, the worker keeps training (not mistaken for a hang), and once space
returns the events of the outage are written and nothing committed before is lost."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from harness.runs import (
    committed_step,
    env_for,
    events,
    heartbeat,
    kill_quietly,
    start_supervisor,
    wait_for,
    worker_pids,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]
FULL_S = 12.0


def fill(directory: Path) -> Path:
    ballast = directory / ".ballast"
    with contextlib.suppress(OSError), open(ballast, "wb") as f:
        while True:
            f.write(b"\0" * (1 << 20))
            f.flush()
    with contextlib.suppress(OSError), open(directory / ".ballast-tail", "wb") as f:
        while True:  # the last partial blocks too
            f.write(b"\0" * 4096)
            f.flush()
    return ballast


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
def test_a_full_state_disk_is_survived_and_its_events_are_written_once_space_returns(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48M,mode=0700", "tmpfs", str(state)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    config = write_config(tmp_path, [("cp", 10**9)], watchdog="")
    env = env_for(tmp_path)
    sup = start_supervisor(config, env, log=tmp_path / "supervisor.log")
    try:
        wait_for(lambda: committed_step(state, "cp") > 0, 120, "a first checkpoint")
        worker = worker_pids(state, "cp")
        assert len(worker) == 1
        before_ckpt = committed_step(state, "cp")
        conn = sqlite3.connect(state / "rlsup.db")
        events_before = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        conn.close()

        t_full = time.time()
        ballast = fill(state)
        step_at_full = (heartbeat(state, "cp") or {})["global_step"]
        time.sleep(FULL_S)

        # Still supervising, still the same worker, still training (in-place heartbeats).
        assert sup.poll() is None, "the supervisor exited on a full state disk"
        assert worker_pids(state, "cp") == worker, "the worker was restarted on a full disk"
        hb = heartbeat(state, "cp") or {}
        assert hb["pid"] == worker[0] and hb["global_step"] > step_at_full
        assert hb["write_failures"].get("heartbeat", 0) > 0
        assert hb["checkpoint_failures"] >= 1

        for path in (ballast, state / ".ballast-tail"):
            path.unlink()
        t_free = time.time()
        wait_for(lambda: events(state, "state_db_unavailable"), 60, "the outage's event")
        wait_for(lambda: committed_step(state, "cp") > before_ckpt, 60, "a checkpoint again")
        [outage] = events(state, "state_db_unavailable")
        assert outage["detail"]["writes_waited"] > 0
        assert outage["detail"]["seconds"] >= FULL_S * 0.5
        # What happened while the disk was full reached the database afterwards, in order.
        during = [e for e in events(state) if t_full <= e["ts"] <= t_free]
        kinds = {e["kind"] for e in during}
        assert {"checkpoint_failed", "write_failed"} <= kinds, kinds
        assert [e["id"] for e in events(state)] == sorted(e["id"] for e in events(state))
        assert len(events(state)) > events_before
        assert not events(state, "worker_hang") and not events(state, "worker_crash")
        conn = sqlite3.connect(state / "rlsup.db")
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
        log = (tmp_path / "supervisor.log").read_text()
        assert "tick_failed" not in log
    finally:
        kill_quietly(sup.pid)
        sup.wait(30)
        for pid in worker_pids(state, "cp"):
            kill_quietly(pid)
        deadline = time.monotonic() + 30
        while worker_pids(state, "cp") and time.monotonic() < deadline:
            time.sleep(0.2)
        subprocess.run(["umount", "-l", str(state)], capture_output=True)
