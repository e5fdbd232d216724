"""Atari smoke: Pong-v5 with tiny sizes trains, round-trips its state and evaluates."""

from __future__ import annotations

import pytest
import torch
from test_algos_support import assert_same, config, learner, round_trip

from training.evaluate import evaluate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = {
    "ppo": {"num_envs": 4, "n_steps": 32, "batch_size": 64, "epochs": 1},
    "dqn": {
        "num_envs": 4,
        "batch_size": 16,
        "buffer_size": 1_000,
        "learning_starts": 256,
        "train_frequency": 16,
        "target_update_interval": 256,
        "total_steps": 5_000,
    },
}


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_pong_trains_round_trips_and_evaluates(algo: str) -> None:
    cfg = config(game="Pong-v5", algo=algo, **TINY[algo])
    a = learner(cfg)
    a.warmup_optimizer()
    torch.manual_seed(0)
    for _ in range(3):
        a.iterate()
    assert a.updates > 0
    b = learner(cfg)
    b.load_state_dict(round_trip(a.state_dict()))
    assert_same(a.state_dict(), b.state_dict())
    if algo == "dqn":
        b.replay = a.replay
    b.iterate()  # restarts its envs (and the replay's episodes) before stepping
    assert b.global_step > a.global_step
    result = evaluate(b, "Pong-v5", episodes=2, seed=3, threads=1, max_episode_steps=100)
    assert result["episodes"] == 2
    assert -21.0 <= result["min"] <= result["max"] <= 21.0
    a.close()
    b.close()
