"""The SDK's last words: what the built-in worker tells the supervisor with error.json and its
exit code, the user's script tells it too, so that the supervisor does with it what it does for
its own workers. A checkpoint the disk cannot read (EIO, EACCES) is exit 1 kind
`checkpoint_unreadable`: backed off, nothing moved, the newest resumed once reads work.
Checkpoints of which none verifies, left uncaught, are exit 78 (FATAL at once). Running out of
memory, left uncaught, is exit 76 (stepped down). Real files, the store's read seam
(checkpoints/_faults.py), and real processes for what a script lets escape."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import rlsup
from checkpoints._faults import ENV as FAULT_ENV
from training import protocol as P

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _commit_two(run_dir: Path) -> None:
    run = rlsup.attach(run_dir, handle_signals=False)
    try:
        for step in (100, 200):
            with run.checkpoint(step) as d:
                (d / "state").write_text(str(step))
                run.save_arrays("replay", np.arange(4096, dtype=np.int64) * step, chunk_bytes=4096)
    finally:
        run.close()


def _listing(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / P.CHECKPOINT_DIR).iterdir())


def _script(tmp: Path, body: str, run_dir: Path, arg: str) -> subprocess.CompletedProcess[str]:
    """`body` as a script of its own, run outside rlsup: `python train.py RUN_DIR ARG`."""
    script = tmp / "train.py"
    script.write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSUP_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, str(script), str(run_dir), arg],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


def _error(run_dir: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((run_dir / P.ERROR_FILE).read_text())
    return data


@pytest.mark.parametrize("errno_name", ["EIO", "EACCES"])
def test_latest_under_a_read_error_exits_checkpoint_unreadable_and_moves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_name: str
) -> None:
    run_dir = tmp_path / "run"
    _commit_two(run_dir)
    before = _listing(run_dir)
    control = tmp_path / "faults"
    control.write_text(f"{errno_name} {run_dir / P.CHECKPOINT_DIR}/\n")
    monkeypatch.setenv(FAULT_ENV, str(control))
    run = rlsup.attach(run_dir, handle_signals=False)
    try:
        with pytest.raises(SystemExit) as exc:
            run.latest()
        assert exc.value.code == 1
    finally:
        run.close()
    error = _error(run_dir)
    assert error["kind"] == "checkpoint_unreadable", error
    assert error["exit_code"] == 1 and error["pid"] == os.getpid()
    assert error["sid"] == os.getsid(0)
    assert os.strerror(getattr(errno, errno_name)) in str(error["message"])
    assert str(run_dir / P.CHECKPOINT_DIR) in str(error["message"])
    assert _listing(run_dir) == before, "nothing quarantined, nothing removed"

    control.write_text("")  # the disk is back: the newest checkpoint, whole
    again = rlsup.attach(run_dir, handle_signals=False)
    try:
        latest = again.latest()
        assert latest is not None and again.latest_step == 200
        assert (again.load_arrays("replay") == np.arange(4096) * 200).all()
    finally:
        again.close()


def test_load_arrays_under_a_read_error_exits_checkpoint_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    _commit_two(run_dir)
    before = _listing(run_dir)
    control = tmp_path / "faults"
    control.write_text("")
    monkeypatch.setenv(FAULT_ENV, str(control))
    run = rlsup.attach(run_dir, handle_signals=False)
    try:
        latest = run.latest()
        assert latest is not None
        control.write_text(f"EIO {latest}/arrays/\n")  # the disk fails between the two reads
        with pytest.raises(SystemExit) as exc:
            run.load_arrays("replay")
        assert exc.value.code == 1
    finally:
        run.close()
    error = _error(run_dir)
    assert error["kind"] == "checkpoint_unreadable", error
    assert "replay" in str(error["message"]) and os.strerror(errno.EIO) in str(error["message"])
    assert _listing(run_dir) == before


OWN_READ = """
    import errno, sys
    import rlsup

    run = rlsup.attach(sys.argv[1], handle_signals=False)
    ckpt = run.latest()
    where = ckpt / "state" if sys.argv[2] == "checkpoint" else sys.argv[1] + "/../elsewhere"
    # What torch.load(ckpt / "model.pt", weights_only=True) raises on a failing disk.
    raise OSError(errno.EIO, "Input/output error", str(where))
