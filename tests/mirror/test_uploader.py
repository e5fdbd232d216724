"""The uploader process under faults, driven by the supervisor's handle (`Uploader`): killed
mid-upload (no manifest without its blobs; restarted, it finishes), the S3 server stopped for
a while (failures counted and reported, then it catches up), against a real SeaweedFS."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from checkpoints import CheckpointStore
from checkpoints.mirror import restore_newest
from checkpoints.remote import RemoteLocation, RemoteStore, make_client
from harness.runs import wait_for, write_config
from harness.seaweed import TEST_AWS_ENV, start_weed
from supervisor.config import load_config
from supervisor.mirror.state import MirrorState
from supervisor.mirror.uploader import Uploader

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_uploader_killed_mid_upload_and_store_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in TEST_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    weed = start_weed(tmp_path / "weed")
    up: Uploader | None = None
    try:
        url = "s3://rlsup-up/runs"
        config = write_config(tmp_path, [("g", 1000)])
        config.write_text(
            config.read_text()
            + f'[mirror]\nurl = "{url}"\nendpoint_url = "{weed.endpoint}"\n'
            + "bandwidth_mb_s = 1\nconcurrency = 1\nchunk_mb = 5\n"
        )
        cfg = load_config(config)
        store = CheckpointStore(cfg.run_dir("g") / "checkpoints")
        w = store.begin(100, {"game": "CartPole-v1", "algo": "ppo"})
        for i in range(6):  # 6 MiB at 1 MB/s: an upload of about 6 s
            w.write_bytes(f"replay/frames-{i:06d}.bin", os.urandom(1 << 20))
        w.commit()
        remote = RemoteStore(make_client(weed.endpoint, "us-east-1"), RemoteLocation.parse(url))
        seen: list[tuple[str, str | None, dict[str, Any]]] = []
        up = Uploader(cfg, lambda kind, game, detail: seen.append((kind, game, detail)))

        # Killed mid-upload: some blobs, no manifest.
        up.tick(time.monotonic())
        wait_for(lambda: len(_blobs(remote)) >= 2, 60, "two blobs uploaded")
        assert up.proc is not None
        os.kill(up.proc.pid, signal.SIGKILL)
        assert remote.manifest_steps("g") == [], "no manifest before all of its blobs"
        wait_for(lambda: _tick(up) and any(k == "uploader_exit" for k, _, _ in seen), 10, "exit")
        [(_, _, exit_detail)] = [e for e in seen if e[0] == "uploader_exit"]
        assert exit_detail["returncode"] == -signal.SIGKILL

        # The store goes down before the restarted uploader finishes: failures, then catch-up.
        weed.stop()
        wait_for(lambda: _tick(up) and any(k == "mirror_failed" for k, _, _ in seen), 90,
                 "a mirror_failed event")  # fmt: skip
        state = MirrorState.read(cfg.state_dir)
        assert state is not None and state.games["g"].failures >= 1
        assert state.games["g"].last_error and state.games["g"].step is None
        weed = start_weed(tmp_path / "weed", ports=weed.ports)
        wait_for(lambda: _tick(up) and any(k == "mirror_ok" for k, _, _ in seen), 120,
                 "mirror_ok once the store is back")  # fmt: skip
        [(_, game, ok)] = [e for e in seen if e[0] == "mirror_ok"]
        assert game == "g" and ok["step"] == 100
        assert remote.manifest_steps("g") == [100]
        restored = restore_newest(remote, "g", CheckpointStore(tmp_path / "elsewhere"))
        assert restored is not None and restored.step == 100
    finally:
        if up is not None:
            up.stop()
        weed.stop()


def _tick(up: Uploader) -> bool:
    up.tick(time.monotonic())
    time.sleep(0.2)
    return True


def _blobs(remote: RemoteStore) -> dict[str, float]:
    try:
        return remote.blobs()
    except Exception:
        return {}
