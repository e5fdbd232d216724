"""Retention keeps the newest K; sweep removes only staging leftovers; same-step re-commit."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import MakeCkpt, ckpt_files

from checkpoints import CheckpointStore


def test_retention_keeps_newest_k(store: CheckpointStore, make_ckpt: MakeCkpt) -> None:
    for step in range(1, 7):
        make_ckpt(step)  # commit applies retention (keep=3)
    assert [r.step for r in store.committed()] == [4, 5, 6]
    assert sorted(p.name for p in store.root.iterdir()) == [
        "ckpt-000000000004",
        "ckpt-000000000005",
        "ckpt-000000000006",
    ]


def test_apply_retention_returns_deleted(root: Path) -> None:
    store = CheckpointStore(root, keep=10)
    for step in range(1, 5):
        with store.begin(step, {}) as w:
            w.write_bytes("a.bin", b"a")
            w.commit()
    store.keep = 1
    deleted = store.apply_retention()
    assert [p.name for p in deleted] == [
        "ckpt-000000000001",
        "ckpt-000000000002",
        "ckpt-000000000003",
    ]
    assert [r.step for r in store.committed()] == [4]


def test_retention_spares_newest_whole_one_when_kept_ones_are_broken(root: Path) -> None:
    store = CheckpointStore(root, keep=1)
    store.keep = 10
    with store.begin(1, {}) as w:
        w.write_bytes("a.bin", b"a")
        w.commit()
    with store.begin(2, {}) as w:
        w.write_bytes("a.bin", b"a")
        ref2 = w.commit()
    (ref2.path / "MANIFEST.json").unlink()
    store.keep = 1
    assert store.apply_retention() == []
    assert [r.step for r in store.committed()] == [1, 2]


def test_sweep_removes_staging_leftovers_and_never_touches_ckpts(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(1)
    leftover = store.begin(2, {})
    leftover.write_bytes("replay/a.bin", b"partial")  # left behind, like after a crash
    stray_file = store.root / ".staging-deadbeef"
    stray_file.write_bytes(b"")
    corrupt = store.root / ".corrupt-ckpt-000000000000-1"
    corrupt.mkdir()
    removed = store.sweep()
    assert sorted(removed) == sorted([leftover.staging, stray_file])
    assert sorted(p.name for p in store.root.iterdir()) == [corrupt.name, "ckpt-000000000001"]
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 1


def test_sweep_on_missing_root_is_a_no_op(store: CheckpointStore) -> None:
    assert store.sweep() == []


def test_committing_same_step_twice_keeps_one_valid_copy(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(5)
    new_files = {"learner.pt": b"second version"}
    make_ckpt(5, new_files)
    assert [r.step for r in store.committed()] == [5]
    assert sorted(p.name for p in store.root.iterdir()) == ["ckpt-000000000005"]
    loaded = store.load_latest()
    assert loaded is not None and loaded.files() == ["learner.pt"]
    assert loaded.read_bytes("learner.pt") == b"second version"


def test_interrupted_same_step_replace_restores_old_copy(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    ref = make_ckpt(5)
    # State after a crash between "move old aside" and "rename new in".
    aside = store.root / f".replaced-000000000005-{'a' * 32}"
    os.rename(ref.path, aside)
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 5
    assert loaded.read_bytes("learner.pt") == ckpt_files(5)["learner.pt"]
    assert not aside.exists()


def test_sweep_drops_replaced_copy_when_new_one_is_in_place(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(5)
    aside = store.root / f".replaced-000000000005-{'b' * 32}"
    aside.mkdir()
    assert store.sweep() == [aside]
    assert sorted(p.name for p in store.root.iterdir()) == ["ckpt-000000000005"]
