"""`--env-overlap on` (training/overlap.py): PPO's and PQN's envs as two envpool pools stepped
in turn.
The two pools are the one pool's envs column for column (envpool seeds env i with seed + i),
so a rollout in halves holds what a synchronous rollout holds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.training.workerutil import (
    committed_steps,
    heartbeat,
    kill,
    run,
    small_learner,
    start,
    wait_for,
)
from training.args import ConfigError, WorkerConfig, validate
from training.overlap import HalvedEnvs

ATARI = {"game": "Breakout-v5", "num_envs": 4, "n_steps": 16, "batch_size": 32,
         "precision": "fp32"}  # fmt: skip


def _trained(overlap: str, iterations: int, algo: str = "ppo", **settings: Any) -> Any:
    torch.manual_seed(0)
    learner = small_learner(algo, env_overlap=overlap, **settings)
    learner.warmup_optimizer()
    for _ in range(iterations):
        learner.iterate()
    return learner


@pytest.mark.parametrize("algo", ["ppo", "pqn"])
@pytest.mark.parametrize("settings", [{}, ATARI], ids=["cartpole", "breakout"])
def test_a_rollout_in_halves_is_the_synchronous_rollout(
    algo: str, settings: dict[str, Any]
) -> None:
    sync = _trained("off", 3, algo, **settings)
    halves = _trained("on", 3, algo, **settings)
    try:
        assert halves.overlap and isinstance(halves.envs, HalvedEnvs) and not sync.overlap
        assert halves.global_step == sync.global_step
        for name in ("b_obs", "b_rewards", "b_dones", "b_actions"):
            assert torch.equal(getattr(halves, name), getattr(sync, name)), name
        # The same data; the network acted on batches half as large, whose sums round
        # differently (a conv's float order): the updates agree to that rounding.
        net = "net" if algo == "ppo" else "q"
        mine, theirs = getattr(sync, net).parameters(), getattr(halves, net).parameters()
        for a, b in zip(mine, theirs, strict=True):
            torch.testing.assert_close(b, a, rtol=2e-3, atol=1e-5)
        assert halves.tracker.episodes == sync.tracker.episodes
        assert sorted(halves.tracker.recent) == sorted(sync.tracker.recent)
    finally:
        sync.close()
        halves.close()


@pytest.mark.parametrize("algo", ["ppo", "pqn"])
def test_a_rollout_in_halves_cut_short_leaves_no_step_in_flight(algo: str) -> None:
    learner = _trained("on", 1, algo)
    try:
        asked = iter([False] * 5 + [True])
        learner.interrupt = lambda: next(asked, False)
        start = learner.global_step
        learner.iterate()
        assert learner.interrupted == "rollout" and learner.global_step == start
        learner.interrupt = lambda: False
        learner.iterate()  # the envs reset cleanly: nothing left to receive
        assert learner.interrupted is None
        assert learner.global_step == start + learner.cfg.rollout_size()
    finally:
        learner.close()


def test_an_odd_number_of_envs_steps_them_together() -> None:
    learner = small_learner("ppo", env_overlap="on", num_envs=3, n_steps=16, batch_size=16)
    try:
        assert not learner.overlap
        learner.iterate()
    finally:
        learner.close()


def test_env_overlap_is_for_the_rollout_learners() -> None:
    with pytest.raises(ConfigError, match="--env-overlap on: for the rollout learners"):
        validate(WorkerConfig(game="CartPole-v1", algo="dqn", env_overlap="on"))
    with pytest.raises(ConfigError, match="--env-overlap 'yes'"):
        validate(WorkerConfig(game="CartPole-v1", env_overlap="yes"))


@pytest.mark.parametrize("algo", ["ppo", "pqn"])
def test_halves_and_the_graphed_path_together_roll_out_the_same(algo: str) -> None:
    """The acting forward's graph is fed half batches (one shape for both halves)."""
    sync = _trained("off", 2, algo)
    both = _trained("on", 2, algo, cuda_graphs="on")
    try:
        assert both.overlap and both._act_graph is not None
        for name in ("b_obs", "b_rewards", "b_dones", "b_actions"):
            assert torch.equal(getattr(both, name), getattr(sync, name)), name
    finally:
        sync.close()
        both.close()


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["ppo", "pqn"])
def test_a_real_worker_in_halves_and_graphed_resumes_after_a_sigkill(
    tmp_path: Any, algo: str
) -> None:
    """The worker process with both flags: it says what --cuda-graphs does here, checkpoints,
    is SIGKILLed, and resumes from its newest checkpoint to the end."""
    run_dir = tmp_path / "run"
    args = (
        "--game", "CartPole-v1", "--algo", algo, "--num-envs", "4", "--n-steps", "64",
        "--batch-size", "64", "--threads", "1", "--eval-episodes", "0",
        "--cuda-graphs", "on", "--env-overlap", "on",
        "--total-steps", "12000", "--checkpoint-every-steps", "2000",
    )  # fmt: skip
    proc = start(run_dir, *args)
    wait_for(lambda: len(committed_steps(run_dir)) >= 2, 120, "two checkpoints")
    log = kill(proc)
    assert "cuda_graphs" in log and "uncaptured" in log, log[-2000:]
    before = committed_steps(run_dir)
    again = run(run_dir, *args)
    assert again.returncode == 0, again.stdout[-2000:]
    hb = heartbeat(run_dir)
    assert hb is not None and hb["resumed_from_step"] == max(before)
    assert hb["global_step"] >= 12000


def test_the_envs_step_on_env_threads_where_given_else_on_threads() -> None:
    """`--env-threads` (0: envpool's own choice, one per env up to the cores) apart from
    torch's `--threads`; the halves share it."""
    cases = [({}, 1), ({"env_threads": 0}, 0), ({"env_threads": 3}, 3)]
    for more, expected in cases:
        learner = small_learner("ppo", **more)  # threads=1
        try:
            assert learner.envs.config["num_threads"] == expected, more
        finally:
            learner.close()
    halves = small_learner("ppo", env_overlap="on", env_threads=3)
    try:
        assert [pool.config["num_threads"] for pool in halves.envs.pools] == [2, 2]
    finally:
        halves.close()
    with pytest.raises(ConfigError, match="--env-threads -1: must be an integer >= 0"):
        validate(WorkerConfig(game="CartPole-v1", env_threads=-1))
