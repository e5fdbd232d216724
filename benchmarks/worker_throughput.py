"""Worker throughput on Pong-v5 PPO (8 envs, CPU) against envpool alone with random actions.

    python benchmarks/worker_throughput.py [--seconds 60] [--game Pong-v5] [--num-envs 8]
                                           [--repeats 1]

All are measured in this run, on this machine: the ceiling is envpool stepping random actions
(no network), the figure is the real worker process (`python -m training.worker`), whose rate is
read from its progress.csv after its first rollout (so start-up is excluded). The worker runs
with its training metrics on (TensorBoard event files, the default) and off (`--no-tensorboard`),
alternately `--repeats` times each (medians); the ratio on/off is the metrics' cost (target
>= 0.98). Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import signal
import statistics
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


def worker_rate(
    game: str, num_envs: int, seconds: float, threads: int, tensorboard: bool = True
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "training.worker", "--game", game, "--algo", "ppo",
            "--run-dir", str(run_dir), "--num-envs", str(num_envs), "--n-steps", "128",
            "--batch-size", "256", "--total-steps", "100000000", "--threads", str(threads),
            "--checkpoint-every-s", "30", "--eval-episodes", "0",
            "--tensorboard" if tensorboard else "--no-tensorboard",
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
    parser.add_argument("--repeats", type=int, default=1, help="worker runs per setting")
    args = parser.parse_args()
    ceiling = envpool_ceiling(args.game, args.num_envs, min(20.0, args.seconds), args.threads)
    on_runs, off_runs = [], []
    for _ in range(max(1, args.repeats)):  # alternated, so drifting load hits both alike
        on_runs.append(worker_rate(args.game, args.num_envs, args.seconds, args.threads, True))
        off_runs.append(worker_rate(args.game, args.num_envs, args.seconds, args.threads, False))
    worker = {
        "sps": statistics.median(r["sps"] for r in on_runs),
        "exit_code": max(r["exit_code"] for r in on_runs + off_runs),
    }
    off_sps = statistics.median(r["sps"] for r in off_runs)
    ratio = worker["sps"] / ceiling if ceiling else 0.0
    off_ratio = off_sps / ceiling if ceiling else 0.0
    metrics_ratio = worker["sps"] / off_sps if off_sps else 0.0
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; {args.game}, {args.num_envs} envs"
    )
    print(f"{'what':<42}{'agent steps/s':>14}{'ratio':>8}")
    print(f"{'envpool alone, random actions (ceiling)':<42}{ceiling:>14.0f}{1.0:>8.2f}")
    print(f"{'rlsup worker, PPO Nature CNN, CPU':<42}{worker['sps']:>14.0f}{ratio:>8.3f}")
    print(f"{'  same, metrics off (--no-tensorboard)':<42}{off_sps:>14.0f}{off_ratio:>8.3f}")
    print(f"metrics on / off: {metrics_ratio:.3f} (target >= 0.98; {len(on_runs)} run(s) each)")
    figures = {
        "benchmark": "worker_throughput",
        "game": args.game,
        "num_envs": args.num_envs,
        "cores": os.cpu_count(),
        "envpool_random_sps": round(ceiling, 1),
        "worker_ppo_sps": round(worker["sps"], 1),
        "ratio": round(ratio, 4),
        "worker_ppo_sps_no_tensorboard": round(off_sps, 1),
        "tensorboard_ratio": round(metrics_ratio, 4),
        "repeats": len(on_runs),
        "worker_exit_code": int(worker["exit_code"]),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
