"""Placement fences (several hosts), with real workers and a real SeaweedFS: a worker whose game
was placed again elsewhere commits nothing more and exits 77; a mirror upload of a fenced
placement writes no manifest; a new placement on a host that holds checkpoints of an older
placement resumes from the mirror's newer placement even when the local step is higher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpoints import CheckpointStore
from checkpoints.errors import PlacementFenced
from checkpoints.mirror import upload_checkpoint
from harness.seaweed import TEST_AWS_ENV, Weed
from tests.mirror.conftest import remote_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PPO = (
    "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "64",
    "--batch-size", "64", "--threads", "1", "--eval-episodes", "0",
    "--checkpoint-every-steps", "512", "--checkpoint-every-s", "0.5",
)  # fmt: skip


def _cmd(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "training.worker", "--run-dir", str(run_dir), *PPO, *args]


def _env() -> dict[str, str]:
    return {**os.environ, **TEST_AWS_ENV, "PYTHONWARNINGS": "ignore"}


def _run(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _cmd(run_dir, *args), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=240
    )


def _committed(run_dir: Path) -> list[int]:
    return [r.step for r in CheckpointStore(run_dir / "checkpoints").committed()]


def test_a_worker_placed_elsewhere_commits_nothing_more_and_exits_77(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url, remote = remote_for(weed, request)
    run_dir = tmp_path / "run"
    mirror = ("--mirror-url", url, "--mirror-endpoint-url", weed.endpoint, "--mirror-name", "g")
    assert remote.advance_fence("g") == 1
    proc = subprocess.Popen(
        _cmd(run_dir, "--total-steps", "10000000", "--epoch", "1", *mirror),
        cwd=REPO,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(_committed(run_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_committed(run_dir)) >= 2, "the worker commits while its placement holds"
        store = CheckpointStore(run_dir / "checkpoints")
        newest = store.committed()[-1]
        meta = json.loads((newest.path / "MANIFEST.json").read_bytes())["meta"]
        assert meta["epoch"] == 1, "each checkpoint says which placement wrote it"

        assert remote.advance_fence("g", {"host": "elsewhere"}) == 2  # placed again
        fenced_at = time.time()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 77, err[-2000:]
    error = json.loads((run_dir / "error.json").read_text())
    assert error["kind"] == "fenced" and error["exit_code"] == 77
    for ref in CheckpointStore(run_dir / "checkpoints").committed():
        created = json.loads((ref.path / "MANIFEST.json").read_bytes())["created"]
        # The check comes right before the commit: at most a commit already past it lands.
        assert created < fenced_at + 1.0, f"{ref.path.name} committed after the fence moved"
    assert not list((run_dir / "checkpoints").glob(".staging*")), "nothing half-written"

    # Its checkpoints are not mirrored under the old epoch either: no manifest is written.
    ref = CheckpointStore(run_dir / "checkpoints").committed()[-1]
    with pytest.raises(PlacementFenced):
        upload_checkpoint(remote, "g", ref, epoch=1)
    assert remote.manifest_steps("g") == []
    upload_checkpoint(remote, "g", ref, epoch=2)  # the current placement may
    assert remote.manifest_steps("g") == [ref.step]


def test_a_new_placement_supersedes_the_local_checkpoints_of_an_older_one(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Host A ran the game (epoch 1) far; the game moved to host B (epoch 2), which resumed
    from an earlier mirrored step and mirrored its own; back on host A (epoch 3), A's local
    checkpoints have the higher step but belong to the superseded placement: the worker
    resumes from B's, never from A's."""
    url, remote = remote_for(weed, request)
    host_a, host_b = tmp_path / "a" / "g", tmp_path / "b" / "g"
    mirror = ("--mirror-url", url, "--mirror-endpoint-url", weed.endpoint, "--mirror-name", "g")

    remote.advance_fence("g")
    a1 = _run(host_a, "--total-steps", "6000", "--epoch", "1", "--keep-checkpoints", "20", *mirror)
    assert a1.returncode == 0, a1.stderr[-2000:]
    a_refs = CheckpointStore(host_a / "checkpoints").committed()
    upload_checkpoint(remote, "g", a_refs[0], epoch=1)  # the mirror lagged behind host A

    remote.advance_fence("g")
    b = _run(host_b, "--total-steps", str(a_refs[0].step + 1000), "--epoch", "2", *mirror)
    assert b.returncode == 0, b.stderr[-2000:]
    b_newest = CheckpointStore(host_b / "checkpoints").committed()[-1]
    upload_checkpoint(remote, "g", b_newest, epoch=2)
    assert b_newest.step < a_refs[-1].step, "host A's local step is the higher one"

    remote.advance_fence("g")
    a3 = _run(host_a, "--total-steps", str(b_newest.step + 1000), "--epoch", "3", *mirror)
    assert a3.returncode == 0, a3.stderr[-2000:]
    hb = json.loads((host_a / "heartbeat.json").read_text())
    assert hb["resumed_from_step"] == b_newest.step, "from the newer placement's checkpoint"
    assert hb["superseded"]["local"] == [1, a_refs[-1].step]
    assert hb["superseded"]["mirror"] == [2, b_newest.step]
    aside = CheckpointStore(host_a / "checkpoints.superseded").committed()
    assert [r.step for r in aside] == [r.step for r in a_refs], "moved aside, not deleted"

    # The same host coming back within one placement lineage keeps its local checkpoints
    # (they are ahead of the mirror): no superseding without a newer placement's checkpoint.
    remote.advance_fence("g")
    a4 = _run(host_a, "--total-steps", str(b_newest.step + 2000), "--epoch", "4", *mirror)
    assert a4.returncode == 0, a4.stderr[-2000:]
    hb = json.loads((host_a / "heartbeat.json").read_text())
    assert hb["superseded"] is None and hb["resumed_from_step"] > b_newest.step
    # The placement before it (epoch 3) ran on this host: the mirror was not even asked.
    assert "mirror_check_skipped" in a4.stdout + a4.stderr
    assert "mirror_check_skipped" not in a3.stdout + a3.stderr, "epoch 2 ran elsewhere"
