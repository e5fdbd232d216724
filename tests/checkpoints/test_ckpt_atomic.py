"""write_file_atomic / write_json_atomic replace a file whole or not at all."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from checkpoints import fsync_dir, write_file_atomic, write_json_atomic


def _tmp_leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("durable", [True, False])
def test_write_file_atomic_replaces_content(tmp_path: Path, durable: bool) -> None:
    target = tmp_path / "heartbeat.json"
    write_file_atomic(target, b"one", durable=durable)
    write_file_atomic(target, b"two", durable=durable)
    assert target.read_bytes() == b"two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert _tmp_leftovers(tmp_path) == []


@pytest.mark.parametrize(("umask", "mode"), [(0o077, 0o600), (0o027, 0o640), (0, 0o640)])
def test_write_file_atomic_leaves_the_umask_the_last_word_and_others_nothing(
    tmp_path: Path, umask: int, mode: int
) -> None:
    old = os.umask(umask)
    try:
        write_file_atomic(tmp_path / "f", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == mode


def test_write_json_atomic_round_trips(tmp_path: Path) -> None:
    target = tmp_path / "eval.json"
    write_json_atomic(target, {"return": 21.0, "episodes": [1, 2]})
    assert json.loads(target.read_bytes()) == {"return": 21.0, "episodes": [1, 2]}


def test_write_json_atomic_unserialisable_touches_nothing(tmp_path: Path) -> None:
    target = tmp_path / "error.json"
    write_json_atomic(target, {"ok": True})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert json.loads(target.read_bytes()) == {"ok": True}
    assert _tmp_leftovers(tmp_path) == []


def test_failed_write_keeps_old_content_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "error.json"
    write_file_atomic(target, b"old")

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        write_file_atomic(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert _tmp_leftovers(tmp_path) == []


def test_durable_false_skips_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    write_file_atomic(tmp_path / "heartbeat.json", b"{}", durable=False)
    assert calls == []
    write_file_atomic(tmp_path / "eval.json", b"{}", durable=True)
    assert len(calls) == 2  # the file, then its directory


def test_fsync_dir_accepts_a_directory(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "f")
