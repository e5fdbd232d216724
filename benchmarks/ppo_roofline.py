"""PPO's roofline: how close rlsup's learner runs to what this CPU can do, in one run.

    python benchmarks/ppo_roofline.py [--game Breakout-v5] [--num-envs 8] [--n-steps 128]
        [--batch-size 256] [--epochs 4] [--seconds 30] [--threads N]
        [--precisions auto,fp32] [--peer-sps X] [--out FILE]

PPO at CleanRL's `ppo_atari_envpool.py` settings (the defaults above) is the one speed target
of the peers' table that this 2-core CPU has not met (>= 2x the peer's agent steps/s). This says
whether the code or the machine is what is left. All measured in this run, on this machine:

- the baseline: the CPU's matrix-multiply rate per precision (bf16 and fp32), the best of
  square `torch.mm`s of 512-2048 on `--threads` threads, before the learners and again after
  them (a shared VM's neighbours): the most the update's and inference's arithmetic can expect;
- the work: the floating-point operations of one PPO iteration, counted by torch's own
  `FlopCounterMode` around the learner's real `iterate()`, split into inference (the rollout's
  forward passes, counted alone) and the update (the rest: forward and backward of every
  minibatch, every epoch);
- the time: the learner in this process for `--seconds` per precision, its phases summed by the
  learner itself (env step, inference, copies, update), seconds per 1,000 agent steps;
- the ceiling: the same iteration with the update and inference at the matrix-multiply rate and
  the env step, copies and Python as measured. `ceiling / measured` is what faster kernels
  could still give; with `--peer-sps` (CleanRL's agent steps/s at these settings, from
  `benchmarks/peers.py` on the same machine) the measured and the ceiling ratio to the peer.
Ends with one JSON line of the figures (also written to `--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostinfo import host_facts, host_line
from worker_throughput import ppo_learner, timed_phases

GEMM_SIZES = (512, 1024, 2048)
MS = 1e3


def gemm_rate(dtype_name: str, threads: int, seconds: float = 1.0) -> float:
    """FLOP/s of square matrix multiplies in this dtype: the best of GEMM_SIZES, each the median
    of its timed repetitions (the best, so that a ceiling drawn from it is not too low)."""
    import torch

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    best = 0.0
    for n in GEMM_SIZES:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        torch.mm(a, b)  # warm: oneDNN/BLAS primitives
        times: list[float] = []
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end or len(times) < 3:
            t0 = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - t0)
        best = max(best, 2 * n**3 / statistics.median(times))
    return best


@dataclass(frozen=True)
class Work:
    """Floating-point operations per 1,000 agent steps."""

    inference: float
    update: float


@dataclass(frozen=True)
class Roofline:
    """Seconds per 1,000 agent steps: as measured, and with the arithmetic at `peak` FLOP/s."""

    measured_s: float
    ceiling_s: float
    update_rate: float  # FLOP/s achieved in the update
    inference_rate: float

    @property
    def headroom(self) -> float:
        return self.measured_s / self.ceiling_s


def roofline(per_1k_s: dict[str, float], work: Work, peak: float) -> Roofline:
    """per_1k_s: the learner's phases (env, inference, copies, update, other), s per 1,000 steps.
    The ceiling keeps everything but the arithmetic of inference and the update as measured."""
    measured = sum(per_1k_s.values())
    rest = measured - per_1k_s["update"] - per_1k_s["inference"]
    ceiling = rest + (work.update + work.inference) / peak
    return Roofline(
        measured_s=measured,
        ceiling_s=ceiling,
        update_rate=work.update / per_1k_s["update"],
        inference_rate=work.inference / per_1k_s["inference"],
    )


def count_work(learner: Any, args: argparse.Namespace) -> tuple[Work, float]:
    """The iteration's FLOPs by torch's FlopCounterMode: the whole `iterate()`, and the
    rollout's forward passes alone (n_steps of them at num_envs)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    steps = args.num_envs * args.n_steps
    with FlopCounterMode(display=False) as whole:
        learner.iterate()
    obs = torch.zeros((args.num_envs, *learner.obs_shape), dtype=torch.uint8)
    with FlopCounterMode(display=False) as act, torch.no_grad(), learner.precision.autocast():
        learner.net(obs)
    # The rollout's forwards; the bootstrap value after it is timed in the update, and counted
    # there too.
    inference = act.get_total_flops() / args.num_envs * steps
    total = float(whole.get_total_flops())
    update = total - inference
    per_k = 1000.0 / steps
    return Work(inference=inference * per_k, update=update * per_k), total


