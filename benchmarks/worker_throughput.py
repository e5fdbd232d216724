"""Worker throughput: the fast path against today's fp32 path and envpool alone, in one run.

    python benchmarks/worker_throughput.py [--game Breakout-v5] [--num-envs 8] [--n-steps 128]
        [--batch-size 256] [--epochs 4] [--seconds 60] [--threads N] [--repeats 1]
        [--no-dqn] [--metrics-cost]

All measured in this run, on this machine:
- the ceiling: envpool stepping random actions (no network);
- PPO in the real worker process (`python -m training.worker`) with `--precision fp32` (the
  path every earlier release ran; CleanRL's ppo_atari_envpool.py measured at parity with it on
  this machine: 422 against 412 agent steps/s) and with `--precision auto` (the fast path: bf16
  autocast where the CPU has native bf16), alternately `--repeats` times each (medians). A
  worker's rate is read from its progress.csv after its first rollout (start-up excluded);
- where the time goes, per path: the learner run in this process for `--seconds / 3`, its
  phases summed by the learner itself (env step, inference, copies, update);
- the acting loop alone, synchronous against envpool's async send/recv (the overlap of env
  stepping with inference);
- DQN (4 envs, defaults but learning from step 1,000 so that updates run) on both paths: the
  fast path must not be slower;
- with `--metrics-cost`, the fast path with TensorBoard metrics on and off (target >= 0.98).
Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import csv
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

from hostinfo import host_facts, host_line

REPO = Path(__file__).resolve().parents[1]
REFERENCE_SPS = 422.0  # CleanRL ppo_atari_envpool.py, same settings, this machine (issue 18)
PATHS = (("fp32", "fp32"), ("fast", "auto"))


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


def acting_probe(game: str, num_envs: int, seconds: float, threads: int) -> dict[str, float]:
    """The rollout's acting loop alone (no update), fast path's network: synchronous stepping
    of `num_envs` (what the worker does) against envpool's async send/recv with 2x the envs
    and batches of `num_envs` (the emulators of one batch run while the network thinks about
    the other). Agent steps/s of each; their ratio bounds what async stepping could add to the
    rollout share of a PPO iteration."""
    import envpool
    import torch

    from training.networks import ActorCritic
    from training.optim import Precision

    torch.set_num_threads(threads)
    make = {"env_type": "gymnasium", "seed": 1, "num_threads": threads}
    sync = envpool.make(game, num_envs=num_envs, **make)
    net = ActorCritic(tuple(sync.observation_space.shape), int(sync.action_space.n), ())
    precision = Precision(torch.device("cpu"), "auto", conv=True)

    def act(obs: Any) -> Any:
        with torch.inference_mode():
            logits, _ = net(torch.as_tensor(obs))
        return torch.distributions.Categorical(logits=logits.float()).sample().numpy()

    out: dict[str, float] = {}
    with precision.autocast():
        obs, _ = sync.reset()
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            obs, *_ = sync.step(act(obs))
            steps += num_envs
        out["sync"] = steps / (time.perf_counter() - t0)
        sync.close()
        pool = envpool.make(game, num_envs=2 * num_envs, batch_size=num_envs, **make)
        pool.async_reset()
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            obs, _, _, _, info = pool.recv()
            pool.send(act(obs), info["env_id"])
            steps += num_envs
        out["async"] = steps / (time.perf_counter() - t0)
        pool.close()
    return out


def worker_rate(args: argparse.Namespace, extra: list[str], seconds: float) -> float:
    """Agent steps/s of a real worker process, from its progress.csv."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "training.worker", "--game", args.game,
            "--run-dir", str(run_dir), "--total-steps", "100000000",
            "--threads", str(args.threads), "--checkpoint-every-s", "600",
            "--eval-episodes", "0", *extra,
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE)
        time.sleep(seconds)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
        if proc.returncode not in (0, 75):  # 75: stopped on request, checkpoint committed
            raise SystemExit(f"worker exited {proc.returncode}: {err.decode()[-2000:]}")
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
    return steps / secs if secs > 0 else 0.0


def ppo_args(args: argparse.Namespace, precision: str) -> list[str]:
    return [
        "--algo", "ppo", "--num-envs", str(args.num_envs), "--n-steps", str(args.n_steps),
        "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
        "--precision", precision,
    ]  # fmt: skip


def ppo_learner(args: argparse.Namespace, precision: str) -> Any:
    """A PPO learner in this process at the benchmark's settings (game, num_envs, n_steps,
    batch_size, epochs, threads)."""
    import torch

    from training.args import WorkerConfig
    from training.registry import make_learner

    torch.set_num_threads(args.threads)
    cfg = WorkerConfig(
        game=args.game, algo="ppo", num_envs=args.num_envs, n_steps=args.n_steps,
        batch_size=args.batch_size, epochs=args.epochs, threads=args.threads,
        precision=precision, total_steps=10**9,
    )  # fmt: skip
    return make_learner(cfg, torch.device("cpu"), 1)


def timed_phases(learner: Any, seconds: float) -> tuple[float, dict[str, float]]:
    """One warm iteration, then iterations for `seconds`: (agent steps/s, ms per 1,000 agent
    steps per phase as the learner sums them, plus "other")."""
    learner.iterate()  # warm: allocations, oneDNN primitives
    phases: dict[str, float] = learner.phase_s
    for k in phases:
        phases[k] = 0.0
    step0, t0 = learner.global_step, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        learner.iterate()
    wall = time.perf_counter() - t0
    steps = learner.global_step - step0
    per_k = {k: v / steps * 1e6 for k, v in phases.items()}  # ms per 1,000 steps
    per_k["other"] = max(0.0, wall / steps * 1e6 - sum(per_k.values()))
    return steps / wall, per_k


