"""The SDK's arrays under `keep = 3`: the chunks that never change are one inode shared by every
kept checkpoint, so one flipped byte there is in all of them. That must cost rows of that array
(named, reported), never every checkpoint; a good copy of the bytes, when there is one, costs
nothing at all."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlsup
from training import protocol as P

pytestmark = pytest.mark.e2e

ROWS, ROW_BYTES, CHUNK = 64, 1024, 16 * 1024  # 4 chunks of 16 rows
STATE = "state.json"


@pytest.fixture(autouse=True)
def _outside_rlsup(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RLSUP_") and name not in ("RLSUP_TEST_RUN", "RLSUP_BOOT_ID_PATH"):
            monkeypatch.delenv(name)


def _attach(run_dir: Path) -> rlsup.Run:
    return rlsup.attach(run_dir, keep=3, heartbeat=True, handle_signals=False)


def _buffer(fill_tail: bool = True) -> np.ndarray:
    buf = np.zeros((ROWS, ROW_BYTES), dtype=np.uint8)
    if fill_tail:
        buf[16:] = np.random.default_rng(0).integers(1, 255, size=(ROWS - 16, ROW_BYTES))
    return buf


def _train(run_dir: Path, buf: np.ndarray, steps: range) -> None:
    """A replay buffer whose first chunk changes at each checkpoint, the rest never."""
    with _attach(run_dir) as run:
        for step in steps:
            buf[step % 16] = step
            with run.checkpoint(step) as d:
                (d / STATE).write_text(json.dumps({"step": step}))
                run.save_arrays("replay", buf, chunk_bytes=CHUNK)


def _chunk(run_dir: Path, step: int, i: int) -> Path:
    return run_dir / P.CHECKPOINT_DIR / f"ckpt-{step:012d}" / "arrays" / f"replay.{i:06d}"


def _flip(path: Path, offset: int = 100) -> None:
    with open(path, "r+b") as f:  # in place: every hard link of the inode sees it
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def _heartbeat(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / P.HEARTBEAT_FILE).read_text())
    return data


def test_a_flipped_byte_in_a_chunk_every_checkpoint_shares_costs_rows_not_checkpoints(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    buf = _buffer()
    _train(tmp_path, buf, range(1, 6))  # kept: 3, 4, 5
    shared = _chunk(tmp_path, 5, 3)
    assert os.stat(shared).st_nlink == 3, "one inode in all three kept checkpoints"
    _flip(shared)

    with _attach(tmp_path) as run:
        newest = run.latest()
        assert newest is not None and newest.name == "ckpt-000000000005", "not NoValidCheckpoint"
        assert json.loads((newest / STATE).read_text()) == {"step": 5}
        assert run.damaged_rows("replay") == [(48, 64)]
        with pytest.raises(rlsup.ArrayDamaged, match=r"rows 48-63 of 64") as info:
            run.load_arrays("replay")  # never silently: the script opts into the holes
        assert info.value.rows == [(48, 64)] and info.value.name == "replay"
        got = run.load_arrays("replay", salvage=True)
        assert np.array_equal(got[:48], buf[:48]) and not got[48:].any()
        damage = _heartbeat(tmp_path)["replay_damage"]
        assert damage[-1]["checkpoint"] == "ckpt-000000000005"
        assert damage[-1]["files"] == ["arrays/replay.000003"]
        assert damage[-1]["rows_lost"] == {"replay": [[48, 64]]}
        got[48:] = buf[48:]  # the script refills what it lost (or drops those rows)
        with run.checkpoint(6):
            run.save_arrays("replay", got, chunk_bytes=CHUNK)
    err = capfd.readouterr().err
    assert "rows 48-63 of 64" in err and "replay.000003" in err
    assert not list((tmp_path / P.CHECKPOINT_DIR).glob(".corrupt-*")), "nothing quarantined"

    with _attach(tmp_path) as run:  # the next checkpoint wrote that chunk afresh: whole
        assert run.latest() == tmp_path / P.CHECKPOINT_DIR / "ckpt-000000000006"
        assert run.damaged_rows("replay") == []
        assert np.array_equal(run.load_arrays("replay"), got)


def test_a_bad_chunk_with_an_identical_healthy_one_is_repaired_and_nothing_is_lost(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A buffer not yet full: its empty chunks are identical, so a good copy of a damaged one
    lies beside it."""
    buf = _buffer(fill_tail=False)
    _train(tmp_path, buf, range(1, 5))
    _flip(_chunk(tmp_path, 4, 3))
    with _attach(tmp_path) as run:
        assert run.latest() == tmp_path / P.CHECKPOINT_DIR / "ckpt-000000000004"
        assert run.damaged_rows("replay") == []
        assert np.array_equal(run.load_arrays("replay"), buf)
        repaired = _heartbeat(tmp_path)["replay_damage"][-1]
        assert repaired["files"] == ["arrays/replay.000003"] and repaired["rows_lost"] == {}
        where = repaired["repaired"]["arrays/replay.000003"]
        assert re.fullmatch(r"ckpt-0000000000\d\d/arrays/replay\.00000[12]", where), where
    assert "repaired" in capfd.readouterr().err


def test_damage_in_the_newest_alone_still_resumes_the_previous_checkpoint_exactly(
    tmp_path: Path,
) -> None:
    buf = _buffer()
    _train(tmp_path, buf, range(1, 4))
    _flip(_chunk(tmp_path, 3, 0))  # chunk 0 changed at every step: step 3's own copy
    with _attach(tmp_path) as run:
        assert run.latest() == tmp_path / P.CHECKPOINT_DIR / "ckpt-000000000002"
        assert run.damaged_rows("replay") == []
        want = buf.copy()
        want[3] = 0  # step 2's buffer: row 3 not yet written
        assert np.array_equal(run.load_arrays("replay"), want)


@pytest.mark.parametrize(
    ("shape", "chunk_bytes", "chunks", "rows"),
    [
        ([64, 1024], 16384, [3], [(48, 64)]),
        ([64, 1024], 16384, [0, 1, 3], [(0, 32), (48, 64)]),
        ([10, 3], 8, [1], [(2, 6)]),  # rows of 3 bytes split by the chunk's edges: both lost
        ([10, 3], 8, [3], [(8, 10)]),  # the last, short chunk
        ([], 8, [0], [(0, 1)]),  # a 0-d array is one row
    ],
)
def test_the_rows_a_lost_chunk_held(
    shape: list[int], chunk_bytes: int, chunks: list[int], rows: list[tuple[int, int]]
) -> None:
    from rlsup import _damage

    nbytes = int(np.prod(shape)) if shape else 1
    header = {"shape": shape, "nbytes": nbytes, "chunk_bytes": chunk_bytes}
    assert _damage.rows_of_chunks(header, chunks) == rows
