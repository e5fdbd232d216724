"""The SDK (`import rlsup`) on its own: a real run directory, real files, real signals and real
processes; the supervisor side of command games is tests/supervisor/daemon/test_command_games.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import rlsup
from checkpoints.names import MANIFEST_NAME
from supervisor.observe.readonly import read_progress
from training import protocol as P

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _attach(path: Path, **kw: object) -> rlsup.Run:
    kw.setdefault("handle_signals", False)
    return rlsup.attach(path, **kw)  # type: ignore[arg-type]


def _ckpts(run_dir: Path) -> list[str]:
    root = run_dir / P.CHECKPOINT_DIR
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_import_needs_neither_torch_nor_numpy() -> None:
    code = "import sys, rlsup; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_attach_without_a_run_dir_outside_rlsup_says_what_to_do() -> None:
    with pytest.raises(rlsup.SdkError, match=r"run_dir=.*RLSUP_RUN_DIR"):
        rlsup.attach()


def test_the_supervisors_run_dir_and_settings_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(P.RUN_DIR_ENV, str(tmp_path / "theirs"))
    monkeypatch.setenv(P.GAME_ENV, "pong")
    monkeypatch.setenv(P.SEED_ENV, "7")
    monkeypatch.setenv(P.RESUME_COUNT_ENV, "3")
    monkeypatch.setenv(P.MODE_ENV, "light")
    monkeypatch.setenv(P.NUM_ENVS_ENV, "16")
    monkeypatch.setenv(P.BATCH_SIZE_ENV, "auto")
    monkeypatch.setenv(P.CHECKPOINT_EVERY_S_ENV, "42")
    monkeypatch.setenv(P.KEEP_CHECKPOINTS_ENV, "5")
    with _attach(tmp_path / "mine", checkpoint_every_s=1000) as run:
        assert run.run_dir == tmp_path / "theirs" and run.supervised
        assert (run.game, run.seed, run.resume_count, run.mode) == ("pong", 7, 3, "light")
        assert run.knobs == {"num_envs": 16, "batch_size": "auto"}
        assert run.checkpoint_every_s == 42.0 and run.store.keep == 5
    assert not (tmp_path / "mine").exists()
    monkeypatch.setenv(P.SEED_ENV, "seven")
    with pytest.raises(rlsup.SdkError, match="RLSUP_SEED='seven'"):
        _attach(tmp_path / "mine")


def test_a_checkpoint_block_commits_what_it_holds_and_latest_returns_it(tmp_path: Path) -> None:
    with _attach(tmp_path) as run:
        assert run.latest() is None
        with run.checkpoint(100, lr=3e-4) as d:
            (d / "model.bin").write_bytes(b"weights" * 1000)
            (d / "extra").mkdir()
            (d / "extra" / "notes.txt").write_text("hello")
        assert run.last_checkpoint_step == 100
    ckpt = tmp_path / P.CHECKPOINT_DIR / "ckpt-000000000100"
    manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
    files = manifest["files"]
    assert set(files) == {"model.bin", "extra/notes.txt"}
    assert files["model.bin"]["sha256"] == hashlib.sha256(b"weights" * 1000).hexdigest()
    assert manifest["meta"]["lr"] == 3e-4 and manifest["meta"]["sdk"] == 1
    assert oct((ckpt / "model.bin").stat().st_mode & 0o777) in ("0o600", "0o640")
    with _attach(tmp_path) as again:
        assert again.latest() == ckpt
        assert again.resumed_from_step == 100


def test_a_block_that_raises_commits_nothing_and_leaves_no_staging(tmp_path: Path) -> None:
    with _attach(tmp_path) as run:
        with run.checkpoint(1) as d:
            (d / "a").write_text("good")
        with pytest.raises(RuntimeError, match="mid-save"), run.checkpoint(2) as d:
            (d / "a").write_text("half")
            raise RuntimeError("mid-save")
        assert _ckpts(tmp_path) == ["ckpt-000000000001"]
        assert run.last_checkpoint_step == 1


@pytest.mark.parametrize("bad", ["link", "deep", "fifo"])
def test_a_staged_file_that_is_not_a_plain_file_is_refused_and_nothing_commits(
    tmp_path: Path, bad: str
) -> None:
    with _attach(tmp_path / "run") as run:
        with pytest.raises(rlsup.CheckpointFailed, match="step 5"), run.checkpoint(5) as d:
            (d / "ok").write_text("x")
            if bad == "link":
                (d / "secret").symlink_to("/etc/hostname")
            elif bad == "deep":
                (d / "a" / "b").mkdir(parents=True)
                (d / "a" / "b" / "c").write_text("x")
            else:
                os.mkfifo(d / "pipe")
        assert _ckpts(tmp_path / "run") == []


def test_arrays_round_trip_in_every_plain_dtype_and_shape(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "frames": rng.integers(0, 255, size=(50, 4, 21, 21), dtype=np.uint8),
        "rewards": rng.standard_normal(1000).astype(np.float32),
        "dones": rng.random(333) < 0.1,
        "actions": rng.integers(0, 18, size=(10, 7)).astype(np.int64),
        "empty": np.zeros((0, 3), dtype=np.float64),
        "scalar": np.array(3.5),
        "strided": rng.standard_normal((40, 40))[::2, ::3],  # not contiguous: copied once
    }
    with _attach(tmp_path) as run, run.checkpoint(10):
        for name, a in arrays.items():
            run.save_arrays(name, a, chunk_bytes=4096)
    with _attach(tmp_path) as run:
        run.latest()
        for name, a in arrays.items():
            got = run.load_arrays(name)
            assert got.dtype == a.dtype and got.shape == a.shape, name
            assert np.array_equal(got, a), name


def test_only_changed_chunks_are_written_the_rest_are_hard_links(tmp_path: Path) -> None:
    buf = np.random.default_rng(1).integers(0, 255, size=(100, 100, 100), dtype=np.uint8)
    chunk = 1 << 16  # 1e6 bytes in 16 chunks
    with _attach(tmp_path) as run:
        with run.checkpoint(1):
            first = run.save_arrays("replay", buf, chunk_bytes=chunk)
        buf[5] = 0  # 1 % of the rows: 10,000 bytes, inside one chunk
        with run.checkpoint(2):
            second = run.save_arrays("replay", buf, chunk_bytes=chunk)
    assert first == {"bytes_written": buf.nbytes, "bytes_linked": 0}
    assert second["bytes_written"] == chunk
    assert second["bytes_linked"] == buf.nbytes - chunk
    one = tmp_path / P.CHECKPOINT_DIR / "ckpt-000000000001" / "arrays"
    two = tmp_path / P.CHECKPOINT_DIR / "ckpt-000000000002" / "arrays"
    assert (one / "replay.000015").stat().st_ino == (two / "replay.000015").stat().st_ino
    assert (one / "replay.000000").stat().st_ino != (two / "replay.000000").stat().st_ino
    with _attach(tmp_path) as run:
        run.latest()
        assert np.array_equal(run.load_arrays("replay"), buf)


def test_arrays_refuse_what_would_need_pickle_or_escape_the_checkpoint(tmp_path: Path) -> None:
    with _attach(tmp_path) as run:
        with pytest.raises(rlsup.SdkError, match="only inside"):
            run.save_arrays("a", np.zeros(3))
        with run.checkpoint(1):
            with pytest.raises(rlsup.SdkError, match="pickle"):
                run.save_arrays("objs", np.array([{"a": 1}], dtype=object))
            for name in ("../x", "a/b", ".hidden", "", "x" * 101):
                with pytest.raises(rlsup.SdkError, match="array name"):
                    run.save_arrays(name, np.zeros(3))
            run.save_arrays("fine", np.zeros(3))
        with pytest.raises(rlsup.SdkError, match=r"no such array .*it has: fine"):
            run.load_arrays("other")
    with _attach(tmp_path / "empty") as run, pytest.raises(rlsup.SdkError, match="no checkpoint"):
        run.load_arrays("fine")


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path) -> None:
    with _attach(tmp_path) as run:
        for step in (1, 2):
            with run.checkpoint(step):
                run.save_arrays("x", np.full(1000, step, dtype=np.int32))
    newest = tmp_path / P.CHECKPOINT_DIR / "ckpt-000000000002" / "arrays" / "x.000000"
    newest.unlink()  # the link to step 1's chunk is not shared: step 2's data differs
    newest.write_bytes(b"\0" * 4000)
    with _attach(tmp_path) as run:
        assert run.latest() == tmp_path / P.CHECKPOINT_DIR / "ckpt-000000000001"
        assert np.array_equal(run.load_arrays("x"), np.full(1000, 1, dtype=np.int32))
    names = _ckpts(tmp_path)
    assert names[0].startswith(".corrupt-ckpt-000000000002") and names[1:] == ["ckpt-000000000001"]
    # An array's header (not one of its chunks, whose rows a load may do without: see
    # tests/checkpoints/test_sdk_shared_rot.py) damaged in the last one: none verifies.
    one = tmp_path / P.CHECKPOINT_DIR / "ckpt-000000000001" / "arrays" / "x.json"
    one.write_bytes(b"{}" + one.read_bytes()[2:])
    with _attach(tmp_path) as run, pytest.raises(rlsup.NoValidCheckpoint, match=r"none|no "):
        run.latest()


def test_retention_keeps_the_newest(tmp_path: Path) -> None:
    with _attach(tmp_path, keep=2) as run:
        for step in (1, 2, 3, 4):
            with run.checkpoint(step) as d:
                (d / "s").write_text(str(step))
    assert _ckpts(tmp_path) == ["ckpt-000000000003", "ckpt-000000000004"]


def test_heartbeats_use_the_workers_schema_and_feed_progress(tmp_path: Path) -> None:
    with _attach(tmp_path, algo="mine", total_steps=1000) as run:
        assert not (tmp_path / P.HEARTBEAT_FILE).exists()  # not before the script opts in
        run.heartbeat(10, mean_return=1.5, episodes=2, loss=0.25, nan=float("nan"))
        with run.checkpoint(10):
            pass
        run.heartbeat(15, mean_return=9.0)  # within 50 ms: only the step is taken
        assert run._step == 15
        time.sleep(0.06)
        run.heartbeat(20, mean_return=2.0, loss=0.5)
        hb = P.read_heartbeat(tmp_path)
        assert hb is not None
        assert (hb.phase, hb.global_step, hb.writer, hb.algo) == ("training", 20, "sdk", "mine")
        assert hb.pid == os.getpid() and hb.total_steps == 1000
        assert hb.last_checkpoint_step == 10 and hb.mean_return == 2.0
        assert hb.metrics == {"loss": 0.5}
    rows = read_progress(tmp_path)
    assert rows and rows[0]["global_step"] == "10" and rows[0]["loss"] == "0.25"
    assert rows[0]["mean_return"] == "1.5"


def test_should_checkpoint_on_the_interval_the_steps_a_request_and_a_stop(tmp_path: Path) -> None:
    with _attach(tmp_path, checkpoint_every_s=3600, checkpoint_every_steps=100) as run:
        assert not run.should_checkpoint(50)
        assert run.should_checkpoint(100)
        with run.checkpoint(100):
            pass
        assert not run.should_checkpoint(150)
        time.sleep(0.01)
        (tmp_path / P.CHECKPOINT_REQUEST_FILE).touch()  # the supervisor asks for one now
        time.sleep(0.06)  # the file is looked at every 50 ms at most (a stat per step cost 4 %)
        assert run.should_checkpoint(150)
        with run.checkpoint(150):
            pass
        assert not run.should_checkpoint(160)
        run.request_stop("test")
        assert run.should_stop() and run.should_checkpoint(160)
    with _attach(tmp_path / "timed", checkpoint_every_s=0.2) as run:
        assert not run.should_checkpoint()
        time.sleep(0.25)
        assert run.should_checkpoint()


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(body))
    return path


def _env(run_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSUP_")}
    env.update({"RLSUP_TEST_RUN": os.environ["RLSUP_TEST_RUN"], P.RUN_DIR_ENV: str(run_dir)})
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _wait_for(cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


LOOP = """
    import sys, time, rlsup
    run = rlsup.attach(checkpoint_every_s=3600)
    step = 0
    if (d := run.latest()) is not None:
        step = int((d / "step").read_text())
    print("resumed", step, flush=True)
    while step < 10**9:
        step += 1
        time.sleep(0.001)
        run.heartbeat(step)
        if run.should_checkpoint(step):
            with run.checkpoint(step) as d:
                (d / "step").write_text(str(step))
