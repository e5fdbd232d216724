"""`rlsup pull --game G` against a real SeaweedFS: restores the newest mirrored checkpoint,
does nothing when the local one is as new, and never writes while a worker holds the run dir."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import numpy as np
import pytest

import rlsup as sdk
from checkpoints import CheckpointStore
from checkpoints.mirror import upload_checkpoint
from harness.runs import env_for, rlsup, write_config
from harness.seaweed import TEST_AWS_ENV, Weed
from tests.mirror.conftest import remote_for

pytestmark = pytest.mark.e2e


def test_pull_restores_once_and_respects_a_running_worker(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url, remote = remote_for(weed, request)
    other = CheckpointStore(tmp_path / "elsewhere")
    w = other.begin(700, {"game": "CartPole-v1", "algo": "ppo"})
    w.write_bytes("learner.pt", os.urandom(10_000))
    w.commit()
    upload_checkpoint(remote, "g", other.committed()[-1])

    config = write_config(tmp_path, [("g", 1000)])
    config.write_text(
        config.read_text() + f'[mirror]\nurl = "{url}"\nendpoint_url = "{weed.endpoint}"\n'
    )
    env = env_for(tmp_path, **TEST_AWS_ENV)
    run_dir = tmp_path / "state" / "runs" / "g"

    first = rlsup("pull", "--game", "g", "--config", str(config), env=env)
    assert first.returncode == 0, first.stderr
    assert "restored ckpt step 700" in first.stdout
    local = CheckpointStore(run_dir / "checkpoints")
    assert [r.step for r in local.committed()] == [700]
    local.verify(local.committed()[-1])

    again = rlsup("pull", "--game", "g", "--config", str(config), env=env)
    assert again.returncode == 0 and "nothing to pull" in again.stdout

    fd = os.open(run_dir / "worker.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a worker runs
        held = rlsup("pull", "--game", "g", "--config", str(config), env=env)
    finally:
        os.close(fd)
    assert held.returncode == 73 and "stop g first" in held.stderr

    bad = rlsup("pull", "--game", "nope", "--config", str(config), env=env)
    assert bad.returncode == 2 and "no game 'nope'" in bad.stderr


def test_pull_restores_a_command_games_own_checkpoint(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A command game's checkpoint holds the script's own meta (the SDK's, and an `algo` of
    the script's choosing): nothing of rlsup's worker to compare it with, so it is restored."""
    url, remote = remote_for(weed, request)
    other = CheckpointStore(tmp_path / "elsewhere")
    w = other.begin(300, {"sdk": 1, "name": "mine", "algo": "PPO"})
    w.write_bytes("state.json", b"{}")
    w.commit()
    upload_checkpoint(remote, "mine", other.committed()[-1])

    config = tmp_path / "rlsup.toml"
    config.write_text(
        'state_dir = "state"\n[modes.light]\nnum_envs = 1\nbatch_size = 8\nn_steps = 8\n'
        'max_concurrent = 1\n[[games]]\nname = "mine"\ncommand = ["python", "train.py"]\n'
        f'[mirror]\nurl = "{url}"\nendpoint_url = "{weed.endpoint}"\n'
    )
    out = rlsup(
        "pull", "--game", "mine", "--config", str(config), env=env_for(tmp_path, **TEST_AWS_ENV)
    )
    assert out.returncode == 0, out.stderr
    assert "restored ckpt step 300" in out.stdout
    local = CheckpointStore(tmp_path / "state" / "runs" / "mine" / "checkpoints")
    assert [r.step for r in local.committed()] == [300]


def _sdk_run(run_dir: Path, monkeypatch: pytest.MonkeyPatch, steps: range) -> np.ndarray:
    """An SDK script's checkpoints (keep 3): a buffer whose first chunk changes at each one,
    the other three never (one inode, hard-linked into every kept checkpoint)."""
    for name in list(os.environ):
        if name.startswith("RLSUP_"):
            monkeypatch.delenv(name)
    buf = np.random.default_rng(0).integers(0, 255, size=(64, 1024), dtype=np.uint8)
    with sdk.attach(run_dir, keep=3, handle_signals=False) as run:
        for step in steps:
            buf[step % 16] = step
            with run.checkpoint(step):
                run.save_arrays("replay", buf, chunk_bytes=16 * 1024)
    return buf


def _flip(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)[0]
        f.seek(100)
        f.write(bytes([byte ^ 0x10]))


def _command_game_config(tmp_path: Path, url: str, endpoint: str) -> Path:
    config = tmp_path / "rlsup.toml"
    config.write_text(
        'state_dir = "state"\n[modes.light]\nnum_envs = 1\nbatch_size = 8\nn_steps = 8\n'
        'max_concurrent = 1\n[[games]]\nname = "g"\ncommand = ["python", "train.py"]\n'
        f'[mirror]\nurl = "{url}"\nendpoint_url = "{endpoint}"\n'
    )
    return config


def test_pull_repair_restores_a_chunk_every_checkpoint_shares_from_the_mirror(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK cannot reach the mirror (no boto3 in its closure); the supervisor side can:
    `rlsup pull --repair` puts the mirror's blob of the damaged chunk's sha256 back in every
    checkpoint that shares it, and the script's next start loads everything exactly."""
    url, remote = remote_for(weed, request)
    config = _command_game_config(tmp_path, url, weed.endpoint)
    run_dir = tmp_path / "state" / "runs" / "g"
    buf = _sdk_run(run_dir, monkeypatch, range(1, 5))
    store = CheckpointStore(run_dir / "checkpoints")
    upload_checkpoint(remote, "g", store.committed()[-1])
    shared = store.committed()[-1].path / "arrays" / "replay.000003"
    assert os.stat(shared).st_nlink == 3
    _flip(shared)

    out = rlsup("pull", "--game", "g", "--repair", "--config", str(config),
                env=env_for(tmp_path, **TEST_AWS_ENV))  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ckpt-000000000004: repaired arrays/replay.000003 from the mirror" in out.stdout
    for ref in store.committed():
        store.verify(ref)
    with sdk.attach(run_dir, handle_signals=False) as run:
        assert run.latest() == store.committed()[-1].path
        assert run.damaged_rows("replay") == []
        assert np.array_equal(run.load_arrays("replay"), buf)


def test_pull_repair_says_what_the_mirror_cannot_repair(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = remote_for(weed, request)  # nothing mirrored
    config = _command_game_config(tmp_path, url, weed.endpoint)
    run_dir = tmp_path / "state" / "runs" / "g"
    _sdk_run(run_dir, monkeypatch, range(1, 4))
    store = CheckpointStore(run_dir / "checkpoints")
    _flip(store.committed()[-1].path / "arrays" / "replay.000003")
    out = rlsup("pull", "--game", "g", "--repair", "--config", str(config),
                env=env_for(tmp_path, **TEST_AWS_ENV))  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    for step in (1, 2, 3):
        assert f"ckpt-{step:012d}: still damaged: arrays/replay.000003" in out.stderr
    assert [r.step for r in store.committed()] == [1, 2, 3], "nothing moved or deleted"