"""


@pytest.mark.parametrize("where", ["checkpoint", "elsewhere"])
def test_the_scripts_own_uncaught_read_error_in_a_checkpoint_is_checkpoint_unreadable(
    tmp_path: Path, where: str
) -> None:
    """The script's own reads (torch.load of its files in the checkpoint) go around the store:
    an OSError it does not catch, about a file under the checkpoints, is checkpoint_unreadable;
    one about any other file stays the crash it is (no error.json of the SDK's)."""
    run_dir = tmp_path / "run"
    _commit_two(run_dir)
    out = _script(tmp_path, OWN_READ, run_dir, where)
    assert out.returncode == 1, out.stderr
    assert "OSError: [Errno 5] Input/output error" in out.stderr, "the traceback is still shown"
    if where == "elsewhere":
        assert not (run_dir / P.ERROR_FILE).exists(), _error(run_dir)
        return
    error = _error(run_dir)
    assert error["kind"] == "checkpoint_unreadable", error
    assert error["sid"] == os.getsid(0) and error["pid"] != os.getpid()
    assert "ckpt-" in str(error["message"]) and "state" in str(error["message"])


NONE_VERIFIES = """
    import sys
    import rlsup

    run = rlsup.attach(sys.argv[1], handle_signals=False)
    try:
        run.latest()
    except rlsup.NoValidCheckpoint:
        if sys.argv[2] == "caught":
            print("the script decides", flush=True)
            sys.exit(0)
        raise
"""


@pytest.mark.parametrize("handled", ["uncaught", "caught"])
def test_no_valid_checkpoint_left_uncaught_exits_78_as_the_worker_does(
    tmp_path: Path, handled: str
) -> None:
    """Checkpoints exist and none verifies: rlsup's worker exits 78 (FATAL at once: no restart
    can help, and none may start from zero). The SDK raises NoValidCheckpoint for the script to
    handle; left uncaught it is the same exit 78 with error.json kind no_valid_checkpoint, not a
    crash the supervisor would restart until its budget is spent."""
    run_dir = tmp_path / "run"
    _commit_two(run_dir)
    for state in (run_dir / P.CHECKPOINT_DIR).glob("ckpt-*/state"):
        state.write_text("rot")
    out = _script(tmp_path, NONE_VERIFIES, run_dir, handled)
    if handled == "caught":
        assert out.returncode == 0 and "the script decides" in out.stdout, out.stderr
        assert not (run_dir / P.ERROR_FILE).exists()
        return
    assert out.returncode == P.ExitCode.CONFIG == 78, out.stderr
    assert "NoValidCheckpoint: no checkpoint in" in out.stderr, "the traceback is still shown"
    error = _error(run_dir)
    assert error["kind"] == "no_valid_checkpoint" and error["exit_code"] == 78, error
    assert "refusing to start from zero" in str(error["message"])
    assert "ckpt-000000000200" in str(error["message"])


OUT_OF_MEMORY = """
    import sys
    import rlsup

    run = rlsup.attach(sys.argv[1], handle_signals=False)
    run.latest()
    if sys.argv[2] == "host":
        raise MemoryError()
    if sys.argv[2] == "cuda":  # what torch's allocator raises when the GPU is full
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    raise RuntimeError("loss is nan")
"""


@pytest.mark.parametrize(("which", "kind"), [("host", "host_oom"), ("cuda", "cuda_oom")])
def test_running_out_of_memory_uncaught_exits_76_as_the_worker_does(
    tmp_path: Path, which: str, kind: str
) -> None:
    """A CUDA OOM on the first optimizer step (a shared GPU) or a MemoryError in the user's own
    script: exit 76 with error.json saying which, so the stability policy scales the game down
    (`run.knobs` smaller at the restart) instead of restarting it at the same size as a crash.
    Any other error stays a crash (exit 1, no error.json)."""
    run_dir = tmp_path / "run"
    _commit_two(run_dir)
    out = _script(tmp_path, OUT_OF_MEMORY, run_dir, which)
    assert out.returncode == P.ExitCode.OOM == 76, out.stderr
    error = _error(run_dir)
    assert error["kind"] == kind and error["exit_code"] == 76, error
    assert "out of memory" in str(error["message"]) and "Traceback" in str(error["traceback"])
    (run_dir / P.ERROR_FILE).unlink()
    crash = _script(tmp_path, OUT_OF_MEMORY, run_dir, "bug")
    assert crash.returncode == 1 and "loss is nan" in crash.stderr
    assert not (run_dir / P.ERROR_FILE).exists()