def breakdown(args: argparse.Namespace, precision: str, seconds: float) -> dict[str, Any]:
    """The learner in this process: agent steps/s and ms per phase per 1,000 steps."""
    learner = ppo_learner(args, precision)
    try:
        sps, per_k = timed_phases(learner, seconds)
        return {"sps": sps, "s_per_1k": per_k, "precision": learner.precision.name}
    finally:
        learner.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="Breakout-v5")
    parser.add_argument("--algo", default="ppo", choices=["ppo"], help="the PPO figures")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--n-steps", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0, help="per worker run")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=1, help="worker runs per path")
    parser.add_argument("--no-dqn", dest="dqn", action="store_false", help="skip DQN")
    parser.add_argument("--metrics-cost", action="store_true", help="TensorBoard on vs off")
    args = parser.parse_args()

    ceiling = envpool_ceiling(args.game, args.num_envs, min(20.0, args.seconds), args.threads)
    ppo: dict[str, list[float]] = {name: [] for name, _ in PATHS}
    for _ in range(max(1, args.repeats)):  # alternated, so drifting load hits both alike
        for name, precision in PATHS:
            ppo[name].append(worker_rate(args, ppo_args(args, precision), args.seconds))
    sps = {name: statistics.median(v) for name, v in ppo.items()}
    split = {name: breakdown(args, precision, args.seconds / 3) for name, precision in PATHS}
    dqn: dict[str, float] = {}
    if args.dqn:
        for name, precision in PATHS:
            extra = ["--algo", "dqn", "--num-envs", "4", "--learning-starts", "1000",
                     "--precision", precision]  # fmt: skip
            dqn[name] = worker_rate(args, extra, args.seconds)
    probe = acting_probe(args.game, args.num_envs, min(15.0, args.seconds / 4), args.threads)
    tb: dict[str, float] = {}
    if args.metrics_cost:
        for flag in ("--tensorboard", "--no-tensorboard"):
            tb[flag] = worker_rate(args, [*ppo_args(args, "auto"), flag], args.seconds)

    fast_prec = split["fast"]["precision"]
    print(
        f"{host_line()}; {args.threads} threads; "
        f"{args.game} PPO {args.num_envs} envs x {args.n_steps} steps, minibatch "
        f"{args.batch_size}, {args.epochs} epochs; fast path runs {fast_prec}"
    )
    print(f"{'what':<46}{'agent steps/s':>14}{'vs fp32':>9}")
    print(f"{'envpool alone, random actions (ceiling)':<46}{ceiling:>14.0f}{'':>9}")
    print(f"{'PPO worker, fp32 path (earlier releases)':<46}{sps['fp32']:>14.0f}{1.0:>9.2f}")
    fast_ratio = sps["fast"] / sps["fp32"] if sps["fp32"] else 0.0
    print(f"{'PPO worker, fast path (--precision auto)':<46}{sps['fast']:>14.0f}{fast_ratio:>9.2f}")
    print(
        f"fast path / CleanRL's {REFERENCE_SPS:.0f} (measured earlier on this machine, not in "
        f"this run): {sps['fast'] / REFERENCE_SPS:.2f} (target >= 1.5, i.e. >= 630 steps/s)"
    )
    print("\nwhere the time goes (in-process learner; ms per 1,000 agent steps):")
    phases = ("env", "inference", "copies", "update", "other")
    print(f"{'path':<8}{'steps/s':>9}" + "".join(f"{p:>11}" for p in phases))
    for name, _ in PATHS:
        s = split[name]
        print(f"{name:<8}{s['sps']:>9.0f}" + "".join(f"{s['s_per_1k'][p]:>11.0f}" for p in phases))
    a = probe["async"] / probe["sync"] if probe["sync"] else 0.0
    print(f"\nacting alone (no update), fast path: synchronous {probe['sync']:.0f} agent steps/s, "
          f"async send/recv with {2 * args.num_envs} envs in batches of {args.num_envs} "
          f"{probe['async']:.0f}: {a:.2f}x")  # fmt: skip
    if dqn:
        r = dqn["fast"] / dqn["fp32"] if dqn["fp32"] else 0.0
        print(f"\nDQN worker (4 envs): fp32 {dqn['fp32']:.0f}, fast {dqn['fast']:.0f} "
              f"agent steps/s; fast / fp32 = {r:.2f} (must not be < 1)")  # fmt: skip
    tb_ratio = None
    if tb:
        tb_ratio = tb["--tensorboard"] / tb["--no-tensorboard"]
        print(f"metrics on / off (fast path): {tb_ratio:.3f} (target >= 0.98)")
    figures = {
        "benchmark": "worker_throughput",
        "game": args.game,
        "num_envs": args.num_envs,
        "cores": os.cpu_count(),
        "threads": args.threads,
        "envpool_random_sps": round(ceiling, 1),
        "worker_ppo_sps": round(sps["fast"], 1),
        "worker_ppo_sps_fp32": round(sps["fp32"], 1),
        "fast_ratio": round(fast_ratio, 4),
        "fast_precision": fast_prec,
        "reference_ratio": round(sps["fast"] / REFERENCE_SPS, 4),
        "breakdown_ms_per_1k": {
            n: {k: round(v, 1) for k, v in split[n]["s_per_1k"].items()} for n, _ in PATHS
        },
        "dqn_sps": {k: round(v, 1) for k, v in dqn.items()},
        "acting_sps": {k: round(v, 1) for k, v in probe.items()},
        "tensorboard_ratio": None if tb_ratio is None else round(tb_ratio, 4),
        "repeats": max(1, args.repeats),
    }
    print(host_line())
    print(json.dumps({**figures, "host": host_facts()}))


if __name__ == "__main__":
    main()
