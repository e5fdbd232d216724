"""A read error is not corruption: nothing is quarantined, transient errors are retried, and a
persistent one is CheckpointUnreadable naming the file. Real EACCES from the kernel (a reader
without the permission) and EIO/ESTALE through the store's one read seam."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import MakeCkpt

from checkpoints import CheckpointStore, CheckpointUnreadable
from checkpoints._faults import ENV as FAULT_ENV


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "read-faults"
    path.write_text("")
    monkeypatch.setenv(FAULT_ENV, str(path))
    return path


@pytest.mark.parametrize("errno_name", ["EIO", "ESTALE", "EMFILE", "EACCES"])
def test_persistent_read_error_is_unreadable_and_moves_nothing(
    store: CheckpointStore, make_ckpt: MakeCkpt, control: Path, errno_name: str
) -> None:
    make_ckpt(1)
    make_ckpt(2)
    before = names(store.root)
    control.write_text(f"{errno_name} {store.path_for(2)}/replay/frames-000001.bin\n")
    with pytest.raises(CheckpointUnreadable) as info:
        store.load_latest()
    assert info.value.name == "replay/frames-000001.bin"
    assert "ckpt-000000000002" in str(info.value)
    assert names(store.root) == before, "nothing quarantined, nothing skipped"
    control.write_text("")
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 2


def test_transient_read_error_is_retried(
    store: CheckpointStore, make_ckpt: MakeCkpt, control: Path
) -> None:
    make_ckpt(1)
    control.write_text(f"EIO {store.path_for(1)}/learner.pt\n")
    clear = threading.Timer(0.12, control.write_text, args=("",))
    clear.start()
    try:
        loaded = store.load_latest()  # retries (0.05, 0.1, 0.2 s ...) outlast the fault
    finally:
        clear.cancel()
    assert loaded is not None and loaded.step == 1
    assert names(store.root) == ["ckpt-000000000001"]


def test_read_error_after_verification_is_unreadable_not_corrupt(
    store: CheckpointStore, make_ckpt: MakeCkpt, control: Path
) -> None:
    make_ckpt(1)
    loaded = store.load_latest()
    assert loaded is not None
    control.write_text(f"EIO {store.path_for(1)}/learner.pt\n")
    with pytest.raises(CheckpointUnreadable, match=r"learner\.pt"):
        loaded.read_bytes("learner.pt")
    buf = bytearray(4096)
    control.write_text(f"EIO {store.path_for(1)}/replay\n")
    with pytest.raises(CheckpointUnreadable, match=r"frames-000000"):
        loaded.read_into("replay/frames-000000.bin", buf)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read as another user")
def test_real_eacces_from_the_kernel_quarantines_nothing(make_ckpt: MakeCkpt) -> None:
    """A reader that may list the checkpoints but not open their files (files are 0600):
    the kernel says EACCES. The old store called that corruption and moved the checkpoint."""
    top = Path(tempfile.mkdtemp(prefix="rlsup-eacces-"))
    try:
        store = CheckpointStore(top / "checkpoints")
        with store.begin(1, {}) as w:
            w.write_bytes("learner.pt", b"x" * 100)
            w.commit()
        for path in (top, store.root, store.path_for(1)):
            os.chmod(path, 0o755)
        before = names(store.root)
        os.setegid(65534)  # the kernel checks permissions as nobody:nogroup from here on
        os.seteuid(65534)
        try:
            with pytest.raises(CheckpointUnreadable) as info:
                store.load_latest()
        finally:
            os.seteuid(0)
            os.setegid(0)
        assert (info.value.errno, info.value.name) == (errno.EACCES, "MANIFEST.json")
        assert names(store.root) == before
    finally:
        shutil.rmtree(top)
