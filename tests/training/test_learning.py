"""Learning: PPO and DQN solve CartPole-v1 within a CPU budget (seeded; slow, CI runs them).

Hyper-parameters are WorkerConfig fields, i.e. what a user passes on the command line
(`--learning-rate 1e-3 ...`). The pass criterion is the mean unclipped return of the last 20
training episodes (the learner's own EpisodeTracker); training stops as soon as it is met.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_algos_support import config, learner

from training.evaluate import evaluate

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

CPU_BUDGET_S = 120.0
WINDOW = 20

PPO_CARTPOLE: dict[str, Any] = {
    "algo": "ppo",
    "num_envs": 8,
    "n_steps": 128,
    "batch_size": 256,
    "epochs": 4,
    "learning_rate": 1e-3,
    "total_steps": 500_000,
}
DQN_CARTPOLE: dict[str, Any] = {
    "algo": "dqn",
    "num_envs": 4,
    "batch_size": 64,
    "learning_rate": 1e-3,
    "buffer_size": 50_000,
    "learning_starts": 1_000,
    "train_frequency": 4,
    "target_update_interval": 200,
    "exploration_fraction": 0.2,
    "end_e": 0.02,
    "total_steps": 150_000,
}


def _train_until(overrides: dict[str, Any], target: float) -> tuple[float, Any]:
    cfg = config(**overrides)
    lrn = learner(cfg, env_seed=1, torch_seed=1)
    start = time.process_time()
    best = float("-inf")
    while lrn.global_step < cfg.total_steps and time.process_time() - start < CPU_BUDGET_S:
        lrn.iterate()
        recent = list(lrn.tracker.recent)[-WINDOW:]
        if len(recent) == WINDOW:
            best = max(best, sum(recent) / WINDOW)
            if best >= target:
                break
    cpu_s = time.process_time() - start
    evaluated = evaluate(lrn, cfg.game, episodes=8, seed=123, threads=1)
    print(
        f"{cfg.algo} {lrn.precision.name}: mean of last {WINDOW} = {best:.1f} at step "
        f"{lrn.global_step} after {cpu_s:.1f} CPU s; evaluation {evaluated['mean']:.1f}"
    )
    lrn.close()
    return best, lrn


# Both paths learn: fp32 (what `auto` picks for these MLPs) and bf16 autocast (the fast path).
PATHS = pytest.mark.parametrize("precision", ["fp32", "bf16"])


@PATHS
def test_ppo_solves_cartpole(precision: str) -> None:
    best, lrn = _train_until({**PPO_CARTPOLE, "precision": precision}, 450.0)
    assert best >= 450.0, f"PPO reached only {best:.1f} in {lrn.global_step} steps"


@PATHS
def test_dqn_solves_cartpole(precision: str) -> None:
    best, lrn = _train_until({**DQN_CARTPOLE, "precision": precision}, 300.0)
    assert best >= 300.0, f"DQN reached only {best:.1f} in {lrn.global_step} steps"
