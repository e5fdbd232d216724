"""`rlsup.CheckpointFailed` for every I/O failure inside a checkpoint block, on a real full
filesystem (a tmpfs): the SDK's own `save_arrays`, the script's own `open().write()`, torch's
`torch.save` (which reports a full disk as a RuntimeError). Each ends with the staging directory
removed, the previous checkpoint intact, the failure in the heartbeat and a retry within 60 s;
a bug in the block (not an I/O failure) still propagates unchanged."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import rlsup
import rlsup._run
from checkpoints import CheckpointError
from training import protocol as P

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs"),
]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs")
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


class Clock:
    """`rlsup._run`'s view of time, moved forward by the test (the heartbeat thread and
    everything else keep the real clock)."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead_s


@pytest.fixture
def run(disk: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[rlsup.Run]:
    clock = Clock()
    monkeypatch.setattr(
        rlsup._run, "time", SimpleNamespace(monotonic=clock.monotonic, time=time.time)
    )
    r = rlsup.attach(disk / "run", checkpoint_every_s=3600, handle_signals=False, heartbeat=True)
    r.clock = clock  # type: ignore[attr-defined]
    r.heartbeat(1)
    with r.checkpoint(1) as d:
        (d / "state").write_text("one")
        r.save_arrays("replay", np.arange(1000, dtype=np.int64))
    yield r
    r.close()


def _assert_failed_cleanly(run: rlsup.Run, failures: int) -> None:
    root = run.run_dir / P.CHECKPOINT_DIR
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-000000000001"], "staging removed"
    assert run.latest() is not None and run.latest_step == 1
    assert (run.latest() / "state").read_text() == "one"  # type: ignore[operator]
    assert (run.load_arrays("replay") == np.arange(1000)).all(), "the previous one intact"
    hb = run._hb
    assert hb is not None
    assert hb.current.checkpoint_failures == failures
    assert hb.current.last_checkpoint_error
    # Retried within 60 s (the interval is an hour), not before.
    assert not run.should_checkpoint(2)
    run.clock.ahead_s += 61  # type: ignore[attr-defined]
    assert run.should_checkpoint(2)


def _failure(raised: pytest.ExceptionInfo[rlsup.CheckpointFailed]) -> BaseException:
    cause = raised.value.__cause__
    assert cause is not None, "chained to what failed"
    return cause


def test_a_full_disk_inside_save_arrays_is_a_checkpoint_failed(run: rlsup.Run) -> None:
    big = np.ones(4 << 20, dtype=np.uint8)  # 4 MiB on a 2 MiB disk
    with pytest.raises(rlsup.CheckpointFailed) as raised, run.checkpoint(2):
        run.save_arrays("replay", big)
    assert isinstance(_failure(raised), CheckpointError)
    assert "No space left" in str(raised.value)
    _assert_failed_cleanly(run, 1)


def test_a_full_disk_under_the_scripts_own_write_is_a_checkpoint_failed(run: rlsup.Run) -> None:
    with (
        pytest.raises(rlsup.CheckpointFailed) as raised,
        run.checkpoint(2) as d,
        open(d / "model.bin", "wb") as f,
    ):
        f.write(b"\0" * (4 << 20))
    cause = _failure(raised)
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    _assert_failed_cleanly(run, 1)
    with pytest.raises(rlsup.CheckpointFailed), run.checkpoint(3) as d:
        (d / "model.bin").write_bytes(b"\0" * (4 << 20))
    assert run._hb is not None and run._hb.current.checkpoint_failures == 2


def test_a_full_disk_under_torch_save_is_a_checkpoint_failed(run: rlsup.Run) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(rlsup.CheckpointFailed) as raised, run.checkpoint(2) as d:
        torch.save({"w": torch.zeros(1 << 20)}, d / "state.pt")  # 4 MiB
    assert isinstance(_failure(raised), RuntimeError), "torch's own report of ENOSPC"
    _assert_failed_cleanly(run, 1)


def test_a_bug_in_the_block_propagates_unchanged_and_is_no_checkpoint_failure(
    run: rlsup.Run,
) -> None:
    with pytest.raises(ZeroDivisionError), run.checkpoint(2) as d:
        (d / "state").write_text("two")
        _ = 1 / 0
    root = run.run_dir / P.CHECKPOINT_DIR
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-000000000001"]
    assert run._hb is not None and run._hb.current.checkpoint_failures == 0
    with run.checkpoint(2) as d:  # and the next one commits
        (d / "state").write_text("two")
    assert run.last_checkpoint_step == 2


def test_after_a_failed_checkpoint_the_next_commits_once_space_returns(
    run: rlsup.Run, disk: Path
) -> None:
    ballast = disk / "ballast"
    with contextlib.suppress(OSError), open(ballast, "wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()
    with pytest.raises(rlsup.CheckpointFailed), run.checkpoint(2) as d:
        (d / "state").write_text("two" * 10_000)
    ballast.unlink()
    with run.checkpoint(2) as d:
        (d / "state").write_text("two")
    assert run.last_checkpoint_step == 2
    assert run._hb is not None and run._hb.current.checkpoint_failures == 1


FULL_STDERR_SCRIPT = """
import sys, numpy as np, rlsup
run = rlsup.attach(sys.argv[1], checkpoint_every_s=3600, handle_signals=False)
run.heartbeat(1)
try:
    with open(sys.argv[2], "wb") as f:  # the rest of the disk: nothing more fits
        while True:
            f.write(b"x" * 4096)
            f.flush()
except OSError:
    pass
try:
    with run.checkpoint(1) as d:
        run.save_arrays("replay", np.arange(10_000, dtype=np.int64))
except rlsup.CheckpointFailed:
    sys.exit(42)  # what a script is promised: train on, retried later
"""


def test_a_full_disk_under_the_scripts_own_log_is_still_a_checkpoint_failed(
    disk: Path, tmp_path: Path
) -> None:
    """Under rlsup the script's stderr is its log, on the state disk that is full: the SDK's
    own word about the failure must not turn it into an OSError from `print`."""
    script = tmp_path / "full.py"
    script.write_text(FULL_STDERR_SCRIPT)
    with (disk / "game.log").open("ab") as log:
        done = subprocess.run(
            [sys.executable, str(script), str(disk / "run"), str(disk / "ballast")],
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            timeout=60,
        )
    assert done.returncode == 42, (disk / "game.log").read_bytes()[-2000:]
