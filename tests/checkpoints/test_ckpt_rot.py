"""Rot in a replay chunk that several checkpoints share through hard links, and checkpoints
whose sizes are right but whose bytes are not: the store names every bad file, lets the caller
salvage the rest, never links a rotten base into a new checkpoint, and never deletes a
checkpoint on sizes alone."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import structlog

from checkpoints import CheckpointCorrupt, CheckpointStore, FileEntry, NoValidCheckpoint

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


# ---- repair from a good copy, and the newest whole checkpoint first -----------------------


def good_bytes(label: str, data: dict[str, bytes]):  # type: ignore[no-untyped-def]
    """A repair source that has the right bytes of `data`'s files (e.g. the mirror)."""
    by_sha = {hashlib.sha256(b).hexdigest(): b for b in data.values()}

    def source(name: str, entry: FileEntry) -> Iterator[tuple[str, Iterable[bytes]]]:
        if entry.sha256 in by_sha:
            yield label, [by_sha[entry.sha256]]

    return source


def test_a_shared_bad_chunk_is_repaired_from_a_source_in_every_checkpoint(root: Path) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20, 30])
    name = "replay/frames-000001.bin"
    flip_bit(store.path_for(30) / name)
    with structlog.testing.capture_logs() as logs:
        loaded = store.load_latest(sources=[good_bytes("the mirror", CHUNKS)])
    assert loaded is not None and loaded.step == 30 and loaded.damaged == {}
    assert loaded.repaired == {name: "the mirror"}
    for ref in store.committed():  # one repair serves every checkpoint that shared the inode
        store.verify(ref)
    inodes = {os.stat(store.path_for(s) / name).st_ino for s in (10, 20, 30)}
    assert len(inodes) == 1, "still one copy on disk, shared by hard links"
    assert not list(root.rglob(".repair-*"))
    assert any(e["event"] == "checkpoint_repaired" for e in logs)


def test_a_source_with_the_wrong_bytes_repairs_nothing(root: Path) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20])
    name = "replay/frames-000001.bin"
    flip_bit(store.path_for(20) / name)
    liar = good_bytes("a liar", {name: b"not these" * 100})

    def also_liar(name: str, entry: FileEntry) -> Iterator[tuple[str, Iterable[bytes]]]:
        yield "a truncated copy", [CHUNKS[name][:-1]]

    loaded = store.load_latest(salvage=is_chunk, sources=[liar, also_liar])
    assert loaded is not None and loaded.step == 20 and list(loaded.damaged) == [name]
    assert loaded.repaired == {}
    assert not list(root.rglob(".repair-*")), "a failed candidate leaves nothing behind"


def test_a_bad_chunk_with_an_identical_healthy_file_is_repaired_locally(root: Path) -> None:
    """Unfilled parts of a preallocated buffer are identical (zeros): a good copy of the bytes
    lies beside the damaged one, on another inode."""
    store = CheckpointStore(root, keep=3)
    zeros = bytes(8192)
    for step in (10, 20):
        with store.begin(step, {}) as w:
            w.write_bytes("learner.pt", LEARNER + str(step).encode())
            for c in range(3):
                w.link_or_write(f"replay/frames-{c:06d}.bin", zeros, unchanged_since_step=None
                                if step == 10 else 10)  # fmt: skip
            w.commit()
    flip_bit(store.path_for(20) / "replay/frames-000002.bin")
    loaded = store.load_latest(salvage=is_chunk)
    assert loaded is not None and loaded.step == 20 and loaded.damaged == {}
    assert list(loaded.repaired) == ["replay/frames-000002.bin"]
    where = loaded.repaired["replay/frames-000002.bin"]
    assert re.fullmatch(r"ckpt-0000000000[12]0/replay/frames-00000[01]\.bin", where), where
    store.verify(store.committed()[0])


