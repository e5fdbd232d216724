"""CheckpointStore.quarantine: a verifying but known-bad checkpoint is moved aside on request."""

from __future__ import annotations

import pytest

from checkpoints import CheckpointStore, NoValidCheckpoint
from checkpoints.names import CORRUPT_PREFIX
from tests.checkpoints.conftest import MakeCkpt


def test_quarantine_moves_it_aside_and_loading_falls_back_to_the_previous(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(100)
    newest = make_ckpt(200)
    moved = store.quarantine(200, "worker crashed twice right after loading it")
    assert moved.parent == store.root
    assert moved.name.startswith(f"{CORRUPT_PREFIX}ckpt-000000000200-")
    assert (moved / "MANIFEST.json").exists()  # kept whole, for forensics
    assert not newest.path.exists()
    assert [r.step for r in store.committed()] == [100]
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 100
    # The store's own sweep never removes it.
    store.sweep()
    assert moved.exists()


def test_quarantine_by_ref_and_twice_the_same_name_gets_a_distinct_path(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(50)
    first = store.quarantine(make_ckpt(100), "bad")
    second = store.quarantine(make_ckpt(100), "bad again")  # re-committed, same second
    assert first != second and first.exists() and second.exists()


def test_quarantining_the_only_checkpoint_makes_loading_refuse_loudly(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(100)
    store.quarantine(100, "bad")
    with pytest.raises(NoValidCheckpoint, match="quarantined"):
        store.load_latest()


def test_quarantine_of_a_missing_or_foreign_checkpoint_is_refused(
    store: CheckpointStore, make_ckpt: MakeCkpt, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    make_ckpt(100)
    with pytest.raises(FileNotFoundError):
        store.quarantine(300, "bad")
    from checkpoints import CheckpointRef

    with pytest.raises(ValueError):
        store.quarantine(CheckpointRef(tmp_path / "elsewhere" / "ckpt-000000000100", 100), "x")
    assert [r.step for r in store.committed()] == [100]
