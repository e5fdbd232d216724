"""A real worker restores from the mirror when every local checkpoint is damaged (they are
quarantined, the mirror's copy is whole): it resumes from the mirrored step, not from zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoints import CheckpointStore
from checkpoints.mirror import upload_checkpoint
from harness.seaweed import TEST_AWS_ENV, Weed
from tests.mirror.conftest import remote_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PPO = (
    "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "64",
    "--batch-size", "64", "--threads", "1", "--eval-episodes", "0",
    "--checkpoint-every-steps", "1000",
)  # fmt: skip


def _worker(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "training.worker", "--run-dir", str(run_dir), *PPO, *args],
        cwd=REPO,
        env={**os.environ, **TEST_AWS_ENV, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_every_local_checkpoint_damaged_restores_from_the_mirror(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url, remote = remote_for(weed, request)
    run_dir = tmp_path / "run"
    first = _worker(run_dir, "--total-steps", "3000")
    assert first.returncode == 0, first.stderr[-2000:]
    store = CheckpointStore(run_dir / "checkpoints")
    newest = store.committed()[-1]
    upload_checkpoint(remote, "g", newest)
    # The local disk rots under every checkpoint's learner. The mirror holds the newest's
    # blob, but a learner is never patched from it file by file (only a replay chunk is:
    # test_a_rotten_chunk_...): the whole mirrored checkpoint is restored.
    for ref in store.committed():
        path = ref.path / "learner.pt"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    mirror = ("--mirror-url", url, "--mirror-endpoint-url", weed.endpoint, "--mirror-name", "g")
    again = _worker(run_dir, "--total-steps", "6000", *mirror)
    assert again.returncode == 0, again.stderr[-3000:]
    hb = json.loads((run_dir / "heartbeat.json").read_text())
    assert hb["resumed_from_step"] == newest.step, "from the mirrored step, not from zero"
    assert hb["mirror_restore"]["step"] == newest.step
    assert len(hb["quarantined"]) >= 1 and list((run_dir / "checkpoints").glob(".corrupt-*"))
    assert hb["global_step"] >= 6000

    # Without a mirror the same damage refuses to start from zero (exit 78), as before.
    for ref in store.committed():
        path = ref.path / "learner.pt"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    refused = _worker(run_dir, "--total-steps", "9000")
    assert refused.returncode == 78


# DQN with a ring of many small chunks (CartPole frames are 16 bytes: 64 slots a chunk), so
# that most chunks are cold and every retained checkpoint hard-links the same inodes.
DQN = (
    "--game", "CartPole-v1", "--algo", "dqn", "--num-envs", "4", "--threads", "1",
    "--eval-episodes", "0", "--batch-size", "32", "--buffer-size", "3000",
    "--learning-starts", "200", "--replay-chunk-kib", "1", "--checkpoint-every-steps", "512",
    "--keep-checkpoints", "3",
)  # fmt: skip


def _dqn(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "training.worker", "--run-dir", str(run_dir), *DQN, *args],
        cwd=REPO,
        env={**os.environ, **TEST_AWS_ENV, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_rotten_chunk_every_checkpoint_shares_comes_back_from_the_mirror(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Without a mirror its transitions are dropped (tests/training); with one, the mirror's
    blob of the chunk's sha256 replaces it in every checkpoint: nothing is lost."""
    url, remote = remote_for(weed, request)
    run_dir = tmp_path / "run"
    first = _dqn(run_dir, "--total-steps", "4096")
    assert first.returncode == 0, first.stderr[-2000:]
    store = CheckpointStore(run_dir / "checkpoints")
    newest = store.committed()[-1]
    upload_checkpoint(remote, "g", newest)
    shared = [
        p
        for p in sorted((newest.path / "replay").glob("frames-*.bin"))
        if os.stat(p).st_nlink == 3  # one inode in all three retained checkpoints
    ]
    assert shared, "expected cold chunks linked by every retained checkpoint"
    data = bytearray(shared[0].read_bytes())
    data[40] ^= 0x01
    with open(shared[0], "r+b") as f:  # in place: every link sees it
        f.write(data)

    mirror = ("--mirror-url", url, "--mirror-endpoint-url", weed.endpoint, "--mirror-name", "g")
    again = _dqn(run_dir, "--total-steps", "6144", *mirror)
    assert again.returncode == 0, again.stderr[-3000:]
    hb = json.loads((run_dir / "heartbeat.json").read_text())
    assert hb["resumed_from_step"] == newest.step
    [damage] = hb["replay_damage"]
    name = f"replay/{shared[0].name}"
    assert damage["files"] == [name] and damage["transitions_dropped"] == 0
    assert damage["repaired"][name].startswith("the mirror s3://")
    assert hb["quarantined"] == [] and hb.get("mirror_restore") is None, "not a restore"
