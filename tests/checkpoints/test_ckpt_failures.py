"""I/O failures fail one checkpoint cleanly: staging removed, previous intact, never retried
fsync. Transient errnos around rename/open are retried."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeCkpt, ckpt_files

from checkpoints import CheckpointStore, CheckpointWriteFailed
from harness.tmpfs import mounted_tmpfs

pytestmark = pytest.mark.e2e


def _assert_only_step_1_remains(store: CheckpointStore) -> None:
    assert sorted(p.name for p in store.root.iterdir()) == ["ckpt-000000000001"]
    loaded = CheckpointStore(store.root).load_latest()
    assert loaded is not None and loaded.step == 1 and loaded.quarantined == []
    assert loaded.read_bytes("learner.pt") == ckpt_files(1)["learner.pt"]


def _fail_on_call(real: Callable[..., Any], fail_at: int, err: int) -> Callable[..., Any]:
    calls = {"n": 0}

    def fake(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise OSError(err, os.strerror(err))
        return real(*args)

    return fake


def _count_calls(
    monkeypatch: pytest.MonkeyPatch, store: CheckpointStore, fn_name: str, step: int
) -> int:
    calls = {"n": 0}
    real = getattr(os, fn_name)

    def counting(*args: Any) -> Any:
        calls["n"] += 1
        return real(*args)

    with monkeypatch.context() as m:
        m.setattr(os, fn_name, counting)
        _write_step(store, step)
    shutil.rmtree(store.path_for(step))
    return calls["n"]


def _write_step(store: CheckpointStore, step: int) -> None:
    with store.begin(step, {}) as w:
        for name, data in ckpt_files(step).items():
            w.write_bytes(name, data)
        w.commit()


def test_enospc_on_write_fails_cleanly(
    store: CheckpointStore, make_ckpt: MakeCkpt, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_ckpt(1)
    monkeypatch.setattr(os, "write", _fail_on_call(os.write, 1, errno.ENOSPC))
    with pytest.raises(CheckpointWriteFailed, match="No space left") as info:
        _write_step(store, 2)
    monkeypatch.undo()
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    _assert_only_step_1_remains(store)


def test_write_failure_at_every_write_call_fails_cleanly(
    store: CheckpointStore, make_ckpt: MakeCkpt, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_ckpt(1)
    total = _count_calls(monkeypatch, store, "write", 2)
    assert total >= 4  # three files and the manifest
    for fail_at in range(1, total + 1):
        with monkeypatch.context() as m:
            m.setattr(os, "write", _fail_on_call(os.write, fail_at, errno.EIO))
            with pytest.raises(CheckpointWriteFailed):
                _write_step(store, 2)
        _assert_only_step_1_remains(store)


def test_failed_fsync_is_never_retried_and_fails_cleanly(
    store: CheckpointStore, make_ckpt: MakeCkpt, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_ckpt(1)
    total = _count_calls(monkeypatch, store, "fsync", 2)
    for fail_at in range(1, total + 1):
        calls: list[int] = []
        failing = _fail_on_call(os.fsync, fail_at, errno.EIO)

        def recording(
            fd: int, failing: Callable[..., Any] = failing, calls: list[int] = calls
        ) -> None:
            calls.append(fd)
            failing(fd)

        with monkeypatch.context() as m:
            m.setattr(os, "fsync", recording)
            with pytest.raises(CheckpointWriteFailed, match="Input/output error"):
                _write_step(store, 2)
        # The failing fsync was the last one: nothing retried it.
        assert len(calls) == fail_at
        _assert_only_step_1_remains(store)


def test_failed_root_fsync_on_same_step_restores_old_copy(
    store: CheckpointStore, make_ckpt: MakeCkpt, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_ckpt(1)
    make_ckpt(2)
    root_ino = os.stat(store.root).st_ino
    real_fsync = os.fsync

    def fail_on_root(fd: int) -> None:
        if os.fstat(fd).st_ino == root_ino:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", fail_on_root)
        failed = pytest.raises(CheckpointWriteFailed, match="fsync of the checkpoint root")
        with failed, store.begin(2, {}) as w:
            w.write_bytes("learner.pt", b"new")
            w.commit()
    assert sorted(p.name for p in store.root.iterdir()) == [
        "ckpt-000000000001",
        "ckpt-000000000002",
    ]
    loaded = store.load_latest()
    assert loaded is not None and loaded.read_bytes("learner.pt") == ckpt_files(2)["learner.pt"]


def test_non_transient_rename_failure_fails_cleanly(
    store: CheckpointStore, make_ckpt: MakeCkpt, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_ckpt(1)
    monkeypatch.setattr(os, "rename", _fail_on_call(os.rename, 1, errno.EIO))
    with pytest.raises(CheckpointWriteFailed, match="committing"):
        _write_step(store, 2)
    monkeypatch.undo()
    _assert_only_step_1_remains(store)


def test_transient_rename_error_is_retried(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "rename", _fail_on_call(os.rename, 1, errno.EBUSY))
    _write_step(store, 1)
    assert [r.step for r in store.committed()] == [1]


def test_transient_open_error_during_load_is_retried(
    store: CheckpointStore, make_ckpt: MakeCkpt, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_ckpt(1)
    monkeypatch.setattr(os, "open", _fail_on_call(os.open, 1, errno.EINTR))
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 1 and loaded.quarantined == []


def test_persistent_transient_error_gives_up_after_bounded_attempts(
    store: CheckpointStore, make_ckpt: MakeCkpt, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_ckpt(1)
    attempts = {"n": 0}

    def always_busy(src: Any, dst: Any) -> None:
        attempts["n"] += 1
        raise OSError(errno.EBUSY, "busy")

    monkeypatch.setattr(os, "rename", always_busy)
    with pytest.raises(CheckpointWriteFailed, match="busy"):
        _write_step(store, 2)
    monkeypatch.undo()
    assert 3 <= attempts["n"] <= 5
    _assert_only_step_1_remains(store)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tiny", "size=1m") as mnt:
        yield mnt


def test_real_full_filesystem_fails_cleanly(tiny_tmpfs: Path) -> None:
    store = CheckpointStore(tiny_tmpfs / "checkpoints")
    _write_step(store, 1)
    with (
        pytest.raises(CheckpointWriteFailed, match="No space left") as info,
        store.begin(2, {}) as w,
    ):
        w.write_bytes("learner.pt", b"x" * 256 * 1024)
        w.write_stream("replay/big.bin", (b"\0" * 65536 for _ in range(32)))
        w.commit()
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    _assert_only_step_1_remains(store)
    # Space is back once the failed checkpoint is gone: the next one commits.
    _write_step(store, 3)
    assert [r.step for r in store.committed()] == [1, 3]