"""


def test_sigterm_becomes_a_final_checkpoint_and_exit_75(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path, LOOP))], env=_env(run_dir))
    try:
        _wait_for(lambda: (hb := P.read_heartbeat(run_dir)) is not None and hb.global_step > 50)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == P.ExitCode.STOPPED
    finally:
        proc.kill()
        proc.wait()
    (name,) = _ckpts(run_dir)
    hb = P.read_heartbeat(run_dir)
    assert hb is not None and hb.phase == "stopping" and hb.last_checkpoint_step == int(name[5:])


def test_two_processes_on_one_run_dir_are_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, str(_script(tmp_path, LOOP))], env=_env(run_dir))
    try:
        _wait_for(lambda: P.read_heartbeat(run_dir) is not None)
        with pytest.raises(rlsup.RunDirLocked, match=f"pid {first.pid}"):
            rlsup.attach(run_dir, lock_wait_s=0.3, handle_signals=False)
    finally:
        first.kill()
        first.wait()
    with _attach(run_dir, lock_wait_s=0.3):  # the kernel let go with the process
        pass


def test_a_supervisor_gone_is_a_stop(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    script = _script(tmp_path, LOOP)
    # The supervisor the script is told about is no longer running: as if it died.
    dead = subprocess.Popen(["true"])
    dead.wait()
    env = _env(run_dir, RLSUP_PARENT_PID=str(dead.pid))
    proc = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        assert proc.wait(30) == P.ExitCode.STOPPED
    finally:
        proc.kill()
        proc.wait()
    assert len(_ckpts(run_dir)) == 1


def test_an_exit_without_the_last_steps_checkpoint_says_so_and_the_last_step_is_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _attach(tmp_path, exit_on_stop=False)
    run.heartbeat(10)
    with run.checkpoint(10):
        pass
    for step in range(11, 40):
        run.heartbeat(step)  # within 50 ms: only the live step moves
    run.request_stop("test")
    with pytest.raises(SystemExit) as exited:
        run.exit_stopped()
    assert exited.value.code == P.ExitCode.STOPPED
    assert "exiting 75 at step 39 without a checkpoint of it (last committed: 10)" in (
        capsys.readouterr().err
    )
    hb = P.read_heartbeat(tmp_path)
    assert hb is not None and (hb.global_step, hb.phase) == (39, "stopping")


def _request_report(run_dir: Path) -> dict | None:
    hb = P.read_heartbeat(run_dir)
    assert hb is not None
    return hb.checkpoint_request


def test_a_served_request_is_in_the_heartbeat_as_the_learners_report_it(tmp_path: Path) -> None:
    """The supervisor (a preemption notice) and `rlsup status` wait for the heartbeat's
    `checkpoint_request.committed`: the SDK reports it as rlsup's own learners do."""
    with _attach(tmp_path, checkpoint_every_s=3600) as run:
        run.heartbeat(10)
        time.sleep(0.01)
        (tmp_path / P.CHECKPOINT_REQUEST_FILE).touch()
        requested = (tmp_path / P.CHECKPOINT_REQUEST_FILE).stat().st_mtime
        assert run.should_checkpoint(10)
        seen = _request_report(tmp_path)
        assert seen is not None and seen["requested"] == requested
        assert seen["committed"] is None
        with run.checkpoint(10):
            pass
        served = _request_report(tmp_path)
        assert served is not None and served["requested"] == requested
        assert served["committed_step"] == 10 and served["committed"] >= requested
        assert served["latency_s"] is not None and served["latency_s"] >= 0
        assert not run.should_checkpoint(11)


