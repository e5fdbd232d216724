"""One worker's steps/s under `rlsup run` against the same worker run bare, in one run.

    python benchmarks/supervision_overhead.py [--seconds 40] [--game CartPole-v1] [--rounds 2]

Three runs of the same worker flags (threads included): bare, under `rlsup run` without a
spare, and under `rlsup run` with an idle pre-warmed spare beside it ([spare] enabled = true;
measured once the spare is ready, so its warm-up is not counted: what costs, if anything, is
the idle spare). The rate is read from progress.csv after the first row, so start-up is
excluded. Rounds alternate the three to spread drift in the machine's load. Ends with one JSON
line of the figures.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hostinfo import host_facts, host_line

REPO = Path(__file__).resolve().parents[1]
THREADS = max(1, os.cpu_count() or 1)

CONFIG = """
state_dir = "{state_dir}"
initial_mode = "light"
checkpoint_every_s = 30
stop_grace_s = 30
[modes.light]
num_envs = 8
batch_size = 256
n_steps = 128
max_concurrent = 1
[[games]]
name = "bench"
env_id = "{game}"
algo = "ppo"
total_steps = 1_000_000_000
seed = 1
args = {{ eval_episodes = 0 }}
[stability]
ceiling = "light"
[spare]
enabled = {spare}
"""


def rate(progress: Path, since: float = 0.0) -> float:
    rows = [r for r in csv.DictReader(progress.open()) if float(r["time"]) >= since]
    first, last = rows[1], rows[-1]
    steps = int(last["global_step"]) - int(first["global_step"])
    return steps / (float(last["time"]) - float(first["time"]))


def bare(game: str, seconds: float, tmp: Path) -> float:
    run_dir = tmp / "bare"
    cmd = [
        sys.executable, "-m", "training.worker", "--game", game, "--algo", "ppo",
        "--run-dir", str(run_dir), "--num-envs", "8", "--n-steps", "128", "--batch-size", "256",
        "--total-steps", "1000000000", "--threads", str(THREADS), "--eval-episodes", "0",
        "--checkpoint-every-s", "30",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    return rate(run_dir / "progress.csv")


def spare_ready_at(state_dir: Path, timeout_s: float = 120) -> float:
    """When the spare reported ready (its event's wall time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            conn = sqlite3.connect(state_dir / "rlsup.db", timeout=10)
            try:
                row = conn.execute("SELECT ts FROM events WHERE kind = 'spare_ready'").fetchone()
            finally:
                conn.close()
        except sqlite3.Error:
            row = None
        if row is not None:
            return float(row[0])
        time.sleep(0.2)
    raise TimeoutError(f"no spare ready within {timeout_s} s")


def supervised(game: str, seconds: float, tmp: Path, spare: bool) -> float:
    state_dir = tmp / "state"
    config = tmp / "rlsup.toml"
    config.write_text(CONFIG.format(state_dir=state_dir, game=game, spare=str(spare).lower()))
    cmd = [sys.executable, "-m", "supervisor.cli", "run", "--config", str(config)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    since = 0.0
    try:
        if spare:
            since = spare_ready_at(state_dir)
            time.sleep(seconds - min(seconds / 2, time.time() - since))
        else:
            time.sleep(seconds)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    return rate(state_dir / "runs" / "bench" / "progress.csv", since)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="CartPole-v1")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    bares, sups, spared = [], [], []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            bares.append(bare(args.game, args.seconds, Path(tmp)))
        with tempfile.TemporaryDirectory() as tmp:
            sups.append(supervised(args.game, args.seconds, Path(tmp), spare=False))
        with tempfile.TemporaryDirectory() as tmp:
            spared.append(supervised(args.game, args.seconds, Path(tmp), spare=True))
        print(
            f"round {r + 1}: bare {bares[-1]:.0f} steps/s, supervised {sups[-1]:.0f}, "
            f"supervised with an idle spare {spared[-1]:.0f}"
        )
    b, s, sp = statistics.median(bares), statistics.median(sups), statistics.median(spared)
    print(f"{'what':<48}{'agent steps/s':>14}{'ratio':>8}")
    print(f"{'worker run bare':<48}{b:>14.0f}{1.0:>8.2f}")
    print(f"{'same worker under rlsup run':<48}{s:>14.0f}{s / b:>8.3f}")
    print(f"{'same, with an idle spare beside it':<48}{sp:>14.0f}{sp / b:>8.3f}")
    print(f"{'idle spare vs none (both supervised)':<48}{'':>14}{sp / s:>8.3f}")
    figures = {
        "benchmark": "supervision_overhead",
        "game": args.game,
        "cores": os.cpu_count(),
        "threads": THREADS,
        "bare_sps": round(b, 1),
        "supervised_sps": round(s, 1),
        "ratio": round(s / b, 4),
        "supervised_idle_spare_sps": round(sp, 1),
        "idle_spare_ratio": round(sp / b, 4),
        "idle_spare_vs_none": round(sp / s, 4),
        "rounds": args.rounds,
    }
    print(host_line())
    print(json.dumps({**figures, "host": host_facts()}))


if __name__ == "__main__":
    main()
