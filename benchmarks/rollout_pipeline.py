"""Would a pipelined rollout pay? PPO's acting loop on Atari, as the learner runs it (the
channels-last Atari CNN, autocast at the learner's precision, Categorical sampling), two ways
in one process, rounds alternated:

- `sync`: one envpool of N envs; each step acts on all N, then steps all N (the learner's way,
  and CleanRL's);
- `piped`: two envpools of N/2 (the same per-env seeds); while one half's envs step (envpool's
  own threads, `send`/`recv`), the network acts on the other half.

    python benchmarks/rollout_pipeline.py [--envs 8] [--steps 128] [--rounds 5] [--threads 2]

The overlap hides the env's share of a step behind inference, at the price of two half-size
forward passes per step. It measures the rollout only (the update is unchanged by it). Ends with
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hostinfo import host_facts, host_line  # noqa: E402
from torch.distributions import Categorical  # noqa: E402

from training.envs import make_env  # noqa: E402
from training.networks import ActorCritic  # noqa: E402
from training.optim import Precision  # noqa: E402

GAME = "Breakout-v5"


class Actor:
    def __init__(self, n_actions: int, precision: str) -> None:
        self.net = ActorCritic((4, 84, 84), n_actions, ())
        self.precision = Precision(torch.device("cpu"), precision, conv=True)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            logits, value = self.net(torch.as_tensor(obs))
            dist = Categorical(logits=logits.float(), validate_args=False)
            action = dist.sample()
            dist.log_prob(action), value.float()  # what the learner keeps per step
            return action.numpy()


def sync(actor: Actor, envs: Any, steps: int, n: int) -> float:
    obs, _ = envs.reset()
    t = time.perf_counter()
    with actor.precision.autocast():
        for _ in range(steps):
            obs, *_ = envs.step(actor(obs))
    return steps * n / (time.perf_counter() - t)


def piped(actor: Actor, a: Any, b: Any, steps: int, n: int) -> float:
    obs_a, _ = a.reset()
    obs_b, _ = b.reset()
    ids = np.arange(n // 2, dtype=np.int32)
    t = time.perf_counter()
    with actor.precision.autocast():
        b.send(actor(obs_b), ids)
        for _ in range(steps):
            a.send(actor(obs_a), ids)  # a steps while b's observations are acted on
            obs_b, *_ = b.recv()
            b.send(actor(obs_b), ids)
            obs_a, *_ = a.recv()
        b.recv()
    return steps * n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=128, help="rollout steps per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="torch's and each envpool's")
    ap.add_argument("--precision", default="auto")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n = args.envs
    one = make_env(GAME, n, 1, args.threads)
    half_a = make_env(GAME, n // 2, 1, args.threads)
    half_b = make_env(GAME, n // 2, 1 + n // 2, args.threads)
    actor = Actor(int(one.action_space.n), args.precision)
    print(host_line())
    sync(actor, one, 20, n)  # warm-up: oneDNN's primitives, the envs' first frames
    piped(actor, half_a, half_b, 20, n)
    runs: dict[str, list[float]] = {"sync": [], "piped": []}
    for r in range(args.rounds):
        runs["sync"].append(sync(actor, one, args.steps, n))
        runs["piped"].append(piped(actor, half_a, half_b, args.steps, n))
        print(f"round {r + 1}: sync {runs['sync'][-1]:.0f}, piped {runs['piped'][-1]:.0f} "
              "agent steps/s")  # fmt: skip
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratio = med["piped"] / med["sync"]
    print(f"rollout, {n} envs, {actor.precision.name}, {args.threads} threads: sync "
          f"{med['sync']:.0f}, piped {med['piped']:.0f} agent steps/s: piped / sync "
          f"{ratio:.2f}x")  # fmt: skip
    print(json.dumps({
        "envs": n, "steps": args.steps, "rounds": args.rounds, "threads": args.threads,
        "precision": actor.precision.name, "sync_sps": round(med["sync"], 1),
        "piped_sps": round(med["piped"], 1), "piped_vs_sync": round(ratio, 3),
        "host": host_facts(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
