"""What starts a command game, without a supervisor: its argv, cwd and environment (the RLSUP_*
contract over the game's own `env`, the GPU's over both), the message its log's tail gives a
death without error.json, and a leftover recognised by its environment. Real processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from supervisor.config import load_config
from supervisor.launch import spawn as sp
from supervisor.launch.process import start_ticks
from training import protocol as P

pytestmark = pytest.mark.e2e

CONFIG = """\
state_dir = "state"
checkpoint_every_s = 30
[modes.light]
num_envs = 3
batch_size = 12
n_steps = 8
max_concurrent = 2
[[games]]
name = "mine"
command = ["python", "train.py", "--lr", "3e-4"]
env = { MINE = "yes", PYTHONUNBUFFERED = "1" }
total_steps = 5000
seed = 7
knobs = ["num_envs"]
[[games]]
name = "elsewhere"
command = ["./run.sh"]
cwd = "work"
heartbeat = true
[[games]]
name = "cart"
env_id = "CartPole-v1"
total_steps = 1000
"""


def config(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "rlsup.toml").write_text(CONFIG)
    return load_config(tmp_path / "rlsup.toml")


def test_a_command_game_is_prepared_with_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("WANDB_RUN_ID", "WANDB_RESUME", "WANDB_RUN_GROUP", "WANDB_NAME"):
        monkeypatch.delenv(key, raising=False)
    cfg = config(tmp_path)
    mine = cfg.game("mine")
    run_dir = cfg.run_dir("mine")
    run_dir.mkdir(parents=True)
    (run_dir / P.HEARTBEAT_FILE).write_text("{}")  # a predecessor's: never read
    gpu = {"CUDA_VISIBLE_DEVICES": "1"}
    w = sp.prepare_worker(cfg, mine, cfg.mode("light"), 2, gpu, starts=4)
    assert w.command and w.argv == ["python", "train.py", "--lr", "3e-4"]
    assert w.cwd == run_dir and w.log == cfg.logs_dir / "mine.log"
    assert not (run_dir / P.HEARTBEAT_FILE).exists()
    assert w.env == {
        "MINE": "yes",
        "PYTHONUNBUFFERED": "1",
        P.RUN_DIR_ENV: str(run_dir),
        P.GAME_ENV: "mine",
        P.SEED_ENV: "7",
        P.RESUME_COUNT_ENV: "4",
        P.MODE_ENV: "light",
        P.NUM_ENVS_ENV: "3",
        P.BATCH_SIZE_ENV: "12",
        P.TOTAL_STEPS_ENV: "5000",
        P.CHECKPOINT_EVERY_S_ENV: "30",
        P.KEEP_CHECKPOINTS_ENV: str(sp.KEEP_CHECKPOINTS),
        P.HEARTBEAT_ENV: "0",
        P.THREADS_ENV: "2",
        P.PARAMS_ENV: "{}",  # none declared
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "CUDA_VISIBLE_DEVICES": "1",
        # W&B: one run for the game's life (supervisor/tracking/wandb.py).
        "WANDB_RUN_ID": (run_dir / "wandb_run_id").read_text().strip(),
        "WANDB_RESUME": "allow",
        "WANDB_RUN_GROUP": "mine",
        "WANDB_NAME": "mine",
    }
    other = sp.prepare_worker(cfg, cfg.game("elsewhere"), cfg.mode("light"), 1)
    assert other.cwd == tmp_path / "work" and other.env[P.HEARTBEAT_ENV] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in other.env
    builtin = sp.prepare_worker(cfg, cfg.game("cart"), cfg.mode("light"), 1)
    assert not builtin.command and "--run-dir" in builtin.argv and builtin.env == {}
    assert "--host-mtbf-s" not in builtin.argv and P.MTBF_ENV not in w.env  # none known
    # A host that has failed: its MTBF, for the checkpoint interval (Young's rule).
    builtin = sp.prepare_worker(cfg, cfg.game("cart"), cfg.mode("light"), 1, host_mtbf_s=1234.5)
    assert builtin.argv[builtin.argv.index("--host-mtbf-s") + 1] == "1234.5"
    again = sp.prepare_worker(cfg, mine, cfg.mode("light"), 2, host_mtbf_s=1234.5)
    assert again.env[P.MTBF_ENV] == "1234.5"
    # A host seen up for 40 ms before it failed: a positive number, which the SDK accepts (it
    # refuses 0 with an error; "0.0" is what one decimal made of it).
    short = sp.prepare_worker(cfg, mine, cfg.mode("light"), 2, host_mtbf_s=0.04)
    assert float(short.env[P.MTBF_ENV]) == 0.04


def test_a_death_without_error_json_is_told_by_its_logs_tail(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    mine, cart = cfg.game("mine"), cfg.game("cart")
    cfg.logs_dir.mkdir(parents=True)
    log = cfg.logs_dir / "mine.log"
    log.write_text("x" * 10_000 + "\n" + "".join(f"line {i}\n" for i in range(50)) + "\n\n")
    error = sp.worker_error(cfg, mine, 123, 3)
    assert error is not None and error["kind"] == "command_exit" and error["pid"] == 123
    lines = error["message"].splitlines()
    assert lines == [f"line {i}" for i in range(30, 50)]  # the last 20, no blank ones
    assert sp.worker_error(cfg, mine, 123, 0) is None  # done: nothing to say
    assert sp.worker_error(cfg, mine, 123, P.ExitCode.STOPPED) is None
    assert sp.worker_error(cfg, cart, 123, 3) is None  # rlsup's worker writes error.json
    # One huge line: capped, never the whole log.
    log.write_text("y" * 100_000)
    assert len(sp.worker_error(cfg, mine, 1, 3)["message"]) <= 4096  # type: ignore[index]
    log.unlink()
    assert sp.worker_error(cfg, mine, 1, 78)["message"] == "exit status 78"  # type: ignore[index]
    # Its own error.json (the SDK may write one) wins, when it is this process's.
    run_dir = cfg.run_dir("mine")
    run_dir.mkdir(parents=True)
    (run_dir / P.ERROR_FILE).write_text('{"pid": 5, "kind": "config", "message": "bad lr"}')
    assert sp.worker_error(cfg, mine, 5, 78)["message"] == "bad lr"  # type: ignore[index]
    assert sp.worker_error(cfg, mine, 6, 78)["kind"] == "command_exit"  # type: ignore[index]


def test_a_command_games_leftover_is_recognised_by_its_environment(tmp_path: Path) -> None:
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    env = {**os.environ, P.GAME_ENV: "mine", P.RUN_DIR_ENV: str(tmp_path)}
    game = psutil.Popen(sleep, env=env)
    plain = psutil.Popen(sleep, env={k: v for k, v in env.items() if k != P.GAME_ENV})
    try:
        t = start_ticks(game.pid)
        found = sp.find_leftover(game.pid, t)
        assert found is not None and found.pid == game.pid
        assert sp.find_leftover(game.pid, (t or 0) + 1) is None  # a reused pid: another one
        assert sp.find_leftover(plain.pid, start_ticks(plain.pid)) is None
    finally:
        for p in (game, plain):
            p.kill()
            p.wait()


class NoSpare:
    """A spare keeper that must never be asked: a command game is always a cold start."""

    def take(self, *args: object) -> None:
        raise AssertionError("a command game was offered the spare")


def test_a_command_game_is_never_served_by_the_spare_and_runs_its_argv(tmp_path: Path) -> None:
    import pytest

    from supervisor.launch.launcher import Launcher

    launcher = Launcher(spare=NoSpare())  # type: ignore[arg-type]
    out = tmp_path / "argv.txt"
    code = "import sys, os; open(sys.argv[1], 'w').write(os.getcwd() + ' ' + sys.argv[2])"
    proc = launcher.spawn(
        [sys.executable, "-c", code, str(out), "hello"],
        tmp_path / "mine.log",
        0.0,
        cwd=tmp_path,
        command=True,
    )
    try:
        assert proc.wait(30) == 0
    finally:
        proc.close()
    assert out.read_text() == f"{tmp_path} hello"
    # A program that is not there: the OSError the supervisor ends the game FATAL on.
    with pytest.raises(FileNotFoundError):
        launcher.spawn(["/nonexistent/train"], tmp_path / "x.log", 0.0, cwd=tmp_path, command=True)
    not_executable = tmp_path / "train.sh"
    not_executable.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        launcher.spawn([str(not_executable)], tmp_path / "x.log", 0.0, cwd=tmp_path, command=True)
