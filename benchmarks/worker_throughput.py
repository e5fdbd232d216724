"""Worker throughput on Pong-v5 PPO (8 envs, CPU) against envpool alone with random actions.

    python benchmarks/worker_throughput.py [--seconds 60] [--game Pong-v5] [--num-envs 8]

Both are measured in this run, on this machine: the ceiling is envpool stepping random actions
(no network), the figure is the real worker process (`python -m training.worker`), whose rate is
read from its progress.csv after its first rollout (so start-up is excluded). Ends with one JSON
line of the figures.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def envpool_ceiling(game: str, num_envs: int, seconds: float, threads: int) -> float:
    import envpool
    import numpy as np

    env = envpool.make(game, env_type="gymnasium", num_envs=num_envs, seed=1, num_threads=threads)
    env.reset()
    n = env.action_space.n
    rng = np.random.default_rng(0)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(rng.integers(0, n, size=num_envs, dtype=np.int32))
        steps += num_envs
    return steps / (time.perf_counter() - t0)


def worker_rate(game: str, num_envs: int, seconds: float, threads: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "training.worker", "--game", game, "--algo", "ppo",
            "--run-dir", str(run_dir), "--num-envs", str(num_envs), "--n-steps", "128",
            "--batch-size", "256", "--total-steps", "100000000", "--threads", str(threads),
            "--checkpoint-every-s", "30", "--eval-episodes", "0",
        ]  # fmt: skip
        t_start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL)
        time.sleep(seconds)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        wall = time.monotonic() - t_start
        rows = list(csv.DictReader((run_dir / "progress.csv").open()))
    # The first row comes after the first rollout (start-up excluded); the last one written at
    # the stop repeats the step before it.
    first = rows[0]
    moved = [r for r in rows if int(r["global_step"]) > int(first["global_step"])]
    if not moved:
        raise SystemExit(f"the worker made no progress past its first rollout in {seconds}s")
    last = moved[-1]
    steps = int(last["global_step"]) - int(first["global_step"])
    secs = float(last["time"]) - float(first["time"])
    return {
        "sps": steps / secs if secs > 0 else 0.0,
        "steps": float(last["global_step"]),
        "wall_s": wall,
        "exit_code": float(proc.returncode),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="Pong-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    ceiling = envpool_ceiling(args.game, args.num_envs, min(20.0, args.seconds), args.threads)
    worker = worker_rate(args.game, args.num_envs, args.seconds, args.threads)
    ratio = worker["sps"] / ceiling if ceiling else 0.0
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; {args.game}, {args.num_envs} envs"
    )
    print(f"{'what':<42}{'agent steps/s':>14}{'ratio':>8}")
    print(f"{'envpool alone, random actions (ceiling)':<42}{ceiling:>14.0f}{1.0:>8.2f}")
    print(f"{'rlsup worker, PPO Nature CNN, CPU':<42}{worker['sps']:>14.0f}{ratio:>8.3f}")
    figures = {
        "benchmark": "worker_throughput",
        "game": args.game,
        "num_envs": args.num_envs,
        "cores": os.cpu_count(),
        "envpool_random_sps": round(ceiling, 1),
        "worker_ppo_sps": round(worker["sps"], 1),
        "ratio": round(ratio, 4),
        "worker_exit_code": int(worker["exit_code"]),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
