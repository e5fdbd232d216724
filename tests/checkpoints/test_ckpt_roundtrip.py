"""Writing, committing and loading a checkpoint round-trips its contents exactly."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import structlog
from conftest import MakeCkpt, ckpt_files

from checkpoints import CheckpointError, CheckpointStore


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_round_trip_bytes_stream_and_json(store: CheckpointStore) -> None:
    with store.begin(7, {"game": "Pong-v5"}) as w:
        w.write_bytes("learner.pt", b"weights")
        w.write_stream("replay/frames-000003.bin", (bytes([i]) * 1000 for i in range(5)))
        w.write_json("config.json", {"lr": 0.001, "envs": 8})
        ref = w.commit()
    assert ref.step == 7 and ref.path.name == "ckpt-000000000007"
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 7 and loaded.quarantined == []
    assert loaded.files() == ["config.json", "learner.pt", "replay/frames-000003.bin"]
    assert loaded.read_bytes("learner.pt") == b"weights"
    assert loaded.read_bytes("replay/frames-000003.bin") == b"".join(
        bytes([i]) * 1000 for i in range(5)
    )
    assert loaded.read_json("config.json") == {"lr": 0.001, "envs": 8}


def test_manifest_records_size_sha256_and_provenance(
    store: CheckpointStore, make_ckpt: MakeCkpt, _fake_boot_id: str
) -> None:
    ref = make_ckpt(3)
    manifest = json.loads((ref.path / "MANIFEST.json").read_bytes())
    assert manifest["schema"] == 1 and manifest["step"] == 3
    assert manifest["meta"] == {"game": "Pong-v5", "algo": "dqn"}
    assert manifest["boot_id"] == _fake_boot_id
    assert isinstance(manifest["rlsup_version"], str) and manifest["rlsup_version"]
    assert isinstance(manifest["created"], float)
    expected = {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in ckpt_files(3).items()
    }
    assert manifest["files"] == expected


def test_missing_boot_id_file_falls_back_to_when_init_started(
    make_ckpt: MakeCkpt, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Some containers have no boot_id: when pid 1 started (ticks since boot) is as good an
    identity of this boot, and no wall-clock step moves it."""
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "nope"))
    ref = make_ckpt(1)
    ticks = Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19]
    assert json.loads((ref.path / "MANIFEST.json").read_bytes())["boot_id"] == f"init-start-{ticks}"


@pytest.mark.parametrize(
    ("umask", "dirs", "files"),
    [(0o077, 0o700, 0o600), (0o027, 0o750, 0o640), (0, 0o750, 0o640)],
    ids=["rlsup-run", "systemd-unit", "permissive"],
)
def test_checkpoints_are_never_readable_by_others_whatever_the_umask(
    store: CheckpointStore, make_ckpt: MakeCkpt, umask: int, dirs: int, files: int
) -> None:
    old = os.umask(umask)
    try:
        ref = make_ckpt(1)
    finally:
        os.umask(old)
    assert _mode(store.root) == dirs
    assert _mode(ref.path) == dirs and _mode(ref.path / "replay") == dirs
    for path in ref.path.rglob("*"):
        if path.is_file():
            assert _mode(path) == files, path


def test_read_into_fills_caller_buffer_without_copy(
    make_ckpt: MakeCkpt, store: CheckpointStore
) -> None:
    make_ckpt(1)
    loaded = store.load_latest()
    assert loaded is not None
    buf = bytearray(4096)
    loaded.read_into("replay/frames-000000.bin", buf)
    assert bytes(buf) == ckpt_files(1)["replay/frames-000000.bin"]
    # A multi-byte-format view (like a numpy array's) is filled through its raw bytes.
    words = memoryview(bytearray(4096)).cast("I")
    loaded.read_into("replay/frames-000001.bin", words)
    assert words.tobytes() == ckpt_files(1)["replay/frames-000001.bin"]


def test_read_into_rejects_wrong_size_buffer(make_ckpt: MakeCkpt, store: CheckpointStore) -> None:
    make_ckpt(1)
    loaded = store.load_latest()
    assert loaded is not None
    with pytest.raises(ValueError, match="4095 bytes"):
        loaded.read_into("replay/frames-000000.bin", bytearray(4095))