def test_whole_first_prefers_an_older_whole_checkpoint_to_a_newer_salvageable_one(
    root: Path,
) -> None:
    """For arrays whose meaning the store cannot know (the SDK's), an exact older state beats
    a newer one with holes: the damaged newer one is quarantined, as any corrupt one."""
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20])
    with store.begin(30, {}) as w:  # its own copy of chunk 1 (changed data), which rots
        w.write_bytes("learner.pt", LEARNER + b"30")
        for name, data in CHUNKS.items():
            w.link_or_write(name, b"\x63" * 8192 if "000001" in name else data,
                            unchanged_since_step=20)  # fmt: skip
        w.commit()
    flip_bit(store.path_for(30) / "replay/frames-000001.bin", offset=5000)
    loaded = store.load_latest(salvage=is_chunk, whole_first=True)
    assert loaded is not None and loaded.step == 20 and loaded.damaged == {}
    assert [name for name, _ in loaded.quarantined] == ["ckpt-000000000030"]


def test_whole_first_salvages_the_newest_when_the_damage_is_shared_by_all(root: Path) -> None:
    """The untouched tail of a buffer is one inode in every kept checkpoint: none is whole, so
    the newest is returned with its damage named, and nothing is quarantined."""
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20, 30])
    flip_bit(store.path_for(30) / "replay/frames-000001.bin")
    with structlog.testing.capture_logs() as logs:
        loaded = store.load_latest(salvage=is_chunk, whole_first=True)
    assert loaded is not None and loaded.step == 30
    assert list(loaded.damaged) == ["replay/frames-000001.bin"]
    assert loaded.quarantined == [] and not list(root.glob(".corrupt-*"))
    # The older ones hold the same inode: known damaged without hashing them again.
    assert [e["path"] for e in logs if e["event"] == "checkpoint_shares_damage"] == [
        str(store.path_for(20)),
        str(store.path_for(10)),
    ]


