"""The commit's syscall order is what survives a power loss, which a SIGKILL test cannot show
(FIELD-NOTES 1, 2): every file is fsynced before the manifest, the manifest and the staging
dir before the rename, and the root after it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from checkpoints import CheckpointStore


def _trace_commit(store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    trace: list[tuple[str, str]] = []
    fd_paths: dict[int, str] = {}
    real_open, real_fsync, real_rename = os.open, os.fsync, os.rename

    def traced_open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        fd = real_open(path, flags, mode, **kw)
        fd_paths[fd] = os.fspath(path)
        trace.append(("open", os.fspath(path)))
        return fd

    def traced_fsync(fd: int) -> None:
        real_fsync(fd)
        trace.append(("fsync", fd_paths[fd]))

    def traced_rename(src: Any, dst: Any) -> None:
        real_rename(src, dst)
        trace.append(("rename", f"{os.fspath(src)} -> {os.fspath(dst)}"))

    with monkeypatch.context() as m:
        m.setattr(os, "open", traced_open)
        m.setattr(os, "fsync", traced_fsync)
        m.setattr(os, "rename", traced_rename)
        with store.begin(1, {}) as w:
            w.write_bytes("learner.pt", b"w")
            w.write_stream("replay/frames-000000.bin", [b"a", b"b"])
            w.write_json("config.json", {})
            w.commit()
    return trace


def test_commit_fsyncs_in_the_order_that_survives_power_loss(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = _trace_commit(store, monkeypatch)
    staging = next(Path(p) for op, p in trace if op == "open" and ".staging-" in p).parent
    if staging.name == "replay":
        staging = staging.parent

    def at(op: str, path: Path | str) -> int:
        return trace.index((op, str(path)))

    [rename] = [i for i, (op, _) in enumerate(trace) if op == "rename"]
    assert trace[rename][1] == f"{staging} -> {store.path_for(1)}"
    manifest_fsync = at("fsync", staging / "MANIFEST.json")
    for name in ("learner.pt", "replay/frames-000000.bin", "config.json"):
        assert at("fsync", staging / name) < at("open", staging / "MANIFEST.json")
    assert at("fsync", staging / "replay") < at("open", staging / "MANIFEST.json")
    assert manifest_fsync < at("fsync", staging) < rename
    assert rename < at("fsync", store.root)
