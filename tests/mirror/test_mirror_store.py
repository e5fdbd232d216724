"""The mirror against a real S3-compatible server (SeaweedFS on loopback): content-addressed
upload, manifests last and once, restore through the local store, fallback past damaged blobs,
mark-and-sweep garbage collection."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from checkpoints import CheckpointError, CheckpointStore, CheckpointWriteFailed
from checkpoints.mirror import collect_garbage, restore_newest, upload_checkpoint
from checkpoints.remote import (
    RemoteContentError,
    RemoteError,
    RemoteLocation,
    RemoteStore,
    make_client,
)
from harness.seaweed import Weed
from tests.mirror.conftest import remote_for
from tests.mirror.endpoints import closed_endpoint

pytestmark = pytest.mark.e2e

CHUNK = 64 * 1024


def _remote(weed: Weed, request: pytest.FixtureRequest) -> RemoteStore:
    return remote_for(weed, request)[1]


def _checkpoint(store: CheckpointStore, step: int, chunks: list[bytes]) -> None:
    w = store.begin(step, {"env_id": "CartPole-v1", "algo": "dqn"})
    w.write_bytes("learner.pt", os.urandom(5000) + step.to_bytes(8, "little"))
    for i, chunk in enumerate(chunks):
        w.write_bytes(f"replay/frames-{i:06d}.bin", chunk)
    w.commit()


def _files(ckpt: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(ckpt)): p.read_bytes()
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != "MANIFEST.json"
    }


def test_location_names_what_is_wrong() -> None:
    assert RemoteLocation.parse("s3://my-bucket/a/b") == RemoteLocation("my-bucket", "a/b/")
    assert RemoteLocation.parse("s3://my-bucket") == RemoteLocation("my-bucket", "")
    for bad, words in (
        ("http://x/y", "s3://"),
        ("s3://B/x", "bucket name"),
        ("s3://ok-bucket/../x", "'..'"),
    ):
        with pytest.raises(ValueError, match=words):
            RemoteLocation.parse(bad)


def test_incremental_upload_and_exact_restore(weed: Weed, request: pytest.FixtureRequest,
                                              tmp_path: Path) -> None:  # fmt: skip
    remote = _remote(weed, request)
    store = CheckpointStore(tmp_path / "a" / "checkpoints", keep=5)
    chunks = [os.urandom(CHUNK) for _ in range(20)]
    _checkpoint(store, 100, chunks)
    first = upload_checkpoint(remote, "a", store.committed()[-1])
    assert first.bytes_present == 0 and first.new_manifest
    chunks[3] = os.urandom(CHUNK)  # 1 of 20 chunks new, like a ring buffer's cursor
    _checkpoint(store, 200, chunks)
    second = upload_checkpoint(remote, "a", store.committed()[-1])
    assert second.bytes_present == 19 * CHUNK, "the unchanged chunks are not uploaded again"
    assert second.bytes_uploaded == CHUNK + 5008
    assert remote.manifest_steps("a") == [100, 200]
    again = upload_checkpoint(remote, "a", store.committed()[-1])
    assert again.bytes_uploaded == 0 and not again.new_manifest, "a manifest is written once"

    fresh = CheckpointStore(tmp_path / "b" / "checkpoints")  # a new machine
    restored = restore_newest(remote, "a", fresh)
    assert restored is not None and restored.step == 200 and restored.skipped == []
    loaded = fresh.verify(fresh.committed()[-1])
    assert loaded.step == 200 and loaded.meta["algo"] == "dqn"
    assert _files(fresh.path_for(200)) == _files(store.path_for(200))


def test_a_file_that_rotted_locally_is_never_mirrored(weed: Weed, request: pytest.FixtureRequest,
                                                      tmp_path: Path) -> None:  # fmt: skip
    remote = _remote(weed, request)
    store = CheckpointStore(tmp_path / "checkpoints")
    _checkpoint(store, 100, [os.urandom(CHUNK)])
    path = store.path_for(100) / "replay" / "frames-000000.bin"
    data = bytearray(path.read_bytes())
    data[77] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"frames-000000\.bin.*no longer match"):
        upload_checkpoint(remote, "a", store.committed()[-1])
    assert remote.manifest_steps("a") == [], "no manifest without all of its blobs"


class _FailingAfter(RemoteStore):
    """Killed mid-upload, as far as the bucket can tell: the n-th blob upload fails."""

    def __init__(self, base: RemoteStore, n: int) -> None:
        self.__dict__.update(base.__dict__)
        self.left = n

    def put_blob(self, path: Path, sha256: str) -> None:
        self.left -= 1
        if self.left < 0:
            raise RemoteError("connection reset (injected)")
        super().put_blob(path, sha256)


def test_an_interrupted_upload_leaves_no_manifest_and_resumes(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    remote = _remote(weed, request)
    store = CheckpointStore(tmp_path / "checkpoints")
    _checkpoint(store, 100, [os.urandom(CHUNK) for _ in range(6)])
    with pytest.raises(RemoteError, match="injected"):
        upload_checkpoint(_FailingAfter(remote, 3), "a", store.committed()[-1])
    assert remote.manifest_steps("a") == []
    assert restore_newest(remote, "a", CheckpointStore(tmp_path / "x")) is None
    done = upload_checkpoint(remote, "a", store.committed()[-1])
    assert done.bytes_present == 5008 + 2 * CHUNK, "the blobs already there are not sent again"
    assert remote.manifest_steps("a") == [100]


def test_restore_falls_back_past_a_damaged_or_missing_blob(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    remote = _remote(weed, request)
    store = CheckpointStore(tmp_path / "a", keep=5)
    for step in (100, 200, 300):
        _checkpoint(store, step, [os.urandom(CHUNK), os.urandom(CHUNK)])
        upload_checkpoint(remote, "a", store.committed()[-1])
    m300 = store.verify(store.committed()[-1]).manifest["files"]
    m200 = store.verify(store.committed()[-2]).manifest["files"]
    # 300: a blob whose bytes changed in the bucket (same key, same metadata, one bit off)
    sha = m300["replay/frames-000001.bin"]["sha256"]
    body = bytearray(store.path_for(300).joinpath("replay/frames-000001.bin").read_bytes())
    body[5] ^= 0x10
    remote.client.put_object(Bucket=remote.where.bucket, Key=remote.blob_key(sha),
                             Body=bytes(body), Metadata={"sha256": sha})  # fmt: skip
    # 200: a blob gone
    remote.delete(remote.blob_key(m200["learner.pt"]["sha256"]))

    fresh = CheckpointStore(tmp_path / "b")
    restored = restore_newest(remote, "a", fresh)
    assert restored is not None and restored.step == 100
    assert [s.split(":")[0] for s in restored.skipped] == ["ckpt-000000000300",
                                                           "ckpt-000000000200"]  # fmt: skip
    assert "damaged" in restored.skipped[0]
    assert [r.step for r in fresh.committed()] == [100], "nothing half-written is left"
    assert not [p for p in fresh.root.iterdir() if p.name.startswith(".staging-")]
    fresh.verify(fresh.committed()[-1])


def test_restore_refuses_another_games_checkpoints(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    remote = _remote(weed, request)
    store = CheckpointStore(tmp_path / "a")
    _checkpoint(store, 100, [os.urandom(CHUNK)])
    upload_checkpoint(remote, "a", store.committed()[-1])
    with pytest.raises(CheckpointError, match="algo dqn is not ppo"):
        restore_newest(
            remote,
            "a",
            CheckpointStore(tmp_path / "b"),
            accept=lambda meta: (
                None if meta["algo"] == "ppo" else f"algo {meta['algo']} is not ppo"
            ),
        )


def test_garbage_collection_deletes_blobs_after_their_manifests(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    remote = _remote(weed, request)
    store = CheckpointStore(tmp_path / "a", keep=5)
    shared = os.urandom(CHUNK)
    for step in (100, 200, 300):
        _checkpoint(store, step, [shared, os.urandom(CHUNK)])
        upload_checkpoint(remote, "a", store.committed()[-1])
    before = set(remote.blobs())
    assert len(before) == 7  # 3 learners + 3 own chunks + 1 shared

    young = collect_garbage(remote, keep=1)  # every blob is younger than the grace period
    assert (young.manifests_deleted, young.blobs_deleted) == (2, 0)
    assert remote.manifest_steps("a") == [300]
    swept = collect_garbage(remote, keep=1, now=time.time() + 7200)
    assert swept.blobs_deleted == 4
    live = store.verify(store.committed()[-1]).manifest["files"]
    assert set(remote.blobs()) == {e["sha256"] for e in live.values()}
    restored = restore_newest(remote, "a", CheckpointStore(tmp_path / "b"))
    assert restored is not None and restored.step == 300


def test_a_store_that_is_down_is_no_verdict_on_any_checkpoint(tmp_path: Path) -> None:
    """Connection refused: restore raises (the worker retries after a backoff), skipping
    nothing as damaged and never starting from zero."""
    store = CheckpointStore(tmp_path / "c")
    # Bound by us for the whole test, never listening: nothing else can answer there.
    with closed_endpoint() as endpoint, pytest.raises(RemoteError) as info:
        remote = RemoteStore(make_client(endpoint, "us-east-1"), RemoteLocation.parse("s3://x-y/z"))
        restore_newest(remote, "a", store)
    assert not isinstance(info.value, RemoteContentError)
    assert store.committed() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_full_local_disk_during_a_download_keeps_nothing_half_written(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    import subprocess

    remote = _remote(weed, request)
    store = CheckpointStore(tmp_path / "a")
    _checkpoint(store, 100, [os.urandom(CHUNK) for _ in range(8)])  # ~520 KiB
    upload_checkpoint(remote, "a", store.committed()[-1])
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], check=True)
    try:
        fresh = CheckpointStore(small / "checkpoints")
        with pytest.raises(CheckpointWriteFailed, match="No space left"):
            restore_newest(remote, "a", fresh)
        assert list(fresh.root.iterdir()) == [], "staging removed, nothing committed"
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert remote.manifest_steps("a") == [100], "a local failure says nothing of the mirror"
