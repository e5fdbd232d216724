"""Recovery time under `rlsup run`, cold and from the pre-warmed spare, against the cold-start
floor measured in the same run.

    python benchmarks/recovery.py [--kills 10] [--games 2]

1. Floor: a fresh interpreter importing torch, envpool and gymnasium, making the env, building
   the network and taking the first optimizer step (what any cold restart must pay).
2. Worker recovery, twice: with `[spare] enabled = false` (every restart cold) and with
   `[spare] enabled = true` (each kill waits for a ready spare first). SIGKILL a training worker
   -> its replacement (a) reports phase `training` (checkpoint loaded, learner built, right
   before its first step) and (b) has finished its first iteration (heartbeat `start`
   mark `first_step`). Median and worst over --kills kills; the time is itemised from the
   supervisor's `worker_training` events: SIGKILL -> exit seen -> spawn (the backoff) ->
   assigned -> loaded -> first step.
3. The idle spare's memory (RSS and PSS from /proc/<pid>/smaps_rollup).
4. Reboot recovery (cold run): SIGKILL the supervisor and every worker, a new boot id, a fresh
   `rlsup run` -> every game training again.
Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
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
from typing import Any

from hostinfo import host_facts, host_line

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
[spare]
enabled = {spare}
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


def query(state_dir: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    try:
        conn = sqlite3.connect(state_dir / "rlsup.db", timeout=10)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []


def wait_spare(state_dir: Path, timeout_s: float = 180) -> int:
    """The pid of a ready spare."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = query(state_dir, "SELECT pid, state FROM spare")
        if rows and rows[0][1] == "ready" and rows[0][0]:
            return int(rows[0][0])
        time.sleep(0.05)
    raise TimeoutError(f"no ready spare within {timeout_s} s")


