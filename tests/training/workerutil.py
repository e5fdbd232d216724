"""Helpers to drive real worker processes from tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def worker_cmd(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "training.worker", "--run-dir", str(run_dir), *args]


def start(run_dir: Path, *args: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        worker_cmd(run_dir, *args),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def run(run_dir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        worker_cmd(run_dir, *args),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def heartbeat(run_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((run_dir / "heartbeat.json").read_text())
        return data
    except (OSError, ValueError):
        return None


def wait_for(pred: Callable[[], bool], timeout: float, what: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def committed_steps(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    if not root.exists():
        return []
    return sorted(int(p.name.split("-")[1]) for p in root.glob("ckpt-*"))


def kill(proc: subprocess.Popen[str], sig: int = signal.SIGKILL) -> str:
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    return out


def small_learner(algo: str, env_seed: int = 1, **settings: Any) -> Any:
    """An in-process learner of CartPole-v1 on the CPU, one thread, small rollouts (4 envs x
    16 steps, minibatch 32), no evaluation; `settings` override or add WorkerConfig fields."""
    import torch

    from training.args import WorkerConfig, validate
    from training.registry import make_learner

    fields: dict[str, Any] = {
        "game": "CartPole-v1", "algo": algo, "num_envs": 4, "n_steps": 16, "batch_size": 32,
        "threads": 1, "eval_episodes": 0, "total_steps": 10**6,
    }  # fmt: skip
    cfg = validate(WorkerConfig(**{**fields, **settings}))
    torch.set_num_threads(1)
    return make_learner(cfg, torch.device("cpu"), env_seed)
