"""The worker as a real process: exit codes, kills, resume, corruption, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workerutil import REPO, committed_steps, heartbeat, kill, run, start, wait_for

pytestmark = pytest.mark.e2e

CARTPOLE_PPO = (
    "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "64",
    "--batch-size", "64", "--threads", "1", "--eval-episodes", "2",
)  # fmt: skip


def ckpt_dirs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("ckpt-*"))


# ---- bad input: exit 78, one clear line, nothing written ----------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--game", "Pongg-v5"), "did you mean Pong-v5"),
        (("--game", "CartPole-v1", "--num-envs", "3", "--batch-size", "100"), "does not divide"),
        (("--algo", "pqn", "--num-envs", "3", "--batch-size", "100"), "does not divide"),
        (("--num-envs", "0"), "--num-envs 0"),
        (("--total-steps", "-5"), "--total-steps -5"),
    ],
)
def test_bad_input_exits_78_and_writes_nothing(tmp_path: Path, args: tuple[str, ...], needle: str):
    run_dir = tmp_path / "run"
    proc = run(run_dir, *args)
    assert proc.returncode == 78, proc.stderr
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not run_dir.exists()


def test_unwritable_run_dir_exits_78(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = run(blocker / "run", *CARTPOLE_PPO)
    assert proc.returncode == 78
    assert "--run-dir" in proc.stderr and "cannot create" in proc.stderr


def test_help_lists_every_flag():
    proc = subprocess.run(
        [sys.executable, "-m", "training.worker", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    for flag in (
        "--checkpoint-every-steps",
        "--keep-checkpoints",
        "--preset",
        "--dueling",
        "--q-lambda",
    ):
        assert flag in proc.stdout


# ---- kills and resume -----------------------------------------------------------------------


def test_sigkill_then_rerun_resumes_at_last_committed_step(tmp_path: Path):
    run_dir = tmp_path / "run"
    args = (*CARTPOLE_PPO, "--total-steps", "20000", "--checkpoint-every-steps", "2000")
    proc = start(run_dir, *args)
    wait_for(lambda: len(committed_steps(run_dir)) >= 2, 120, "two checkpoints")
    kill(proc)
    before = committed_steps(run_dir)
    again = run(run_dir, *args)
    assert again.returncode == 0, again.stdout[-2000:]
    hb = heartbeat(run_dir)
    assert hb is not None
    # Resumed from the newest committed step, never from zero or an older one.
    assert hb["resumed_from_step"] == max(before)
    assert hb["global_step"] >= 20000
    assert hb["last_checkpoint_step"] == hb["global_step"]
    eval_result = json.loads((run_dir / "eval.json").read_text())
    assert eval_result["episodes"] == 2 and eval_result["step"] == hb["global_step"]


def test_finished_run_exits_0_at_once(tmp_path: Path):
    run_dir = tmp_path / "run"
    args = (*CARTPOLE_PPO, "--total-steps", "2000")
    assert run(run_dir, *args).returncode == 0
    steps = committed_steps(run_dir)
    t0 = time.monotonic()
    again = run(run_dir, *args)
    assert again.returncode == 0
    assert committed_steps(run_dir) == steps  # nothing trained, nothing written
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("bad", ["Infinity", "NaN", '"abc"', "-1e999"])
def test_a_finished_runs_unusable_eval_json_is_evaluated_again_not_a_crash(
    tmp_path: Path, bad: str
):
    """eval.json's step as `json.dump(float("inf"))` writes it, or a string: not current."""
    run_dir = tmp_path / "run"
    args = (*CARTPOLE_PPO, "--total-steps", "2000")
    assert run(run_dir, *args).returncode == 0
    (run_dir / "eval.json").write_text(f'{{"step": {bad}, "mean": 1.0, "episodes": 2}}')
    again = run(run_dir, *args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((run_dir / "eval.json").read_text())["step"] == max(committed_steps(run_dir))


def test_sigterm_checkpoints_and_exits_75(tmp_path: Path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, *CARTPOLE_PPO, "--total-steps", "10000000")
    wait_for(lambda: (heartbeat(run_dir) or {}).get("global_step", 0) > 3000, 120, "training")
    out = kill(proc, signal.SIGTERM)
    assert proc.returncode == 75, out[-2000:]
    hb = heartbeat(run_dir)
    assert hb is not None
    assert committed_steps(run_dir)[-1] == hb["global_step"]  # nothing learned is lost
    assert '"stop_requested"' in out


def test_worker_whose_parent_dies_checkpoints_and_exits(tmp_path: Path):
    run_dir = tmp_path / "run"
    pid_file = tmp_path / "worker.pid"
    # A parent that starts the worker, reports its pid and then is SIGKILLed.
    cmd = [sys.executable, "-m", "training.worker", "--run-dir", str(run_dir), *CARTPOLE_PPO]
    cmd += ["--total-steps", "10000000"]
    parent_code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen({cmd!r}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=REPO)
    wait_for(lambda: (heartbeat(run_dir) or {}).get("global_step", 0) > 2000, 120, "training")
    worker_pid = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    wait_for(lambda: not _alive(worker_pid), 30, "the orphaned worker to exit")
    hb = heartbeat(run_dir)
    assert hb is not None and committed_steps(run_dir)[-1] == hb["global_step"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie reparented to init is dead for our purposes.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_second_worker_on_same_run_dir_is_refused(tmp_path: Path, monkeypatch):
    run_dir = tmp_path / "run"
    first = start(run_dir, *CARTPOLE_PPO, "--total-steps", "10000000")
    try:
        wait_for(lambda: heartbeat(run_dir) is not None, 60, "first worker")
        env = {**os.environ, "RLSUP_WORKER_LOCK_WAIT_S": "1"}
        second = subprocess.run(
            [sys.executable, "-m", "training.worker", "--run-dir", str(run_dir), *CARTPOLE_PPO],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert f"locked by another worker (pid {first.pid})" in second.stderr
        error = json.loads((run_dir / "error.json").read_text())
        assert error["kind"] == "run_dir_locked" and str(first.pid) in error["message"]
    finally:
        kill(first)


# ---- corruption ------------------------------------------------------------------------------


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_newest_checkpoint_resumes_from_previous(tmp_path: Path):
    run_dir = tmp_path / "run"
    args = (*CARTPOLE_PPO, "--checkpoint-every-steps", "1000", "--keep-checkpoints", "3")
    assert run(run_dir, *args, "--total-steps", "4000").returncode == 0
    dirs = ckpt_dirs(run_dir)
    assert len(dirs) == 3
    _flip_byte(dirs[-1] / "learner.pt")
    (dirs[-2] / "learner.pt").write_bytes((dirs[-2] / "learner.pt").read_bytes()[:100])
    again = run(run_dir, *args, "--total-steps", "6000")
    assert again.returncode == 0, again.stdout[-2000:]
    hb = heartbeat(run_dir)
    assert hb is not None
    assert hb["resumed_from_step"] == int(dirs[0].name.split("-")[1])
    assert len(hb["quarantined"]) == 2
    assert "resumed_from_older_checkpoint" in again.stderr
    assert len(list((run_dir / "checkpoints").glob(".corrupt-*"))) == 2


def test_every_checkpoint_corrupt_refuses_to_start_from_zero(tmp_path: Path):
    run_dir = tmp_path / "run"
    args = (*CARTPOLE_PPO, "--checkpoint-every-steps", "1000")
    assert run(run_dir, *args, "--total-steps", "3000").returncode == 0
    for d in ckpt_dirs(run_dir):
        _flip_byte(d / "learner.pt")
    again = run(run_dir, *args, "--total-steps", "6000")
    assert again.returncode == 78
    error = json.loads((run_dir / "error.json").read_text())
    assert error["kind"] == "no_valid_checkpoint"
    assert "refusing to start from zero" in error["message"]
    assert not ckpt_dirs(run_dir)  # quarantined, and nothing new written from step 0


def test_sigkill_while_checkpoint_is_being_written_never_loads_it(tmp_path: Path):
    run_dir = tmp_path / "run"
    # A big network makes each checkpoint (~25 MB) take long enough to be caught mid-write.
    args = (*CARTPOLE_PPO, "--net-arch", "1024,1024,1024", "--checkpoint-every-s", "0.5")
    args = (*args, "--total-steps", "6000")
    staging: list[Path] = []
    for _attempt in range(5):
        proc = start(run_dir, *args)

        def writing() -> bool:
            staging[:] = list((run_dir / "checkpoints").glob(".staging-*"))
            return bool(staging) and bool(committed_steps(run_dir))

        wait_for(writing, 120, "a checkpoint being written", poll=0.002)
        kill(proc)
        if any(p.exists() for p in staging):
            break
    assert any(p.exists() for p in staging), "never caught a checkpoint mid-write"
    before = committed_steps(run_dir)
    # The rerun resumes and finishes a few iterations later: what it loaded is the point.
    again = run(run_dir, *args, "--eval-episodes", "0", "--total-steps", str(max(before) + 512))
    assert again.returncode == 0, again.stdout[-2000:]
    hb = heartbeat(run_dir)
    assert hb is not None and hb["resumed_from_step"] == max(before)
    assert "staging_swept" in again.stderr
    assert not list((run_dir / "checkpoints").glob(".staging-*"))


@pytest.mark.parametrize("algo", ["ppo", "dqn", "pqn"])
def test_atari_pong_smoke_checkpoint_and_resume(tmp_path: Path, algo: str):
    run_dir = tmp_path / "run"
    game = "Breakout-v5" if algo == "pqn" else "Pong-v5"  # PQN: Breakout, its paper's showcase
    args = ("--game", game, "--algo", algo, "--num-envs", "4", "--threads", "2")
    args += ("--eval-episodes", "0", "--checkpoint-every-steps", "512")
    if algo in ("ppo", "pqn"):
        args += ("--n-steps", "64", "--batch-size", "64", "--epochs", "1")
    else:
        args += ("--batch-size", "32", "--buffer-size", "5000", "--learning-starts", "256")
        args += ("--train-frequency", "16")
    first = run(run_dir, *args, "--total-steps", "1024")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert committed_steps(run_dir)[-1] >= 1024
    second = run(run_dir, *args, "--total-steps", "2048")
    assert second.returncode == 0, second.stderr[-2000:]
    hb = heartbeat(run_dir)
    assert hb is not None
    assert (
        hb["resumed_from_step"] == committed_steps(run_dir)[-2] or hb["resumed_from_step"] >= 1024
    )
    assert hb["global_step"] >= 2048 and hb["num_envs"] == 4
    if algo == "dqn":
        ckpt = sorted((run_dir / "checkpoints").glob("ckpt-*"))[-1]
        assert (ckpt / "replay" / "meta.json").exists()
