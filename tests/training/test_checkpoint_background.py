"""The background checkpoint writer (training/checkpointing.py) with real learners and a real
store: a SIGKILL while its thread writes (training going on meanwhile) leaves the previous
checkpoint in force and the next start loads a whole one; a checkpoint due while one is written
is taken once it commits; a write that fails on a full disk leaves the previous one, is reported
and the next one commits; a capture that would not fit in memory is taken synchronously with an
event; the host copies the loop takes are the state of that instant, whatever the loop does
next."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
from bg_ckpt_child import config
from workerutil import run

from checkpoints import CheckpointStore
from harness.tmpfs import mounted_tmpfs
from training.args import WorkerConfig, validate
from training.checkpointing import (
    MEM_AVAILABLE_ENV,
    WRITE_DELAY_ENV,
    Checkpointer,
    CheckpointResult,
    restore_learner,
)
from training.registry import make_learner

CHILD = Path(__file__).with_name("bg_ckpt_child.py")
REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def _ppo() -> Any:
    settings: dict[str, Any] = {"game": "CartPole-v1", "algo": "ppo", "num_envs": 4}
    settings.update(n_steps=16, batch_size=64, threads=1, eval_episodes=0, total_steps=10**9)
    cfg = validate(WorkerConfig(**settings))
    torch.set_num_threads(1)
    return cfg, make_learner(cfg, CPU, 1)


def _checkpointer(root: Path, cfg: WorkerConfig) -> tuple[Checkpointer, list[CheckpointResult]]:
    results: list[CheckpointResult] = []
    store = CheckpointStore(root, keep=3)
    return Checkpointer(store, cfg, structlog.get_logger(), results.append), results


def _only_checkpoints(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# ---- a kill while the writer thread writes ----------------------------------------------------


def _child(root: Path, mode: str, arg: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(root), mode, arg],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_kill_while_the_writer_thread_writes_leaves_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    out = tmp_path / "points.json"
    assert _child(tmp_path / "record", "record", str(out)).wait(120) == 0
    recorded = json.loads(out.read_text())
    points, (old_step, new_step) = recorded["points"], recorded["steps"]
    replay = [p for p in points if p.startswith("after_chunk:replay/")]
    assert len(replay) > 10, "the ring should span many chunks"
    chosen = [
        next(p for p in points if p == "after_chunk:learner.pt"),
        replay[len(replay) // 2],  # mid-way through the replay chunks
        "before_manifest",
        "after_manifest",
        "before_rename",
        "after_rename",
    ]
    runs = []
    for i, point in enumerate(chosen):
        runs.append((point, tmp_path / f"kill-{i}", _child(tmp_path / f"kill-{i}", "kill", point)))
    renamed_at = points.index("after_rename")
    for point, root, proc in runs:
        assert proc.wait(timeout=180) == -signal.SIGKILL, point
        committed = points.index(point) >= renamed_at
        store = CheckpointStore(root, keep=3)
        store.sweep()  # what the next start does first
        assert all(n.startswith("ckpt-") for n in _only_checkpoints(root)), point
        loaded = store.load_latest()
        assert loaded is not None and not loaded.quarantined and not loaded.damaged, point
        assert loaded.step == (new_step if committed else old_step), point
        # The next start loads it whole: the learner, its RNGs and the replay buffer.
        learner = make_learner(config(), CPU, 1)
        try:
            counters = restore_learner(loaded, learner, CPU)
            assert counters["n"] == (2 if committed else 1)
            assert learner.global_step == loaded.step
            assert learner.replay is not None and len(learner.replay) > 0
        finally:
            learner.close()


# ---- a checkpoint due while one is written ---------------------------------------------------


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_checkpoint_due_while_one_is_written_is_taken_once_it_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real worker with a checkpoint due every iteration (32 agent steps of CartPole PPO, a
    few ms) and writes that take longer (held 30 ms before they commit, as on a slow disk: how
    fast this machine's disk fsyncs must not decide it): every refusal is logged, and each is
    followed by a checkpoint of a later step. None is dropped for good."""
    monkeypatch.setenv(WRITE_DELAY_ENV, "0.03")
    run_dir = tmp_path / "run"
    args = [
        "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "8",
        "--batch-size", "32", "--epochs", "1", "--threads", "1", "--eval-episodes", "0",
        "--checkpoint-every-steps", "32", "--total-steps", "4000", "--keep-checkpoints", "2",
    ]  # fmt: skip
    proc = run(run_dir, *args, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("{")]
    deferred = [x for x in lines if x.get("event") == "checkpoint_deferred"]
    committed = [x["step"] for x in lines if x.get("event") == "checkpoint"]
    assert deferred, "no checkpoint fell due while one was written: the test proves nothing"
    for d in deferred:
        assert d["in_flight_step"] < d["step"]
        assert any(step >= d["step"] for step in committed), d
    assert committed == sorted(committed) and committed[-1] == 4000


