"""keep_best with a real worker: each periodic evaluation lands in the checkpoint of its step;
the worker is SIGKILLed and resumed (with settings that make its policy worse), and after more
checkpoints the best-evaluated one is still on disk, whole, with its evaluation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from workerutil import REPO, committed_steps, heartbeat, wait_for, worker_cmd

from checkpoints import CheckpointStore
from training.args import ConfigError, WorkerConfig

pytestmark = pytest.mark.e2e

ARGS = (
    "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "64",
    "--batch-size", "64", "--threads", "1", "--eval-episodes", "3",
    "--eval-every-steps", "1024", "--checkpoint-every-s", "3600",
    "--keep-checkpoints", "1", "--keep-best", "1", "--no-tensorboard",
)  # fmt: skip


def test_the_flags_round_trip_and_bad_values_name_the_flag() -> None:
    cfg = WorkerConfig(keep_best=2, keep_every_steps=5000, eval_every_steps=1000)
    assert WorkerConfig.from_argv(cfg.to_argv()) == cfg
    assert WorkerConfig.from_json(cfg.to_json()) == cfg
    off = WorkerConfig(keep_every_steps=0)
    assert WorkerConfig.from_argv(off.to_argv()) == off
    for argv, needle in (
        (["--keep-best", "-1"], "--keep-best -1"),
        (["--keep-every-steps", "-1"], "--keep-every-steps -1"),
        (["--keep-best", "1"], "needs periodic evaluations"),
        (["--keep-best", "1", "--eval-every-steps", "10", "--eval-episodes", "0"], "above 0"),
    ):
        with pytest.raises(ConfigError, match=needle):
            WorkerConfig.from_argv(argv)


def _start(run_dir: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with open(log, "ab") as out:  # a file, not a pipe: a long log never blocks the worker
        return subprocess.Popen(worker_cmd(run_dir, *args), cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_keep_best_keeps_the_best_evaluated_checkpoint_through_a_resume(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "worker.log"
    first = _start(run_dir, log, *ARGS, "--total-steps", "1000000")
    try:
        # Killed right after its 4th checkpoint: the next needs 1024 more steps and an
        # evaluation, so every commit before the kill is in the log.
        wait_for(
            lambda: sum(e.get("event") == "checkpoint" for e in _events(log)) >= 4,
            240,
            "four evaluated checkpoints",
            poll=0.02,
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(60)
    killed_at = max(committed_steps(run_dir))
    # Resumed with a policy pushed towards uniform (a huge entropy bonus): later
    # evaluations are mostly worse than the best before the kill.
    second = _start(run_dir, log, *ARGS, "--ent-coef", "50", "--learning-rate", "0.003",
                    "--total-steps", str(killed_at + 8 * 1024))  # fmt: skip
    assert second.wait(300) == 0, log.read_text()[-3000:]
    hb = heartbeat(run_dir)
    assert hb is not None and hb["resumed_from_step"] == killed_at
    # The heartbeat's recent evaluations: this process's last 8 (at most), oldest first, the
    # newest being `eval`.
    recent = [e["step"] for e in hb["evals"]]
    assert 1 <= len(recent) <= 8 and recent == sorted(recent) and recent[0] > killed_at
    assert hb["evals"][-1]["mean"] == hb["eval"]["mean"] and recent[-1] == hb["eval"]["step"]

    events = _events(log)
    evals = {e["step"]: e["mean"] for e in events if e.get("event") == "evaluated"}
    committed = {e["step"] for e in events if e.get("event") == "checkpoint"}
    scored = {step: evals[step] for step in committed if evals.get(step) is not None}
    assert len(scored) >= 10, (evals, committed)
    best = max(scored, key=lambda step: (scored[step], step))  # ties: the newer
    newest = max(committed)
    # The point of the test: the best is from before the kill, and the resumed worker, which
    # never evaluated it, kept it through every newer, worse checkpoint.
    assert best <= killed_at < newest, scored
    on_disk = committed_steps(run_dir)
    assert on_disk == sorted({best, newest}), (scored, on_disk)
    store = CheckpointStore(run_dir / "checkpoints")
    for step in on_disk:
        loaded = store.verify(next(r for r in store.committed() if r.step == step))
        assert loaded.meta["eval"]["step"] == step
        assert loaded.meta["eval"]["mean"] == scored[step]