def _rates(peaks: dict[str, float]) -> str:
    return ", ".join(f"{d} {v / 1e9:.0f} GFLOP/s" for d, v in peaks.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="Breakout-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--n-steps", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=256, help="PPO's minibatch")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0, help="timed, per precision")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--precisions", default="auto,fp32")
    parser.add_argument("--peer-sps", type=float, default=None, help="CleanRL's, same machine")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    print(host_line(), flush=True)
    peaks = {d: gemm_rate(d, args.threads) for d in ("bfloat16", "float32")}
    print(f"matrix multiply (best of {GEMM_SIZES}^3, {args.threads} threads): {_rates(peaks)}")
    rows: list[dict[str, Any]] = []
    for precision in [p for p in args.precisions.split(",") if p]:
        learner = ppo_learner(args, precision)
        try:
            learner.iterate()  # warm: allocations, oneDNN primitives
            work, _ = count_work(learner, args)
            sps, ms_per_k = timed_phases(learner, args.seconds)
            per_k = {k: v / MS for k, v in ms_per_k.items()}
            ran = "bfloat16" if learner.precision.name == "bf16" else "float32"
        finally:
            learner.close()
        peak = peaks[ran]
        r = roofline(per_k, work, peak)
        row = {
            "precision": precision,
            "ran": ran,
            "sps": sps,
            "s_per_1k": per_k,
            "gflop_per_1k": {"update": work.update / 1e9, "inference": work.inference / 1e9},
            "update_gflops": r.update_rate / 1e9,
            "inference_gflops": r.inference_rate / 1e9,
            "update_of_peak": r.update_rate / peak,
            "inference_of_peak": r.inference_rate / peak,
            "ceiling_sps": 1000.0 / r.ceiling_s,
            "ceiling_over_measured": r.headroom,
        }
        if args.peer_sps:
            row["over_peer"] = sps / args.peer_sps
            row["ceiling_over_peer"] = row["ceiling_sps"] / args.peer_sps
        rows.append(row)
        phases = ", ".join(f"{k} {v * MS:.0f}" for k, v in per_k.items())
        print(
            f"\nPPO, --precision {precision} (ran {ran}): {sps:.0f} agent steps/s; "
            f"ms per 1,000 agent steps: {phases}\n"
            f"  work per 1,000 agent steps: update {work.update / 1e9:.1f} GFLOP, "
            f"inference {work.inference / 1e9:.1f} GFLOP\n"
            f"  update {r.update_rate / 1e9:.0f} GFLOP/s = {r.update_rate / peak:.0%} of the "
            f"{ran} matrix multiply; inference {r.inference_rate / 1e9:.0f} GFLOP/s = "
            f"{r.inference_rate / peak:.0%}\n"
            f"  ceiling (update and inference at the matrix multiply's rate, the rest as "
            f"measured): {1000.0 / r.ceiling_s:.0f} agent steps/s, {r.headroom:.2f}x measured",
            flush=True,
        )
        if args.peer_sps:
            print(
                f"  against the peer's {args.peer_sps:.0f} agent steps/s: measured "
                f"{row['over_peer']:.2f}x, ceiling {row['ceiling_over_peer']:.2f}x",
                flush=True,
            )
    # A neighbour on a shared VM can slow one measurement: measured again after the learners,
    # the best of both is the baseline (the ratios above used the first).
    again = {d: gemm_rate(d, args.threads) for d in peaks}
    print(f"matrix multiply again, after the learners: {_rates(again)}", flush=True)
    best = {d: max(peaks[d], again[d]) for d in peaks}
    for row in rows:
        row["of_best_peak"] = {
            "update": row["update_gflops"] * 1e9 / best[row["ran"]],
            "inference": row["inference_gflops"] * 1e9 / best[row["ran"]],
        }
    result = {
        "benchmark": "ppo_roofline",
        "host": host_facts(),
        "threads": args.threads,
        "gemm_gflops": {k: v / 1e9 for k, v in peaks.items()},
        "gemm_gflops_after": {k: v / 1e9 for k, v in again.items()},
        "rows": rows,
    }
    line = json.dumps(result)
    if args.out:
        args.out.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