# ---- a write that fails on a full disk -------------------------------------------------------


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tiny", "size=2m,mode=0700") as mnt:
        yield mnt


@pytest.mark.e2e
def test_a_background_write_on_a_full_disk_leaves_the_previous_and_the_next_commits(
    tiny_tmpfs: Path,
) -> None:
    cfg, learner = _ppo()
    root = tiny_tmpfs / "checkpoints"
    ck, results = _checkpointer(root, cfg)
    try:
        learner.iterate()
        assert ck.save_sync(learner, {"n": 1}).ok
        first = learner.global_step
        ballast = tiny_tmpfs / "ballast"
        with open(ballast, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        learner.iterate()
        t0 = time.monotonic()
        assert ck.save_async(learner, {"n": 2})
        paused = time.monotonic() - t0
        iterations = 0
        while ck.in_flight:
            learner.iterate()  # never stalled by the failing write
            iterations += 1
        ck.wait()
        failed = results[-1]
        assert not failed.ok and "No space left" in (failed.error or "")
        assert failed.pause_s <= paused
        assert _only_checkpoints(root) == [f"ckpt-{first:012d}"]  # no staging, no half one
        loaded = CheckpointStore(root).load_latest()
        assert loaded is not None and loaded.step == first
        ballast.unlink()
        learner.iterate()
        assert ck.save_async(learner, {"n": 3})
        ck.wait()
        assert results[-1].ok and results[-1].step == learner.global_step > first
    finally:
        learner.close()


# ---- a capture that would not fit in memory --------------------------------------------------


def test_a_capture_that_would_not_fit_in_memory_is_taken_synchronously_with_an_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, learner = _ppo()
    ck, results = _checkpointer(tmp_path / "checkpoints", cfg)
    try:
        learner.iterate()
        monkeypatch.setenv(
            MEM_AVAILABLE_ENV, str(64 << 20)
        )  # the margin alone: no room for the copies
        with structlog.testing.capture_logs() as logs:
            assert ck.save_async(learner, {"n": 1})
        assert not ck.in_flight  # written in the loop, not on a thread
        [result] = results
        assert result.ok and result.sync_fallback is not None
        assert result.pause_s == result.seconds  # the loop waited for the whole write
        [event] = [x for x in logs if x["event"] == "checkpoint_sync_fallback"]
        assert event["step"] == learner.global_step
        assert re.search(r"needs \d+ bytes .* but 67108864 bytes are available", event["reason"])
        monkeypatch.setenv(MEM_AVAILABLE_ENV, str(64 << 30))
        learner.iterate()
        assert ck.save_async(learner, {"n": 2})
        ck.wait()
        assert results[-1].ok and results[-1].sync_fallback is None
        assert results[-1].pause_s < results[-1].seconds
        # What the write took from the cores besides the pause: its own thread's CPU time.
        assert 0 < results[-1].cpu_s <= results[-1].seconds
        assert 0 < result.cpu_s <= result.seconds
    finally:
        learner.close()


# ---- the host copies are the state of the capture's instant ----------------------------------


def test_the_background_checkpoint_holds_the_state_of_its_capture(tmp_path: Path) -> None:
    cfg, learner = _ppo()
    ck, results = _checkpointer(tmp_path / "checkpoints", cfg)
    try:
        learner.iterate()
        expected = {k: v.clone() for k, v in learner.state_dict()["net"].items()}
        step = learner.global_step
        cap = ck.capture(learner, {"n": 1}, background=True)
        for _ in range(3):
            learner.iterate()  # the loop changes weights and optimizer in place
        with torch.no_grad():
            for p in learner.net.parameters():
                p.add_(1.0)
        ck._write(cap, pause_s=0.0)
        assert results[-1].ok and results[-1].step == step
        loaded = CheckpointStore(tmp_path / "checkpoints").load_latest()
        assert loaded is not None
        fresh = make_learner(cfg, CPU, 1)
        try:
            restore_learner(loaded, fresh, CPU)
            got = fresh.state_dict()["net"]
            assert all(torch.equal(got[k], expected[k]) for k in expected)
            assert fresh.global_step == step
        finally:
            fresh.close()
        # The next capture reuses the same host buffers (no allocation once warm).
        held = ck._copies.nbytes
        ck.capture(learner, {"n": 2}, background=True)
        assert ck._copies.nbytes == held > 0
    finally:
        learner.close()
