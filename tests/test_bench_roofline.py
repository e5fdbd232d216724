"""benchmarks/ppo_roofline.py: its FLOP count of a real PPO iteration (envpool, the learner's
own `iterate()`) against the Nature CNN's arithmetic by hand, and its ceiling's arithmetic.
No timing is asserted."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.benchmarks_import import benchmark_module


@pytest.fixture(scope="module")
def roofline() -> Iterator[ModuleType]:
    with benchmark_module("ppo_roofline.py", "bench_roofline") as module:
        yield module


def nature_cnn_macs(n_actions: int) -> tuple[int, int, int]:
    """Multiply-adds of one frame through PPO's network: (policy and value, value alone,
    the first conv)."""
    conv1 = 20 * 20 * 32 * (4 * 8 * 8)
    trunk = conv1 + 9 * 9 * 64 * (32 * 4 * 4) + 7 * 7 * 64 * (64 * 3 * 3) + 3136 * 512
    return trunk + 512 * (n_actions + 1), trunk + 512, conv1


def test_the_work_of_an_iteration_is_the_networks_arithmetic(roofline: ModuleType) -> None:
    args = argparse.Namespace(
        game="Breakout-v5", num_envs=2, n_steps=8, batch_size=8, epochs=2, threads=1
    )
    learner = roofline.ppo_learner(args, "fp32")
    try:
        work, total = roofline.count_work(learner, args)
    finally:
        learner.close()
    steps = args.num_envs * args.n_steps
    fwd, value, conv1 = nature_cnn_macs(4)  # Breakout: 4 actions
    per_k = 1000 / steps
    # Inference: one forward per agent step (2 FLOPs a multiply-add).
    assert work.inference == pytest.approx(2 * fwd * 1000, rel=1e-6)
    # The update: per epoch and sample a forward and a backward (twice the forward, less the
    # first conv's gradient for its input frames, which nothing needs), and the bootstrap
    # value of each env after the rollout.
    update = args.epochs * steps * (3 * fwd - conv1) + args.num_envs * value
    assert work.update == pytest.approx(2 * update * per_k, rel=1e-6)
    assert total == pytest.approx((work.inference + work.update) / per_k)


def test_the_ceiling_puts_only_the_arithmetic_at_the_peak(roofline: ModuleType) -> None:
    per_1k = {"env": 0.4, "inference": 0.2, "copies": 0.05, "update": 1.0, "other": 0.05}
    work = roofline.Work(inference=20e9, update=200e9)
    r = roofline.roofline(per_1k, work, peak=400e9)
    assert r.measured_s == pytest.approx(1.7)
    assert r.ceiling_s == pytest.approx(0.5 + 220e9 / 400e9)
    assert r.update_rate == pytest.approx(200e9)
    assert r.inference_rate == pytest.approx(100e9)
    assert r.headroom == pytest.approx(1.7 / 1.05)