def test_a_request_first_seen_after_a_checkpoint_that_captured_it_is_reported_served(
    tmp_path: Path,
) -> None:
    """The request lands just before a periodic checkpoint opens, and the loop asks only after
    that checkpoint committed: no second checkpoint is owed, and the first one serves it."""
    with _attach(tmp_path, checkpoint_every_s=3600) as run:
        run.heartbeat(5)
        time.sleep(0.01)
        (tmp_path / P.CHECKPOINT_REQUEST_FILE).touch()
        time.sleep(0.01)
        with run.checkpoint(5):  # the script's own periodic checkpoint
            pass
        assert not run.should_checkpoint(6)
        served = _request_report(tmp_path)
        assert served is not None and served["committed_step"] == 5


def test_a_request_made_while_a_checkpoint_is_written_is_owed_another(tmp_path: Path) -> None:
    """A request made after the state in a checkpoint was captured is not served by it."""
    with _attach(tmp_path, checkpoint_every_s=3600) as run:
        run.heartbeat(5)
        with run.checkpoint(5):
            time.sleep(0.02)
            (tmp_path / P.CHECKPOINT_REQUEST_FILE).touch()
            time.sleep(0.02)
        assert run.should_checkpoint(6)


def test_on_a_failing_host_the_interval_shortens_by_youngs_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RLSUP_HOST_MTBF_S (the supervisor's ledger): the script's checkpoints come at Young's
    interval for what its block cost, at the floor for a cheap one, never above the asked
    interval; unset, the asked interval."""

    def interval() -> float:
        hb = json.loads((tmp_path / "run" / P.HEARTBEAT_FILE).read_text())
        return float(hb["checkpoint_interval_s"])

    monkeypatch.setenv(P.MTBF_ENV, "30")
    run = _attach(tmp_path / "run", total_steps=100, checkpoint_every_s=60.0, heartbeat=True)
    with run.checkpoint(1) as d:
        (d / "model.bin").write_bytes(b"x" * 100)
    assert P.MIN_ADAPTIVE_INTERVAL_S <= interval() < 5.0
    with run.checkpoint(2) as d:
        (d / "model.bin").write_bytes(b"x" * 100)
        time.sleep(0.1)  # sqrt(2 x 0.1 x 30) = 2.45 s, and pacing says 100 x 0.1 = 10 s
    assert 9.9 <= interval() < 12.0
    run.close()
    monkeypatch.delenv(P.MTBF_ENV)
    run = _attach(tmp_path / "run", total_steps=100, checkpoint_every_s=60.0, heartbeat=True)
    with run.checkpoint(3) as d:
        (d / "model.bin").write_bytes(b"x" * 100)
    assert interval() == 60.0
    run.close()


def test_a_dear_checkpoint_is_paced_and_a_cheap_one_is_not(tmp_path: Path) -> None:
    """The script's checkpoint block stalls it all: one that took 200 ms is next due 20 s
    later (200 ms is then 1 % of the time between two) whatever `checkpoint_every_s` asks; a
    cheap one comes at the interval. Before pacing, the 15 s default would have made a script
    whose save takes 2 s spend an eighth of its time saving."""

    def interval() -> float:
        hb = json.loads((tmp_path / "run" / P.HEARTBEAT_FILE).read_text())
        return float(hb["checkpoint_interval_s"])

    run = _attach(tmp_path / "run", total_steps=100, checkpoint_every_s=30.0, heartbeat=True)
    with run.checkpoint(1) as d:
        (d / "model.bin").write_bytes(b"x" * 100)
    assert interval() == 30.0, "a cheap checkpoint: the interval asked for"
    run.checkpoint_every_s = 0.05
    with run.checkpoint(2) as d:
        (d / "model.bin").write_bytes(b"x" * 100)
        time.sleep(0.2)  # the script's own serialisation, as slow as a big model's
    assert interval() >= 20.0
    time.sleep(0.3)
    assert not run.should_checkpoint(3), "paced: due 20 s after a 200 ms stall, not 50 ms"
    run.close()
