"""A lost machine: a DQN game trains under `rlsup run` with the mirror on (a real SeaweedFS);
the whole state dir is deleted; `rlsup run` on the empty state dir resumes the game from the
newest mirrored checkpoint (learner and replay verified by their sha256) and finishes it."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
from pathlib import Path

import psutil
import pytest

from checkpoints.remote import RemoteLocation, RemoteStore, make_client
from harness.runs import (
    env_for,
    events,
    heartbeat,
    rlsup,
    start_supervisor,
    wait_for,
    write_config,
)
from harness.seaweed import Weed
from tests.mirror.conftest import BUCKET, TEST_AWS_ENV, prefix_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
TOTAL = 24_000


def _config(tmp_path: Path, weed: Weed, url: str) -> Path:
    path = write_config(tmp_path, [])
    dqn = (
        '[[games]]\nname = "dqn"\nenv_id = "CartPole-v1"\nalgo = "dqn"\n'
        f'total_steps = {TOTAL}\nseed = 3\ndevice = "cpu"\n'
        "args = { eval_episodes = 0, buffer_size = 20000, learning_starts = 1000,"
        " replay_chunk_kib = 64 }\n"
    )
    mirror = f'[mirror]\nurl = "{url}"\nendpoint_url = "{weed.endpoint}"\nkeep = 3\n'
    path.write_text(path.read_text() + dqn + mirror)
    return path


def test_a_lost_machine_resumes_from_the_mirror(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = f"s3://{BUCKET}/{prefix_for(request)}"
    config = _config(tmp_path, weed, url)
    env = env_for(tmp_path, **TEST_AWS_ENV)
    state = tmp_path / "state"
    remote = RemoteStore(make_client(weed.endpoint, "us-east-1"), RemoteLocation.parse(url))

    sup = start_supervisor(config, env)
    try:
        wait_for(lambda: len(remote.manifest_steps("dqn")) >= 3, 180, "3 mirrored checkpoints")
        status = json.loads(rlsup("status", "--json", "--config", str(config), env=env).stdout)
        [game] = status["games"]
        assert game["mirror_step"] is not None and game["mirror_age_s"] is not None
        human = rlsup("status", "--config", str(config), env=env).stdout
        assert "mirrored: dqn " in human, human
    finally:
        sup.send_signal(signal.SIGKILL)  # the machine is gone: no goodbye
        sup.wait(30)
        wait_for(lambda: heartbeat(state, "dqn") is None or not _alive(state), 30, "worker gone")
        wait_for(lambda: not _uploaders(config), 30, "the uploader gone with its supervisor")
    assert events(state, "mirror_ok", "dqn"), "each mirrored checkpoint is an event"
    mirrored = remote.manifest_steps("dqn")[-1]
    manifest = json.loads(remote.get_manifest("dqn", mirrored))

    shutil.rmtree(state)  # a wiped disk: nothing local is left
    done = rlsup("run", "--config", str(config), "--exit-when-done", env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    [restored] = events(state, "mirror_restored", "dqn")
    assert restored["detail"]["step"] >= mirrored
    step = restored["detail"]["step"]
    if step == mirrored:
        assert restored["detail"]["bytes"] == sum(e["size"] for e in manifest["files"].values())
    hb = heartbeat(state, "dqn")
    assert hb is not None and hb["global_step"] >= TOTAL
    with open(state / "runs" / "dqn" / "progress.csv") as f:
        first = next(csv.DictReader(f))
    assert int(first["global_step"]) > step, "the new machine went on from the mirrored step"
    assert not events(state, "worker_crash")
    assert not _uploaders(config), "the uploader stops with the supervisor"


def _alive(state: Path) -> bool:
    hb = heartbeat(state, "dqn")
    if hb is None:
        return False
    try:
        os.kill(hb["pid"], 0)
    except ProcessLookupError:
        return False
    return True


def _uploaders(config: Path) -> list[int]:
    """Uploader processes of this test's configuration still running."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        alive = p.info["status"] != psutil.STATUS_ZOMBIE
        if alive and "supervisor.mirror.uploader" in cmd and str(config) in cmd:
            found.append(p.pid)
    return found
