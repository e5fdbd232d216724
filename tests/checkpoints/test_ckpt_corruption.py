"""A damaged newest checkpoint is quarantined and the previous one is loaded, loudly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog
from conftest import MakeCkpt, ckpt_files

from checkpoints import CheckpointStore, NoValidCheckpoint


def _corrupt_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".corrupt-"))


def _load_expecting_fallback(store: CheckpointStore, reason_fragment: str) -> None:
    with structlog.testing.capture_logs() as logs:
        loaded = store.load_latest()
    assert loaded is not None and loaded.step == 1
    assert loaded.read_bytes("learner.pt") == ckpt_files(1)["learner.pt"]
    [(name, reason)] = loaded.quarantined
    assert name == "ckpt-000000000002" and reason_fragment in reason
    [corrupt] = _corrupt_dirs(store.root)
    assert corrupt.startswith(".corrupt-ckpt-000000000002-")
    assert [r.step for r in store.committed()] == [1]
    [event] = [e for e in logs if e["event"] == "checkpoint_corrupt"]
    assert event["log_level"] == "warning" and reason_fragment in event["reason"]
    assert event["path"].endswith("ckpt-000000000002")


def test_truncated_file_in_newest_falls_back_to_previous(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(1)
    ref = make_ckpt(2)
    target = ref.path / "replay" / "frames-000001.bin"
    target.write_bytes(target.read_bytes()[:100])
    _load_expecting_fallback(store, "size mismatch for replay/frames-000001.bin")


def test_bit_flip_in_newest_falls_back_to_previous(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(1)
    ref = make_ckpt(2)
    target = ref.path / "learner.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    _load_expecting_fallback(store, "checksum mismatch for learner.pt")


def test_missing_manifest_falls_back_to_previous(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(1)
    (make_ckpt(2).path / "MANIFEST.json").unlink()
    _load_expecting_fallback(store, "missing MANIFEST.json")


def test_garbled_manifest_falls_back_to_previous(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(1)
    manifest = make_ckpt(2).path / "MANIFEST.json"
    manifest.write_bytes(manifest.read_bytes()[:50])
    _load_expecting_fallback(store, "not valid JSON")


def test_manifest_step_differing_from_dir_name_falls_back(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(1)
    manifest = make_ckpt(2).path / "MANIFEST.json"
    doc = json.loads(manifest.read_bytes())
    doc["step"] = 99
    manifest.write_text(json.dumps(doc))
    _load_expecting_fallback(store, "step mismatch")


def test_missing_file_falls_back_to_previous(store: CheckpointStore, make_ckpt: MakeCkpt) -> None:
    make_ckpt(1)
    (make_ckpt(2).path / "replay" / "frames-000001.bin").unlink()  # bytes found nowhere else
    _load_expecting_fallback(store, "missing file replay/frames-000001.bin")


def test_a_missing_file_whose_bytes_another_file_holds_is_restored_from_it(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    """A manifest names a file by its sha256: step 1's frames-000001 holds exactly the bytes of
    step 2's frames-000000, so that file comes back and step 2 loads whole."""
    make_ckpt(1)
    (make_ckpt(2).path / "replay" / "frames-000000.bin").unlink()
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 2 and loaded.quarantined == []
    assert loaded.repaired == {
        "replay/frames-000000.bin": "ckpt-000000000001/replay/frames-000001.bin"
    }
    assert (
        loaded.read_bytes("replay/frames-000000.bin") == ckpt_files(2)["replay/frames-000000.bin"]
    )


def test_manifest_naming_a_path_outside_the_checkpoint_is_rejected(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(1)
    manifest = make_ckpt(2).path / "MANIFEST.json"
    doc = json.loads(manifest.read_bytes())
    doc["files"]["../ckpt-000000000001/learner.pt"] = doc["files"].pop("learner.pt")
    manifest.write_text(json.dumps(doc))
    _load_expecting_fallback(store, "invalid file name")


def test_all_corrupt_raises_no_valid_checkpoint_naming_each(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    (make_ckpt(1).path / "MANIFEST.json").unlink()
    (make_ckpt(2).path / "learner.pt").write_bytes(b"garbage")
    with pytest.raises(NoValidCheckpoint) as info:
        store.load_latest()
    message = str(info.value)
    assert "ckpt-000000000001: missing MANIFEST.json" in message
    assert "ckpt-000000000002: size mismatch for learner.pt" in message
    assert len(_corrupt_dirs(store.root)) == 2


def test_after_all_were_quarantined_load_still_refuses_to_start_from_zero(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    (make_ckpt(1).path / "MANIFEST.json").unlink()
    with pytest.raises(NoValidCheckpoint):
        store.load_latest()
    with pytest.raises(NoValidCheckpoint, match="quarantined ones exist"):
        CheckpointStore(store.root).load_latest()


def test_no_checkpoints_at_all_returns_none(store: CheckpointStore) -> None:
    assert store.load_latest() is None
    store.root.mkdir(parents=True)
    assert store.load_latest() is None


def test_quarantine_keeps_older_corrupt_copies_of_same_name(
    store: CheckpointStore, make_ckpt: MakeCkpt
) -> None:
    make_ckpt(1)
    for _ in range(2):
        (make_ckpt(2).path / "MANIFEST.json").unlink()
        loaded = store.load_latest()
        assert loaded is not None and loaded.step == 1
    assert len(_corrupt_dirs(store.root)) == 2
