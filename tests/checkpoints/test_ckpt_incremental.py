"""link_or_write hard-links unchanged chunks from the base checkpoint instead of rewriting."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from checkpoints import CheckpointStore

CHUNK = b"\x07" * 8192


def _commit_base(store: CheckpointStore, step: int = 1) -> None:
    with store.begin(step, {}) as w:
        w.write_bytes("replay/frames-000000.bin", CHUNK)
        w.commit()


def test_unchanged_chunk_is_hard_linked_from_base(store: CheckpointStore) -> None:
    _commit_base(store)
    with store.begin(2, {}) as w:
        entry = w.link_or_write("replay/frames-000000.bin", CHUNK, unchanged_since_step=1)
        ref = w.commit()
    base = os.stat(store.path_for(1) / "replay/frames-000000.bin")
    new = os.stat(ref.path / "replay/frames-000000.bin")
    assert (new.st_ino, new.st_dev) == (base.st_ino, base.st_dev)
    assert new.st_nlink == 2
    assert w.stats.files_linked == 1 and w.stats.bytes_linked == len(CHUNK)
    assert w.stats.files_written == 0 and w.stats.bytes_written == 0
    loaded = store.load_latest()
    assert loaded is not None and loaded.read_bytes("replay/frames-000000.bin") == CHUNK
    assert loaded.manifest["files"]["replay/frames-000000.bin"]["sha256"] == entry.sha256


def test_linked_chunk_survives_retention_of_its_base(root: Path) -> None:
    store = CheckpointStore(root, keep=1)
    _commit_base(store)
    with store.begin(2, {}) as w:
        w.link_or_write("replay/frames-000000.bin", CHUNK, unchanged_since_step=1)
        w.commit()
    assert [r.step for r in store.committed()] == [2]
    loaded = store.load_latest()
    assert loaded is not None and loaded.read_bytes("replay/frames-000000.bin") == CHUNK


def test_writes_when_base_checkpoint_is_gone(store: CheckpointStore) -> None:
    _commit_base(store)
    shutil.rmtree(store.path_for(1))
    with store.begin(2, {}) as w:
        w.link_or_write("replay/frames-000000.bin", CHUNK, unchanged_since_step=1)
        ref = w.commit()
    assert os.stat(ref.path / "replay/frames-000000.bin").st_nlink == 1
    assert w.stats.files_written == 1 and w.stats.files_linked == 0


def test_writes_when_size_differs_from_base(store: CheckpointStore) -> None:
    _commit_base(store)
    bigger = CHUNK + b"\x01"
    with store.begin(2, {}) as w:
        w.link_or_write("replay/frames-000000.bin", bigger, unchanged_since_step=1)
        ref = w.commit()
    assert os.stat(ref.path / "replay/frames-000000.bin").st_nlink == 1
    assert (ref.path / "replay/frames-000000.bin").read_bytes() == bigger


def test_writes_when_no_base_step_given(store: CheckpointStore) -> None:
    _commit_base(store)
    with store.begin(2, {}) as w:
        w.link_or_write("replay/frames-000000.bin", CHUNK, unchanged_since_step=None)
        w.commit()
    assert w.stats.files_written == 1 and w.stats.files_linked == 0


def test_writes_when_base_manifest_lacks_the_name(store: CheckpointStore) -> None:
    _commit_base(store)
    with store.begin(2, {}) as w:
        w.link_or_write("replay/frames-000009.bin", CHUNK, unchanged_since_step=1)
        w.commit()
    assert w.stats.files_written == 1 and w.stats.files_linked == 0


def test_writes_when_base_file_was_truncated(store: CheckpointStore) -> None:
    _commit_base(store)
    (store.path_for(1) / "replay/frames-000000.bin").write_bytes(b"short")
    with store.begin(2, {}) as w:
        w.link_or_write("replay/frames-000000.bin", CHUNK, unchanged_since_step=1)
        ref = w.commit()
    assert (ref.path / "replay/frames-000000.bin").read_bytes() == CHUNK
