"""Atari smoke: Pong-v5 (and PQN on Breakout-v5, on the bf16 fast path too) with tiny sizes
trains, round-trips its state and evaluates."""

from __future__ import annotations

import math

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
    "pqn": {"num_envs": 4, "n_steps": 32, "batch_size": 64, "epochs": 1},
}


@pytest.mark.parametrize("algo", ["ppo", "dqn", "pqn"])
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


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_pqn_breakout_trains_and_resumes_exactly_on_either_path(precision: str) -> None:
    # bf16 is asked for explicitly: it runs (emulated) on a CPU without native bf16 too.
    cfg = config(game="Breakout-v5", algo="pqn", precision=precision, **TINY["pqn"])
    a = learner(cfg)
    assert a.precision.name == precision
    a.warmup_optimizer()
    for _ in range(2):
        a.iterate()
    metrics = a.take_metrics()
    assert {"td_loss", "q_values", "grad_norm", "learning_rate", "epsilon"} <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    b = learner(cfg, torch_seed=99)
    b.load_state_dict(round_trip(a.state_dict()))
    a.restart_envs(env_seed=5)
    b.restart_envs(env_seed=5)
    a.iterate()
    b.iterate()
    assert_same(a.state_dict(), b.state_dict())  # weights stay fp32: resumes bit for bit
    assert all(p.dtype == torch.float32 for p in b.q.parameters())  # type: ignore[attr-defined]
    result = evaluate(b, "Breakout-v5", episodes=1, seed=3, threads=1, max_episode_steps=100)
    assert result["episodes"] == 1 and result["protocol"]["policy"] == "epsilon-greedy"
    a.close()
    b.close()


@pytest.mark.parametrize("algo", ["ppo", "pqn"])
def test_the_rollouts_frames_are_cast_once_and_learn_exactly_as_per_minibatch(
    monkeypatch: pytest.MonkeyPatch, algo: str
) -> None:
    """The bf16 path casts the rollout's uint8 frames once for all epochs (not once per
    minibatch): the same values reach the first conv, so the same parameters come out."""
    from training import networks

    cfg = config(game="Breakout-v5", algo=algo, precision="bf16", **{**TINY[algo], "epochs": 2})
    states = []
    for limit in (networks.PRESCALE_MAX_BYTES, 0):  # cast once; per minibatch (over the limit)
        monkeypatch.setattr(networks, "PRESCALE_MAX_BYTES", limit)
        a = learner(cfg)
        a.warmup_optimizer()
        torch.manual_seed(0)
        for _ in range(2):
            a.iterate()
        assert a.updates > 0
        states.append(a.state_dict())
        a.close()
    key = "net" if algo == "ppo" else "q"
    assert_same(states[0][key], states[1][key])
    assert_same(states[0]["optimizer"], states[1]["optimizer"])


@pytest.mark.parametrize("algo", ["ppo", "pqn"])
def test_a_bf16_rollout_casts_each_weight_once_not_at_every_step(algo: str) -> None:
    """The rollout acts in one autocast region so that its cache casts the fp32 weights to
    bf16 once; under inference mode the cache is bypassed and every env step cast them all
    again (counted here by the fc weight's casts during one rollout)."""
    from torch.profiler import ProfilerActivity, profile

    cfg = config(game="Breakout-v5", algo=algo, precision="bf16", **TINY[algo])
    a = learner(cfg)
    a.warmup_optimizer()
    fc = next(p for p in a.state_dict()["net" if algo == "ppo" else "q"].values()
              if tuple(p.shape) == (512, 3136))  # fmt: skip
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            a._optimize = lambda *args, **kw: None  # type: ignore[attr-defined]  # rollout only
            a.iterate()
    finally:
        a.close()
    casts = sum(
        e.count for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::_to_copy" and str(list(fc.shape)) in str(e.input_shapes)
    )  # fmt: skip
    assert cfg.n_steps >= 4
    assert 1 <= casts <= 2, f"{casts} casts of the fc weight in a {cfg.n_steps}-step rollout"
