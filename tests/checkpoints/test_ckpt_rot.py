"""Rot in a replay chunk that several checkpoints share through hard links, and checkpoints
whose sizes are right but whose bytes are not: the store names every bad file, lets the caller
salvage the rest, never links a rotten base into a new checkpoint, and never deletes a
checkpoint on sizes alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import structlog

from checkpoints import CheckpointCorrupt, CheckpointStore, NoValidCheckpoint

CHUNKS = {f"replay/frames-{c:06d}.bin": bytes([c + 1]) * 8192 for c in range(3)}
LEARNER = b"learner-state" * 64


def is_chunk(name: str) -> bool:
    return name.startswith("replay/frames-")


def flip_bit(path: Path, offset: int = 100) -> None:
    """One flipped bit, written in place: every hard link of the inode sees it."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def commit_chain(store: CheckpointStore, steps: list[int]) -> None:
    """Checkpoints whose replay chunks are all hard-linked from the first (a cold ring)."""
    base: int | None = None
    for step in steps:
        with store.begin(step, {"game": "Pong-v5", "algo": "dqn"}) as w:
            w.write_bytes("learner.pt", LEARNER + str(step).encode())
            for name, data in CHUNKS.items():
                w.link_or_write(name, data, unchanged_since_step=base)
            w.commit()
        base = step


def test_verification_names_every_bad_file(store: CheckpointStore) -> None:
    commit_chain(store, [1])
    ref = store.latest()
    assert ref is not None
    flip_bit(ref.path / "learner.pt")
    os.truncate(ref.path / "replay/frames-000002.bin", 10)
    with pytest.raises(CheckpointCorrupt) as info:
        store.verify(ref)
    assert sorted(info.value.bad) == ["learner.pt", "replay/frames-000002.bin"]
    assert "checksum mismatch for learner.pt" in info.value.bad["learner.pt"]
    assert "size mismatch for replay/frames-000002.bin" in str(info.value)


def test_rot_in_a_shared_chunk_is_salvaged_from_the_newest_not_quarantined(
    root: Path,
) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20, 30])
    shared = store.path_for(30) / "replay/frames-000001.bin"
    assert os.stat(shared).st_nlink == 3  # one inode, three checkpoints
    flip_bit(shared)
    with structlog.testing.capture_logs() as logs:
        loaded = store.load_latest(salvage=is_chunk)
    assert loaded is not None and loaded.step == 30, "the newest, not an older one"
    assert list(loaded.damaged) == ["replay/frames-000001.bin"]
    assert loaded.quarantined == []
    assert loaded.read_bytes("learner.pt") == LEARNER + b"30"
    assert loaded.read_bytes("replay/frames-000000.bin") == CHUNKS["replay/frames-000000.bin"]
    with pytest.raises(CheckpointCorrupt, match="frames-000001"):
        loaded.read_bytes("replay/frames-000001.bin")
    assert [r.step for r in store.committed()] == [10, 20, 30]
    assert not list(root.glob(".corrupt-*"))
    assert any(e["event"] == "checkpoint_salvaged" for e in logs)


def test_without_salvage_a_bad_chunk_still_quarantines(root: Path) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10])
    flip_bit(store.path_for(10) / "replay/frames-000000.bin")
    with pytest.raises(NoValidCheckpoint, match=r"frames-000000\.bin"):
        store.load_latest()


def test_a_rotten_base_is_never_linked_into_a_new_checkpoint(root: Path) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20])
    rotten = store.path_for(20) / "replay/frames-000001.bin"
    flip_bit(rotten)
    with store.begin(30, {}) as w:
        for name, data in CHUNKS.items():
            w.link_or_write(name, data, unchanged_since_step=20)
        ref = w.commit()
    assert w.stats.bad_bases == ["ckpt-000000000020/replay/frames-000001.bin"]
    assert w.stats.files_linked == 2 and w.stats.files_written == 1
    new = ref.path / "replay/frames-000001.bin"
    assert os.stat(new).st_ino != os.stat(rotten).st_ino
    store.verify(ref)  # every byte of the new checkpoint is right
    assert new.read_bytes() == CHUNKS["replay/frames-000001.bin"]


def test_retention_never_deletes_on_sizes_alone(root: Path) -> None:
    store = CheckpointStore(root, keep=10)
    commit_chain(store, [1, 2, 3])
    for step in (2, 3):  # same sizes, wrong bytes: a size check calls them whole
        flip_bit(store.path_for(step) / "learner.pt")
    store.keep = 2
    with structlog.testing.capture_logs() as logs:
        assert store.apply_retention() == []
    assert [r.step for r in store.committed()] == [1, 2, 3]
    assert any(e["event"] == "checkpoint_retention_held" for e in logs)


def test_retention_after_a_commit_trusts_only_the_checkpoint_it_wrote(root: Path) -> None:
    store = CheckpointStore(root, keep=2)
    commit_chain(store, [1, 2])
    flip_bit(store.path_for(2) / "learner.pt")
    commit_chain(store, [3])  # verified as written: the older ones may go
    assert [r.step for r in store.committed()] == [2, 3]
