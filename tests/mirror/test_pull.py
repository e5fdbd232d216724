"""`rlsup pull --game G` against a real SeaweedFS: restores the newest mirrored checkpoint,
does nothing when the local one is as new, and never writes while a worker holds the run dir."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from checkpoints import CheckpointStore
from checkpoints.mirror import upload_checkpoint
from tests.mirror.conftest import TEST_AWS_ENV, remote_for
from tests.mirror.seaweed import Weed
from tests.supervisor.helpers import env_for, rlsup, write_config


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