def test_open_only_serves_files_listed_in_manifest(
    make_ckpt: MakeCkpt, store: CheckpointStore
) -> None:
    ref = make_ckpt(1)
    (ref.path / "stray.bin").write_bytes(b"not in manifest")
    loaded = store.load_latest()  # an extra unknown file does not fail verification
    assert loaded is not None and loaded.step == 1
    with loaded.open("learner.pt") as f:
        assert f.read() == ckpt_files(1)["learner.pt"]
    with pytest.raises(KeyError, match=r"stray\.bin"):
        loaded.open("stray.bin")
    with pytest.raises(ValueError, match="invalid checkpoint file name"):
        loaded.open("../ckpt-000000000001/learner.pt")


def test_exception_inside_with_aborts_and_removes_staging(store: CheckpointStore) -> None:
    with pytest.raises(RuntimeError), store.begin(1, {}) as w:
        w.write_bytes("a.bin", b"a")
        raise RuntimeError("boom")
    assert list(store.root.iterdir()) == []
    assert store.load_latest() is None


def test_leaving_with_without_commit_aborts(store: CheckpointStore) -> None:
    with structlog.testing.capture_logs() as logs, store.begin(1, {}) as w:
        w.write_bytes("a.bin", b"a")
    assert list(store.root.iterdir()) == []
    assert any(e["event"] == "checkpoint_not_committed" for e in logs)


def test_abort_is_idempotent_and_writer_unusable_after(store: CheckpointStore) -> None:
    w = store.begin(1, {})
    w.abort()
    w.abort()
    assert not w.staging.exists()
    with pytest.raises(CheckpointError, match="aborted"):
        w.write_bytes("a.bin", b"a")


def test_writing_same_name_twice_is_rejected(store: CheckpointStore) -> None:
    with store.begin(1, {}) as w:
        w.write_bytes("a.bin", b"a")
        with pytest.raises(ValueError, match="already written"):
            w.write_bytes("a.bin", b"b")
        w.abort()


def test_begin_rejects_unserialisable_meta_and_bad_step(store: CheckpointStore) -> None:
    with pytest.raises(TypeError):
        store.begin(1, {"x": object()})
    with pytest.raises(ValueError, match="step"):
        store.begin(-1, {})
    assert not store.root.exists() or list(store.root.iterdir()) == []


def test_committed_is_sorted_by_step_and_ignores_other_names(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    for step in (20, 3, 100):
        make_ckpt(step)
    (store.root / "ckpt-12").mkdir()  # wrong width: not ours
    (store.root / "ckpt-000000000999").write_bytes(b"a file, not a dir")
    assert [r.step for r in store.committed()] == [3, 20, 100]
    latest = store.latest()
    assert latest is not None and latest.step == 100


def test_commit_logs_checkpoint_committed_event(store: CheckpointStore) -> None:
    with structlog.testing.capture_logs() as logs, store.begin(5, {}) as w:
        w.write_bytes("a.bin", b"abc")
        w.commit()
    [event] = [e for e in logs if e["event"] == "checkpoint_committed"]
    assert event["step"] == 5 and event["bytes_written"] == 3 and event["bytes_linked"] == 0
    assert event["seconds"] >= 0
    assert w.stats.files_written == 1 and w.stats.seconds > 0


def test_write_json_rejects_nan_so_contents_stay_strict_json(store: CheckpointStore) -> None:
    with store.begin(1, {}) as w:
        with pytest.raises(ValueError):
            w.write_json("state.json", {"loss": float("nan")})
        w.abort()


def test_read_into_rejects_read_only_buffer(make_ckpt: MakeCkpt, store: CheckpointStore) -> None:
    make_ckpt(1)
    loaded = store.load_latest()
    assert loaded is not None
    with pytest.raises(ValueError, match="read-only"):
        loaded.read_into("replay/frames-000000.bin", memoryview(bytes(4096)))


def test_stdlib_structlog_logger_is_accepted(root: Path) -> None:
    store = CheckpointStore(root, log=structlog.stdlib.get_logger("test"))
    with structlog.testing.capture_logs() as logs, store.begin(1, {}) as w:
        w.write_bytes("a.bin", b"a")
        w.commit()
    assert [e["event"] for e in logs] == ["checkpoint_committed"]
