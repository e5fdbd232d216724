"""The mirror keeps what a game's retention keeps: its garbage collection spares the
best-evaluated, milestone and pinned manifests (and their blobs) beyond the newest `keep`, for
games whose names hold '/' (matrix runs) too; the uploader mirrors such local checkpoints when
the bucket lacks them. Against a real S3-compatible server (SeaweedFS on loopback)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from checkpoints import CheckpointStore
from checkpoints.mirror import GameRetention, collect_garbage, restore_newest, upload_checkpoint
from checkpoints.remote import RemoteStore
from checkpoints.retention import write_pins
from harness.seaweed import Weed
from supervisor.config import MirrorConfig
from supervisor.mirror.uploader import UploadPlan, _Pass
from tests.mirror.conftest import remote_for

pytestmark = pytest.mark.e2e

CHUNK = 16 * 1024


def _commit(store: CheckpointStore, step: int, mean: float) -> None:
    meta = {"game": "CartPole-v1", "algo": "ppo", "eval": {"step": step, "mean": mean}}
    with store.begin(step, meta) as w:
        w.write_bytes("learner.pt", os.urandom(2000))
        w.write_bytes("replay/frames-000000.bin", os.urandom(CHUNK))
        w.commit()


def _mirror_all(remote: RemoteStore, game: str, store: CheckpointStore) -> None:
    for ref in store.committed():
        upload_checkpoint(remote, game, ref)


def test_gc_keeps_best_milestones_and_pins_of_every_game(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    remote = remote_for(weed, request)[1]
    means = {100: 5.0, 200: 90.0, 300: 1.0, 400: 2.0, 500: 3.0, 600: 4.0}
    for game in ("pong/s1", "pong/s2"):
        store = CheckpointStore(tmp_path / game, keep=10)
        for step, mean in means.items():
            _commit(store, step, mean)
        _mirror_all(remote, game, store)
    assert remote.games() == ["pong/s1", "pong/s2"]
    policies = {
        "pong/s1": GameRetention(keep_best=1, pinned=frozenset({300})),
        "pong/s2": GameRetention(keep_every_steps=250),
    }
    young = collect_garbage(remote, keep=1, games=policies)
    assert remote.manifest_steps("pong/s1") == [200, 300, 600]
    assert remote.manifest_steps("pong/s2") == [300, 500, 600]  # 600 also the newest
    assert young.manifests_deleted == 6 and young.blobs_deleted == 0
    swept = collect_garbage(remote, keep=1, now=time.time() + 7200, games=policies)
    assert swept.sweep_skipped is None and swept.blobs_deleted == 2 * 3 * 2
    # The best of pong/s1 still has every blob: with the newer manifests gone, it restores.
    for step in (300, 600):
        remote.delete(remote.manifest_key("pong/s1", step))
    restored = CheckpointStore(tmp_path / "restored", keep=10)
    got = restore_newest(remote, "pong/s1", restored)
    assert got is not None and got.step == 200
    assert restored.verify(restored.committed()[-1]).meta["eval"]["mean"] == 90.0


def test_uploader_mirrors_the_kept_ones_the_bucket_lacks(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url, remote = remote_for(weed, request)
    run_dir = tmp_path / "runs" / "pong" / "s2"
    store = CheckpointStore(run_dir / "checkpoints", keep=1, keep_best=1)
    for step, mean in ((100, 70.0), (200, 1.0), (300, 2.0)):
        _commit(store, step, mean)
    assert [r.step for r in store.committed()] == [100, 300]
    write_pins(store.root, {300})
    mirror = MirrorConfig(url=url, endpoint_url=weed.endpoint, region="us-east-1", keep=1)
    plan = UploadPlan(tmp_path / "state", mirror, (("pong/s2", run_dir),), (("pong/s2", 1, None),))
    assert UploadPlan.from_json(plan.to_json()) == plan
    (tmp_path / "state").mkdir()
    one = _Pass(plan, remote)
    assert one.game("pong/s2", run_dir, time.monotonic())
    assert remote.manifest_steps("pong/s2") == [100, 300]  # the newest, and the best
    _commit(store, 400, 3.0)  # retention: 100 (best) and 400 (newest) stay; 300 is pinned
    assert one.game("pong/s2", run_dir, time.monotonic())
    one.collect_garbage()
    assert one.state.gc is not None and "error" not in one.state.gc
    assert remote.manifest_steps("pong/s2") == [100, 300, 400]