def first_step_after(run_dir: Path, pid: int, timeout_s: float = 120) -> float:
    """The replacement's `first_step` mark (the system's monotonic clock)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        hb = heartbeat(run_dir)
        mark = (hb.get("start") or {}).get("first_step") if hb.get("pid") == pid else None
        if isinstance(mark, int | float):
            return float(mark)
        time.sleep(0.01)
    raise TimeoutError(f"{run_dir.name}: worker {pid} took no first step in {timeout_s} s")


def breakdown_of(state_dir: Path, pid: int, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for (detail,) in query(
            state_dir, "SELECT detail FROM events WHERE kind = 'worker_training'"
        ):
            d = json.loads(detail)
            if d.get("pid") == pid:
                return dict(d)
        time.sleep(0.05)
    raise TimeoutError(f"no worker_training event for pid {pid}")


def memory_mib(pid: int) -> tuple[float, float]:
    rss = pss = 0.0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key == "Rss":
            rss = int(rest.split()[0]) / 1024
        elif key == "Pss":
            pss = int(rest.split()[0]) / 1024
    return rss, pss


def kill_rounds(tmp: Path, games: int, kills: int, spare: bool) -> dict[str, Any]:
    """Start `rlsup run`, SIGKILL a training worker --kills times; the figures of each."""
    state_dir = tmp / "state"
    boot_id = tmp / "boot_id"
    boot_id.write_text("boot-1\n")
    tables = "".join(GAME.format(i=i) for i in range(games))
    config = tmp / "rlsup.toml"
    config.write_text(CONFIG.format(state_dir=state_dir, games=games, game_tables=tables,
                                    spare=str(spare).lower()))  # fmt: skip
    env = {**os.environ, "RLSUP_BOOT_ID_PATH": str(boot_id), "PYTHONWARNINGS": "ignore"}
    runs = [state_dir / "runs" / f"g{i}" for i in range(games)]
    out: dict[str, Any] = {"phase": [], "first_step": [], "detail": [], "kill_to_seen": []}
    sup = start_supervisor(config, env)
    try:
        for run_dir in runs:
            wait_training(run_dir, None, sup)
        for k in range(kills):
            time.sleep(6)  # past stable_after_s, so backoff starts from its base again
            if spare:
                idle = wait_spare(state_dir)
                if k == 0:
                    time.sleep(1)
                    out["rss_mib"], out["pss_mib"] = memory_mib(idle)
            run_dir = runs[k % len(runs)]
            pid = int(heartbeat(run_dir)["pid"])
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            out["phase"].append(wait_training(run_dir, pid, sup))
            new_pid = int(heartbeat(run_dir)["pid"])
            first = first_step_after(run_dir, new_pid)
            out["first_step"].append(first - t_kill)
            detail = breakdown_of(state_dir, new_pid)
            out["detail"].append(detail)
            out["kill_to_seen"].append(first - t_kill - float(detail["total_s"]))
        if not spare:
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
            out["reboot_s"] = time.monotonic() - t0
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(timeout=60)
    return out


STAGES = (
    ("SIGKILL -> exit seen", "kill_to_seen"),
    ("exit seen -> spawn / hand-over (backoff)", "exit_to_spawn_s"),
    ("spawn -> spare took the assignment", "spawn_to_assigned_s"),
    ("spawn -> checkpoint loaded, learner built", "spawn_to_loaded_s"),
    ("loaded -> first iteration done", "loaded_to_first_step_s"),
)


def summary(run: dict[str, Any]) -> dict[str, Any]:
    def med(values: list[Any]) -> float | None:
        nums = [float(v) for v in values if isinstance(v, int | float)]
        return round(statistics.median(nums), 3) if nums else None

    stages = {"kill_to_seen": med(run["kill_to_seen"])}
    for _, key in STAGES[1:]:
        stages[key] = med([d.get(key) for d in run["detail"]])
    return {
        "median_s": round(statistics.median(run["phase"]), 3),
        "worst_s": round(max(run["phase"]), 3),
        "first_step_median_s": round(statistics.median(run["first_step"]), 3),
        "first_step_worst_s": round(max(run["first_step"]), 3),
        "served": sorted({d.get("served") for d in run["detail"]}),
        "stages_median_s": stages,
    }


def _cell(v: float | None) -> str:
    return f"{v:>9.3f}" if v is not None else f"{'-':>9}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--games", type=int, default=2)
    args = parser.parse_args()
    floor = cold_start_floor()
    with tempfile.TemporaryDirectory() as tmp:
        cold_run = kill_rounds(Path(tmp), args.games, args.kills, spare=False)
    with tempfile.TemporaryDirectory() as tmp:
        spare_run = kill_rounds(Path(tmp), args.games, args.kills, spare=True)
    cold, spare = summary(cold_run), summary(spare_run)
    assert cold["served"] == ["cold"] and spare["served"] == ["spare"], (cold, spare)
    reboot_s = cold_run["reboot_s"]
    print(f"cores: {os.cpu_count()}; {args.games} CartPole PPO games under rlsup run; "
          f"{args.kills} kills each way; backoff_base_s 1")  # fmt: skip
    print(f"{'what':<52}{'cold':>9}{'spare':>9}{'x floor':>9}")
    print(
        f"{'cold-start floor (fresh interpreter to first step)':<52}{floor:>9.2f}{'':>9}{1:>9.2f}"
    )
    rows = [
        ("SIGKILL -> training phase, median", "median_s"),
        ("SIGKILL -> training phase, worst", "worst_s"),
        ("SIGKILL -> first iteration done, median", "first_step_median_s"),
        ("SIGKILL -> first iteration done, worst", "first_step_worst_s"),
    ]
    for label, key in rows:
        c, sp = cold[key], spare[key]
        print(f"{label:<52}{c:>9.2f}{sp:>9.2f}{sp / floor:>9.2f}")
    print("where the time goes (medians):")
    for label, key in STAGES:
        c, sp = cold["stages_median_s"].get(key), spare["stages_median_s"].get(key)
        print(f"  {label:<50}{_cell(c)}{_cell(sp)}")
    print(f"{'idle spare memory: RSS / PSS (MiB)':<52}{spare_run['rss_mib']:>9.0f}"
          f"{spare_run['pss_mib']:>9.0f}")  # fmt: skip
    print(f"{'simulated reboot -> all games training (cold)':<52}{reboot_s:>9.2f}{'':>9}"
          f"{reboot_s / floor:>9.2f}")  # fmt: skip
    print(host_line())
    print(
        json.dumps(
            {
                "benchmark": "recovery",
                "host": host_facts(),
                "cores": os.cpu_count(),
                "games": args.games,
                "kills": args.kills,
                "backoff_base_s": 1,
                "floor_s": round(floor, 3),
                "cold": cold,
                "spare": spare,
                "spare_rss_mib": round(spare_run["rss_mib"], 1),
                "spare_pss_mib": round(spare_run["pss_mib"], 1),
                "spare_median_x_floor": round(spare["median_s"] / floor, 3),
                "kill_recovery_median_s": cold["median_s"],
                "kill_recovery_worst_s": cold["worst_s"],
                "kill_recovery_median_x_floor": round(cold["median_s"] / floor, 3),
                "reboot_recovery_s": round(reboot_s, 3),
                "reboot_recovery_x_floor": round(reboot_s / floor, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
