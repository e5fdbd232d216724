"""Names given to the writer or reader must stay inside the checkpoint directory."""

from __future__ import annotations

import pytest

from checkpoints import CheckpointStore, validate_name

BAD_NAMES = [
    "../x",
    "/abs",
    "a/b/c",
    ".hidden",
    "a/.hidden",
    "a/..",
    "..",
    ".",
    "",
    "a//b",
    "a/",
    "sp ace",
    "back\\slash",
    "nul\x00",
    "MANIFEST.json",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_rejected_by_writer(store: CheckpointStore, name: str) -> None:
    with store.begin(1, {}) as w:
        with pytest.raises(ValueError, match="invalid checkpoint file name"):
            w.write_bytes(name, b"x")
        w.abort()


@pytest.mark.parametrize("name", ["learner.pt", "replay/frames-000003.bin", "a_b-C.9"])
def test_good_names_are_accepted(name: str) -> None:
    assert validate_name(name) == name


def test_file_and_subdirectory_of_same_name_clash(store: CheckpointStore) -> None:
    with store.begin(1, {}) as w:
        w.write_bytes("replay", b"x")
        with pytest.raises(ValueError, match="clashes"):
            w.write_bytes("replay/a.bin", b"x")
        w.abort()
