"""Recovery time under `rlsup run`, against the cold-start floor measured in the same run.

    python benchmarks/recovery.py [--kills 10] [--games 2]

1. Floor: a fresh interpreter importing torch, envpool and gymnasium, making the env, building
   the network and taking the first optimizer step (what any restart must pay).
2. Worker recovery: SIGKILL a training worker -> the first heartbeat of its replacement in phase
   `training` (median and worst over --kills kills; the worker enters that phase only once it
   has loaded its checkpoint and built its learner, right before its first step).
3. Reboot recovery: SIGKILL the supervisor and every worker, a new boot id, a fresh
   `rlsup run` -> every game training again.
Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

FLOOR_CODE = """
import time; t0 = time.perf_counter()
import torch, envpool, gymnasium, numpy as np
env = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=4, seed=1)
obs, _ = env.reset()
net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
opt = torch.optim.Adam(net.parameters(), lr=2.5e-4)
net(torch.as_tensor(obs)).sum().backward(); opt.step()
env.step(np.zeros(4, dtype=np.int32))
print(time.perf_counter() - t0)
"""

CONFIG = """
state_dir = "{state_dir}"
initial_mode = "light"
checkpoint_every_s = 2
stop_grace_s = 20
[modes.light]
num_envs = 4
batch_size = 64
n_steps = 64
max_concurrent = {games}
{game_tables}
[restart]
backoff_base_s = 1
backoff_max_s = 30
budget = 100
budget_window_s = 3600
stable_after_s = 5
[watchdog]
startup_grace_s = 120
hang_timeout_s = 60
[stability]
window_s = 3600
calm_s = 3600
cooldown_s = 300
ceiling = "light"
min_ram_available_pct = 1
max_gpu_temp_c = 95
[gpu]
min_free_mb = 1
poll_s = 30
timeout_s = 60
"""

GAME = """
[[games]]
name = "g{i}"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = 1_000_000_000
seed = {i}
args = {{ eval_episodes = 0 }}
"""


def cold_start_floor(runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", FLOOR_CODE], check=True, capture_output=True)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def heartbeat(run_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((run_dir / "heartbeat.json").read_text())
        return data
    except (OSError, ValueError):
        return {}


def wait_training(
    run_dir: Path, not_pid: int | None, sup: subprocess.Popen[bytes], timeout_s: float = 180
) -> float:
    """Seconds until a worker other than `not_pid` reports phase training."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if sup.poll() is not None:
            raise RuntimeError(f"rlsup run exited with {sup.returncode}")
        hb = heartbeat(run_dir)
        if hb.get("pid") != not_pid and hb.get("phase") == "training":
            return time.monotonic() - t0
        time.sleep(0.01)
    raise TimeoutError(f"{run_dir.name}: no training heartbeat within {timeout_s}s")


def start_supervisor(config: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "supervisor.cli", "run", "--config", str(config)]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--games", type=int, default=2)
    args = parser.parse_args()
    floor = cold_start_floor()
    with tempfile.TemporaryDirectory() as tmp:
        state_dir = Path(tmp) / "state"
        boot_id = Path(tmp) / "boot_id"
        boot_id.write_text("boot-1\n")
        tables = "".join(GAME.format(i=i) for i in range(args.games))
        config = Path(tmp) / "rlsup.toml"
        config.write_text(CONFIG.format(state_dir=state_dir, games=args.games, game_tables=tables))
        env = {**os.environ, "RLSUP_BOOT_ID_PATH": str(boot_id), "PYTHONWARNINGS": "ignore"}
        runs = [state_dir / "runs" / f"g{i}" for i in range(args.games)]
        sup = start_supervisor(config, env)
        try:
            for run_dir in runs:
                wait_training(run_dir, None, sup)
            kills = []
            for k in range(args.kills):
                time.sleep(6)  # past stable_after_s, so backoff starts from its base again
                run_dir = runs[k % len(runs)]
                pid = int(heartbeat(run_dir)["pid"])
                os.kill(pid, signal.SIGKILL)
                kills.append(wait_training(run_dir, pid, sup))
            pids = [int(heartbeat(r)["pid"]) for r in runs]
            sup.kill()
            sup.wait()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            boot_id.write_text("boot-2\n")
            t0 = time.monotonic()
            sup = start_supervisor(config, env)
            for run_dir, pid in zip(runs, pids, strict=True):
                wait_training(run_dir, pid, sup)
            reboot_s = time.monotonic() - t0
        finally:
            sup.send_signal(signal.SIGTERM)
            sup.wait(timeout=60)
    med, worst = statistics.median(kills), max(kills)
    print(f"cores: {os.cpu_count()}; {args.games} CartPole PPO games under rlsup run")
    print(f"{'what':<52}{'seconds':>9}{'x floor':>9}")
    print(f"{'cold-start floor (fresh interpreter to first step)':<52}{floor:>9.2f}{1:>9.2f}")
    print(f"{'worker SIGKILL -> training again, median':<52}{med:>9.2f}{med / floor:>9.2f}")
    print(f"{'worker SIGKILL -> training again, worst':<52}{worst:>9.2f}{worst / floor:>9.2f}")
    print(f"{'simulated reboot -> all games training':<52}{reboot_s:>9.2f}{reboot_s / floor:>9.2f}")
    print(
        json.dumps(
            {
                "benchmark": "recovery",
                "cores": os.cpu_count(),
                "games": args.games,
                "kills": args.kills,
                "floor_s": round(floor, 3),
                "kill_recovery_median_s": round(med, 3),
                "kill_recovery_worst_s": round(worst, 3),
                "kill_recovery_median_x_floor": round(med / floor, 3),
                "reboot_recovery_s": round(reboot_s, 3),
                "reboot_recovery_x_floor": round(reboot_s / floor, 3),
                "backoff_base_s": 1,
            }
        )
    )


if __name__ == "__main__":
    main()
