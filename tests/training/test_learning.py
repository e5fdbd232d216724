"""Learning: PPO, DQN and PQN solve CartPole-v1 (seeded; slow, CI runs them), on any CPU.

Hyper-parameters are WorkerConfig fields, i.e. what a user passes on the command line
(`--learning-rate 1e-3 ...`). The pass criterion is the mean unclipped return of the last 20
training episodes (the learner's own EpisodeTracker); a seed stops as soon as it meets it.

One seed's arithmetic is not the algorithm: bf16 rounds differently on AMX, AVX-512 and AVX2
(where bf16 is emulated), and one seed that learned on one CPU plateaued on another (DQN bf16:
241.9 after 150,000 steps on an Intel Xeon with AMX, every run). So a test passes when the
first of up to three seeds meets the criterion within the step budget; each seed's CPU time is
capped only as a net against a hung or absurdly slow host. That the criterion still catches a
broken learner is shown by the sabotage tests below (a TD target without bootstrapping, a
flipped advantage sign, Q(lambda) returns without bootstrapping): every seed must fail. They
take minutes and prove the tests rather than the product:
`RLSUP_SABOTAGE=1 pytest tests/training/test_learning.py -k sabotage`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import pytest
from test_algos_support import config, learner

from training.evaluate import evaluate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("one_torch_thread"),
    # Every seed may use its CPU cap (and a loaded host stretches wall time past CPU time).
    pytest.mark.timeout(2 * 3 * 600),
]

SEEDS = (1, 2, 3)  # the module's timeout allows each its CPU cap
# Per seed, a net and not the criterion: DQN's 150,000 steps took 51-93 CPU s in fp32 and ~280
# in emulated bf16 (AVX2) here; a host far slower than that fails with the CPU time named.
CPU_CAP_S = 600.0
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
# CleanRL's pqn.py (4 envs x 128 steps, 4 minibatches, 4 epochs) with PQN's defaults (RAdam
# 2.5e-4 annealed, epsilon 1 -> 0.05 over half the run). Here every seed reached 450 within
# 190k-290k steps: 20-30 CPU s in fp32, ~51 in emulated bf16 (AVX2).
PQN_CARTPOLE: dict[str, Any] = {
    "algo": "pqn",
    "num_envs": 4,
    "n_steps": 128,
    "batch_size": 128,
    "epochs": 4,
    "total_steps": 500_000,
}


@dataclass(frozen=True)
class Attempt:
    seed: int
    best: float
    steps: int
    cpu_s: float

    def __str__(self) -> str:
        return f"seed {self.seed}: {self.best:.1f} at step {self.steps} ({self.cpu_s:.0f} CPU s)"


def _train_until(overrides: dict[str, Any], target: float, seed: int) -> Attempt:
    cfg = config(**overrides, seed=seed)
    lrn = learner(cfg, env_seed=seed, torch_seed=seed)
    start = time.process_time()
    best = float("-inf")
    while lrn.global_step < cfg.total_steps and time.process_time() - start < CPU_CAP_S:
        lrn.iterate()
        recent = list(lrn.tracker.recent)[-WINDOW:]
        if len(recent) == WINDOW:
            best = max(best, sum(recent) / WINDOW)
            if best >= target:
                break
    attempt = Attempt(seed, best, lrn.global_step, time.process_time() - start)
    if best >= target:
        evaluated = evaluate(lrn, cfg.game, episodes=8, seed=123, threads=1)
        print(f"{cfg.algo} {lrn.precision.name} {attempt}; evaluation {evaluated['mean']:.1f}")
    lrn.close()
    return attempt


def _learn(
    overrides: dict[str, Any], target: float, seeds: tuple[int, ...] = SEEDS
) -> list[Attempt]:
    """Seeds in order until one meets the target (all of them when none does)."""
    attempts: list[Attempt] = []
    for seed in seeds:
        attempts.append(_train_until(overrides, target, seed))
        if attempts[-1].best >= target:
            break
    return attempts


def _learned(attempts: list[Attempt], target: float) -> bool:
    return any(a.best >= target for a in attempts)


# Both paths learn: fp32 (what `auto` picks for these MLPs) and bf16 autocast (the fast path).
PATHS = pytest.mark.parametrize("precision", ["fp32", "bf16"])


@PATHS
def test_ppo_solves_cartpole(precision: str) -> None:
    tries = _learn({**PPO_CARTPOLE, "precision": precision}, 450.0)
    assert _learned(tries, 450.0), "PPO did not reach 450: " + "; ".join(map(str, tries))


@PATHS
def test_dqn_solves_cartpole(precision: str) -> None:
    tries = _learn({**DQN_CARTPOLE, "precision": precision}, 300.0)
    assert _learned(tries, 300.0), "DQN did not reach 300: " + "; ".join(map(str, tries))


@PATHS
def test_pqn_solves_cartpole(precision: str) -> None:
    # bf16 tries seed 2 first: seed 1 plateaus (~50 s of its whole 500k-step budget, on the
    # AVX-512 bf16 EPYC here and on CI's host alike) where seed 2 reaches 450 in ~226k steps.
    # The same three seeds, the same criterion; only the order, for the suite's time.
    seeds = (2, 1, 3) if precision == "bf16" else SEEDS
    tries = _learn({**PQN_CARTPOLE, "precision": precision}, 450.0, seeds)
    assert _learned(tries, 450.0), "PQN did not reach 450: " + "; ".join(map(str, tries))


# ---- the criterion fails a broken learner ----------------------------------------------------

SABOTAGE = pytest.mark.skipif(
    not os.environ.get("RLSUP_SABOTAGE"),
    reason="proves the learning tests can fail (minutes): RLSUP_SABOTAGE=1",
)


@SABOTAGE
def test_sabotage_a_td_target_without_bootstrapping_fails_the_dqn_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import training.dqn as dqn

    right = dqn.double_dqn_target
    monkeypatch.setattr(dqn, "double_dqn_target", lambda r, d, g, q, t: right(r, d, 0.0, q, t))
    tries = _learn({**DQN_CARTPOLE, "precision": "fp32"}, 300.0)
    print("; ".join(map(str, tries)))
    assert not _learned(tries, 300.0) and len(tries) == len(SEEDS)


@SABOTAGE
def test_sabotage_a_flipped_advantage_sign_fails_the_ppo_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import training.ppo as ppo

    right = ppo.gae

    def flipped(*args: Any, **kwargs: Any) -> Any:
        advantages, returns = right(*args, **kwargs)
        return -advantages, returns

    monkeypatch.setattr(ppo, "gae", flipped)
    tries = _learn({**PPO_CARTPOLE, "precision": "fp32"}, 450.0)
    print("; ".join(map(str, tries)))
    assert not _learned(tries, 450.0) and len(tries) == len(SEEDS)


@SABOTAGE
def test_sabotage_q_lambda_returns_without_bootstrapping_fail_the_pqn_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import training.pqn as pqn

    right = pqn.q_lambda_returns
    monkeypatch.setattr(
        pqn, "q_lambda_returns", lambda r, q, d, nq, nd, g, lam: right(r, q, d, nq, nd, 0.0, lam)
    )
    tries = _learn({**PQN_CARTPOLE, "precision": "fp32"}, 450.0)
    print("; ".join(map(str, tries)))
    assert not _learned(tries, 450.0) and len(tries) == len(SEEDS)
