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