def test_a_repair_that_cannot_be_put_in_place_leaves_the_damage_as_it_was(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk or a failed fsync while installing the good copy: no OSError out of the
    load, no leftover, and the file counts as damaged (salvaged here), as without a copy."""
    import errno

    from checkpoints import repair

    def no_space(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(repair, "_install", no_space)
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20])
    name = "replay/frames-000001.bin"
    flip_bit(store.path_for(20) / name)
    loaded = store.load_latest(salvage=is_chunk, sources=[good_bytes("the mirror", CHUNKS)])
    assert loaded is not None and loaded.step == 20
    assert list(loaded.damaged) == [name] and loaded.repaired == {}
    assert not list(root.rglob(".repair-*"))


# ---- chunks hashed as they are read (verify_on_read: one pass over the disk) ------------------


def _buffers() -> dict[str, memoryview]:
    return {name: memoryview(bytearray(len(CHUNKS[name]))) for name in CHUNKS}


def test_chunks_verified_on_read_are_not_hashed_by_the_load_and_read_whole(root: Path) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20])
    loaded = store.load_latest(salvage=is_chunk, verify_on_read=is_chunk)
    assert loaded is not None and loaded.step == 20
    assert loaded.unverified == set(CHUNKS), "the chunks are left to the read"
    bufs = _buffers()
    assert loaded.read_many_into(list(bufs.items())) == {}
    assert {name: bytes(buf) for name, buf in bufs.items()} == CHUNKS
    assert loaded.unverified == set() and loaded.damaged == {}


def test_rot_found_on_read_is_damage_reported_and_never_handed_over(root: Path) -> None:
    """A flipped bit the load did not look for: the newest checkpoint is still the one loaded
    (its learner is exact), the chunk is named damaged as it is read, an event says so, and a
    later read of it raises instead of handing its bytes over."""
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20, 30])
    name = "replay/frames-000001.bin"
    flip_bit(store.path_for(30) / name)  # shared by all three: no older one is whole
    with structlog.testing.capture_logs() as logs:
        loaded = store.load_latest(salvage=is_chunk, verify_on_read=is_chunk)
        assert loaded is not None and loaded.step == 30 and loaded.damaged == {}
        bufs = _buffers()
        bad = loaded.read_many_into(list(bufs.items()))
    assert list(bad) == [name] and "checksum mismatch" in bad[name]
    assert list(loaded.damaged) == [name] and loaded.repaired == {}
    for other in set(CHUNKS) - {name}:
        assert bytes(bufs[other]) == CHUNKS[other]
    salvaged = [e for e in logs if e["event"] == "checkpoint_salvaged"]
    assert salvaged and salvaged[-1]["when"] == "read" and salvaged[-1]["damaged"] == [name]
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch"):
        loaded.read_into(name, bytearray(len(CHUNKS[name])))
    assert not list(root.glob(".corrupt-*")), "salvaged, not quarantined"


def test_rot_found_by_read_into_and_read_bytes_raises_and_marks_it_damaged(root: Path) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10])
    flip_bit(store.path_for(10) / "replay/frames-000000.bin")
    flip_bit(store.path_for(10) / "replay/frames-000002.bin")
    loaded = store.load_latest(salvage=is_chunk, verify_on_read=is_chunk)
    assert loaded is not None and loaded.damaged == {}
    with pytest.raises(CheckpointCorrupt, match="frames-000000"):
        loaded.read_into("replay/frames-000000.bin", bytearray(8192))
    with pytest.raises(CheckpointCorrupt, match="frames-000002"):
        loaded.read_bytes("replay/frames-000002.bin")
    assert sorted(loaded.damaged) == ["replay/frames-000000.bin", "replay/frames-000002.bin"]
    assert loaded.read_bytes("replay/frames-000001.bin") == CHUNKS["replay/frames-000001.bin"]


def test_rot_found_on_read_is_repaired_from_a_source_and_read_whole(root: Path) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20, 30])
    name = "replay/frames-000001.bin"
    flip_bit(store.path_for(30) / name)
    with structlog.testing.capture_logs() as logs:
        loaded = store.load_latest(
            salvage=is_chunk, sources=[good_bytes("the mirror", CHUNKS)], verify_on_read=is_chunk
        )
        assert loaded is not None and loaded.step == 30 and loaded.repaired == {}
        bufs = _buffers()
        assert loaded.read_many_into(list(bufs.items())) == {}
    assert {n: bytes(b) for n, b in bufs.items()} == CHUNKS, "the repaired bytes were read"
    assert loaded.repaired == {name: "the mirror"} and loaded.damaged == {}
    for ref in store.committed():  # one repair served every checkpoint that shared the inode
        store.verify(ref)
    assert any(e["event"] == "checkpoint_repaired" for e in logs)
    assert not any(e["event"] == "checkpoint_salvaged" for e in logs)


def test_rot_found_on_read_is_repaired_from_an_identical_local_file(root: Path) -> None:
    store = CheckpointStore(root, keep=3)
    zeros = bytes(8192)
    with store.begin(10, {}) as w:
        w.write_bytes("learner.pt", LEARNER)
        for c in range(3):
            w.write_bytes(f"replay/frames-{c:06d}.bin", zeros)  # three inodes, same bytes
        w.commit()
    flip_bit(store.path_for(10) / "replay/frames-000002.bin")
    loaded = store.load_latest(salvage=is_chunk, verify_on_read=is_chunk)
    assert loaded is not None
    buf = bytearray(8192)
    loaded.read_into("replay/frames-000002.bin", buf)
    assert bytes(buf) == zeros and list(loaded.repaired) == ["replay/frames-000002.bin"]
    store.verify(store.committed()[0])


def test_a_wrong_size_is_found_by_the_load_itself_and_the_learner_is_always_hashed(
    root: Path,
) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10, 20])
    os.truncate(store.path_for(20) / "replay/frames-000000.bin", 10)
    loaded = store.load_latest(salvage=is_chunk, verify_on_read=is_chunk)
    assert loaded is not None and loaded.step == 20
    assert "size mismatch" in loaded.damaged["replay/frames-000000.bin"]
    # A learner is never left to the read, whatever the caller asks: rot in it is found by the
    # load, which passes over to the previous checkpoint.
    flip_bit(store.path_for(20) / "learner.pt")
    loaded = store.load_latest(salvage=is_chunk, verify_on_read=lambda _name: True)
    assert loaded is not None and loaded.step == 10 and "learner.pt" not in loaded.unverified


def test_verify_on_read_needs_salvage_and_refuses_whole_first(root: Path) -> None:
    store = CheckpointStore(root, keep=3)
    commit_chain(store, [10])
    with pytest.raises(ValueError, match="verify_on_read"):
        store.load_latest(verify_on_read=is_chunk)
    with pytest.raises(ValueError, match="whole_first"):
        store.load_latest(salvage=is_chunk, whole_first=True, verify_on_read=is_chunk)
