"""Checkpoint faults that real hosts produce, against a real worker process: rot in a replay
chunk shared by every retained checkpoint, read errors, a run dir trained for another game,
and running out of memory while restoring."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from workerutil import committed_steps, heartbeat, run

from checkpoints import CheckpointStore
from checkpoints._faults import ENV as FAULT_ENV

pytestmark = pytest.mark.e2e

# DQN with a ring of many small chunks (CartPole frames are 16 bytes: 64 slots a chunk), so
# that most chunks are cold and every retained checkpoint hard-links the same inodes.
DQN = (
    "--game", "CartPole-v1", "--algo", "dqn", "--num-envs", "4", "--threads", "1",
    "--eval-episodes", "0", "--batch-size", "32", "--buffer-size", "3000",
    "--learning-starts", "200", "--replay-chunk-kib", "1", "--checkpoint-every-steps", "512",
    "--keep-checkpoints", "3",
)  # fmt: skip
PPO = (
    "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "64",
    "--batch-size", "64", "--threads", "1", "--eval-episodes", "0",
    "--checkpoint-every-steps", "512",
)  # fmt: skip


def ckpts(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("ckpt-*"))


def error_json(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "error.json").read_text())
    return data


def flip_bit(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(40)
        byte = f.read(1)[0]
        f.seek(40)
        f.write(bytes([byte ^ 0x01]))


def test_rot_in_a_replay_chunk_shared_by_every_checkpoint_costs_only_its_transitions(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    first = run(run_dir, *DQN, "--total-steps", "4096")
    assert first.returncode == 0, first.stderr[-2000:]
    dirs = ckpts(run_dir)
    assert len(dirs) == 3
    shared = [
        p
        for p in sorted((dirs[-1] / "replay").glob("frames-*.bin"))
        if os.stat(p).st_nlink == 3  # the same inode in all three retained checkpoints
    ]
    assert shared, "expected cold chunks linked by every retained checkpoint"
    flip_bit(shared[0])
    newest = int(dirs[-1].name[5:])

    again = run(run_dir, *DQN, "--total-steps", "6144")
    assert again.returncode == 0, again.stderr[-3000:]
    hb = heartbeat(run_dir)
    assert hb is not None
    assert hb["resumed_from_step"] == newest, "the learner resumes from the newest exactly"
    [damage] = hb["replay_damage"]
    assert damage["when"] == "load" and damage["checkpoint"] == dirs[-1].name
    assert damage["files"] == [f"replay/{shared[0].name}"]
    assert damage["chunks"] == [int(shared[0].stem.split("-")[1])]
    assert damage["transitions_dropped"] > 0
    assert hb["quarantined"] == []
    assert not list((run_dir / "checkpoints").glob(".corrupt-*"))
    # The damage never reaches a new checkpoint: every byte of the newest verifies.
    store = CheckpointStore(run_dir / "checkpoints")
    latest = store.latest()
    assert latest is not None and latest.step >= 6144
    store.verify(latest)


@pytest.mark.parametrize("errno_name", ["EIO", "EACCES"])
def test_read_error_exits_checkpoint_unreadable_and_moves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_name: str
) -> None:
    run_dir = tmp_path / "run"
    assert run(run_dir, *PPO, "--total-steps", "2048").returncode == 0
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    newest = committed_steps(run_dir)[-1]
    control = tmp_path / "faults"
    control.write_text(f"{errno_name} {run_dir / 'checkpoints'}/\n")
    monkeypatch.setenv(FAULT_ENV, str(control))
    failed = run(run_dir, *PPO, "--total-steps", "4096")
    assert failed.returncode == 1, failed.stderr[-2000:]
    error = error_json(run_dir)
    assert error["kind"] == "checkpoint_unreadable"
    assert os.strerror(getattr(errno, errno_name)) in error["message"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    control.write_text("")  # the cause is gone: the same newest checkpoint loads
    again = run(run_dir, *PPO, "--total-steps", "4096")
    assert again.returncode == 0, again.stderr[-2000:]
    hb = heartbeat(run_dir)
    assert hb is not None and hb["resumed_from_step"] == newest


def test_a_run_dir_trained_for_another_game_is_refused_naming_both(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert run(run_dir, *PPO, "--total-steps", "1024").returncode == 0
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    other = [a if a != "CartPole-v1" else "Acrobot-v1" for a in PPO]
    refused = run(run_dir, *other, "--total-steps", "2048")
    assert refused.returncode == 78, refused.stderr[-2000:]
    error = error_json(run_dir)
    assert error["kind"] == "checkpoint_mismatch"
    assert "CartPole-v1 / ppo" in error["message"] and "Acrobot-v1 / ppo" in error["message"]
    assert "to start this game fresh, move" in error["message"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before


@pytest.mark.parametrize(
    ("oom", "kind"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "cuda_oom"),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                "memory: you tried to allocate 8589934592 bytes. Error code 12"
            ),
            "host_oom",
        ),
        # cuDNN's own words name no "CUDA": the GPU's all the same (was reported host_oom).
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cuda_oom"),
    ],
    ids=["cuda", "cpu-allocator", "cudnn"],
)
def test_out_of_memory_while_restoring_exits_76(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, oom: Exception, kind: str
) -> None:
    """In-process, with torch.load raising what an allocator raises: exit 76 (the policy steps
    down), not 78 (a configuration error that would make the game FATAL), with error.json's
    kind naming the memory that ran out."""
    from training import checkpointing
    from training.entry import StopRequested, Worker

    run_dir = tmp_path / "run"
    assert run(run_dir, *PPO, "--total-steps", "1024").returncode == 0
    from training.args import WorkerConfig

    cfg = WorkerConfig.from_argv(["--run-dir", str(run_dir), *PPO, "--total-steps", "2048"])

    def failing_load(*args: object, **kwargs: object) -> object:
        raise oom

    monkeypatch.setattr(checkpointing.torch, "load", failing_load)
    code = Worker(cfg, run_dir, StopRequested()).run()
    assert code == 76
    assert error_json(run_dir)["kind"] == kind
    assert not list((run_dir / "checkpoints").glob(".corrupt-*"))
