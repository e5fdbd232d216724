"""Resumability: state_dict round trips, warmup, schedulers, replay restarts (CartPole, CPU)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_algos_support import assert_same, config, learner, params_of, round_trip

from training.args import WorkerConfig
from training.registry import make_learner
from training.replay import ReplayBuffer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PPO = {"algo": "ppo", "num_envs": 4, "n_steps": 64, "batch_size": 64, "epochs": 2}
DQN = {
    "algo": "dqn",
    "num_envs": 4,
    "batch_size": 32,
    "buffer_size": 2_000,
    "learning_starts": 256,
    "train_frequency": 4,
    "target_update_interval": 300,
    "total_steps": 10_000,
}
PQN = {"algo": "pqn", "num_envs": 4, "n_steps": 32, "batch_size": 32, "epochs": 2}


def _iterate(lrn: Any, n: int, torch_seed: int = 5) -> None:
    torch.manual_seed(torch_seed)  # PPO samples actions with torch's global RNG (the worker's)
    for _ in range(n):
        lrn.iterate()


def _params_equal(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(params_of(a), params_of(b), strict=True))


@pytest.mark.parametrize("scheduler", ["none", "cosine", "step"])
def test_ppo_state_round_trip_restores_everything_and_continues_identically(
    scheduler: str,
) -> None:
    cfg = config(**PPO, lr_scheduler=scheduler, lr_step_size=256)
    a = learner(cfg)
    _iterate(a, 3)
    state = round_trip(a.state_dict())
    b = learner(cfg, torch_seed=99)  # different init: everything must come from the state
    b.load_state_dict(state)
    assert_same(a.state_dict(), b.state_dict())
    assert b.global_step == 3 * 256 and b.updates == 3 * 2 * 4
    # Same envs (fresh, same seed) and same torch RNG -> the same next update.
    a.restart_envs(env_seed=11)
    b.restart_envs(env_seed=11)
    _iterate(a, 1)
    _iterate(b, 1)
    assert _params_equal(a, b)
    assert_same(a.state_dict(), b.state_dict())
    a.close()
    b.close()


@pytest.mark.parametrize("dueling", [False, True])
def test_dqn_state_round_trip_restores_everything_and_continues_identically(
    dueling: bool,
) -> None:
    cfg = config(**DQN, dueling=dueling, lr_scheduler="cosine")
    a, twin = learner(cfg), learner(cfg)
    _iterate(a, 4)
    _iterate(twin, 4)  # deterministic: its replay holds exactly what a's holds
    assert a.updates > 0 and _params_equal(a, twin)
    state = round_trip(a.state_dict())
    b = learner(cfg, torch_seed=99)
    b.replay = twin.replay  # what the worker does with a restored buffer
    b.load_state_dict(state)
    assert_same(a.state_dict(), b.state_dict())
    a.restart_envs(env_seed=11)
    b.restart_envs(env_seed=11)
    _iterate(a, 2)
    _iterate(b, 2)
    assert _params_equal(a, b)
    assert_same(a.state_dict(), b.state_dict())
    for lrn in (a, b, twin):
        lrn.close()


@pytest.mark.parametrize("scheduler", [None, "cosine", "step"])
def test_pqn_state_round_trip_restores_everything_and_continues_identically(
    scheduler: str | None,
) -> None:
    cfg = config(**PQN, total_steps=2_048, lr_scheduler=scheduler, lr_step_size=256)
    a = learner(cfg)
    _iterate(a, 3)
    state = round_trip(a.state_dict())
    b = learner(cfg, torch_seed=99)  # different init: everything must come from the state
    b.load_state_dict(state)
    assert_same(a.state_dict(), b.state_dict())
    assert b.global_step == 3 * 128 and b.updates == 3 * 2 * 4
    a.take_metrics()  # diagnostics are not state: only what follows is compared
    a.restart_envs(env_seed=11)
    b.restart_envs(env_seed=11)
    _iterate(a, 2)
    _iterate(b, 2)
    assert _params_equal(a, b)
    assert_same(a.state_dict(), b.state_dict())
    assert a.take_metrics() == b.take_metrics()
    a.close()
    b.close()


def test_pqn_defaults_are_cleanrls_and_leave_dqns_alone() -> None:
    # Shared flags left unset resolve per algorithm: PQN's epsilon and linear LR anneal.
    pqn = learner(config(**PQN, total_steps=1_280))
    assert pqn.epsilon() == 1.0  # type: ignore[attr-defined]
    pqn.global_step = 320  # vector tasks: 1 -> 0.05 over the first half of total_steps
    assert pqn.epsilon() == pytest.approx(0.525)  # type: ignore[attr-defined]
    pqn.global_step = 0
    _iterate(pqn, 10)  # all of total_steps: the rate annealed linearly to min_lr (0)
    lr = pqn.optimizer.param_groups[0]["lr"]  # type: ignore[attr-defined]
    assert lr == pytest.approx(0.0, abs=1e-12)
    assert isinstance(pqn.optimizer, torch.optim.RAdam)  # type: ignore[attr-defined]
    assert pqn.max_grad_norm == 10.0  # type: ignore[attr-defined]
    pqn.close()
    atari = config(game="Breakout-v5", algo="pqn", num_envs=2, n_steps=8, batch_size=16)
    lrn = learner(atari)
    assert (lrn.end_e, lrn.exploration_fraction) == (0.01, 0.1)  # type: ignore[attr-defined]
    lrn.close()
    dqn = learner(config(**DQN))
    assert (dqn.end_e, dqn.exploration_fraction) == (0.05, 0.5)  # type: ignore[attr-defined]
    assert dqn.schedule.kind == "none"  # type: ignore[attr-defined]
    dqn.close()


def test_pqn_linear_anneal_follows_a_larger_total_steps_after_resume() -> None:
    short = learner(config(**PQN, total_steps=1_280))  # 10 iterations, 80 updates
    _iterate(short, 5)
    longer = learner(config(**PQN, total_steps=2_560))  # 160 updates
    longer.load_state_dict(round_trip(short.state_dict()))
    _iterate(longer, 1)
    lr = longer.optimizer.param_groups[0]["lr"]  # type: ignore[attr-defined]
    assert lr == pytest.approx(2.5e-4 * (1 - 48 / 160))
    short.close()
    longer.close()


def test_lr_scheduler_none_on_the_command_line_switches_pqns_anneal_off() -> None:
    cfg = WorkerConfig.from_argv(["--algo", "pqn", "--lr-scheduler", "none"])
    assert cfg.lr_scheduler == "none"
    assert WorkerConfig.from_argv(cfg.to_argv()) == cfg
    assert WorkerConfig.from_argv(["--algo", "pqn"]).lr_scheduler is None  # PQN's: linear
    lrn = learner(config(**PQN, total_steps=1_280, lr_scheduler="none"))
    _iterate(lrn, 10)
    assert lrn.optimizer.param_groups[0]["lr"] == 2.5e-4  # type: ignore[attr-defined]
    lrn.close()


def test_state_dict_holds_only_weights_only_types() -> None:
    allowed = (torch.Tensor, int, float, str, bool, type(None))

    def check(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                check(k)
                check(v)
        elif isinstance(x, list | tuple):
            for v in x:
                check(v)
        else:
            assert isinstance(x, allowed) and not isinstance(x, np.generic), type(x)

    for cfg in (
        config(**PPO, lr_scheduler="step"),
        config(**DQN, lr_scheduler="cosine"),
        config(**PQN),
    ):
        lrn = learner(cfg)
        _iterate(lrn, 2)
        check(lrn.state_dict())
        lrn.close()


@pytest.mark.parametrize("overrides", [PPO, DQN, PQN])
def test_warmup_optimizer_leaves_training_as_if_untouched(overrides: dict[str, Any]) -> None:
    cfg = config(**overrides)
    warmed, plain = learner(cfg), learner(cfg)
    before = params_of(warmed)
    warmed.warmup_optimizer()
    opt = warmed.optimizer  # type: ignore[attr-defined]
    assert len(opt.state) == len(before)  # Adam state allocated now
    assert all(torch.equal(x, y) for x, y in zip(before, params_of(warmed), strict=True))
    _iterate(warmed, 2)
    _iterate(plain, 2)
    assert warmed.updates > 0
    assert _params_equal(warmed, plain)
    assert_same(warmed.state_dict()["optimizer"], plain.state_dict()["optimizer"])
    warmed.close()
    plain.close()


def test_step_scheduler_decays_every_lr_step_size_agent_steps() -> None:
    cfg = config(**PPO, learning_rate=1e-3, lr_scheduler="step", lr_step_size=512)
    lrn = learner(cfg)
    _iterate(lrn, 4)  # 1024 agent steps: two decays
    lr = lrn.optimizer.param_groups[0]["lr"]  # type: ignore[attr-defined]
    assert lr == pytest.approx(1e-3 * 0.25)
    lrn.close()


def test_cosine_scheduler_reaches_min_lr_at_total_steps() -> None:
    cfg = config(**PPO, total_steps=512, lr_scheduler="cosine", min_lr=1e-5)
    lrn = learner(cfg)
    _iterate(lrn, 2)
    assert lrn.global_step == cfg.total_steps
    assert lrn.optimizer.param_groups[0]["lr"] == pytest.approx(1e-5)  # type: ignore[attr-defined]
    lrn.close()


def test_dqn_restarts_envs_into_an_assigned_replay_buffer() -> None:
    cfg = config(**DQN)
    lrn = learner(cfg)
    _iterate(lrn, 1)
    fresh = ReplayBuffer(cfg.buffer_size, (4,), np.float32, 1)
    lrn.replay = fresh  # no open episodes in it: the learner must add_reset before add_step
    _iterate(lrn, 1)
    assert fresh.num_resets >= cfg.num_envs and len(fresh) > 0
    lrn.close()


def test_dqn_never_overshoots_total_steps() -> None:
    cfg = config(**{**DQN, "total_steps": 300, "learning_starts": 100})
    lrn = make_learner(cfg, torch.device("cpu"), 3)
    while lrn.global_step < cfg.total_steps:
        lrn.iterate()
    assert cfg.total_steps <= lrn.global_step < cfg.total_steps + cfg.num_envs
    lrn.close()


def test_dqn_explores_with_the_scheduled_epsilon() -> None:
    cfg = config(**{**DQN, "total_steps": 1000, "exploration_fraction": 0.5, "end_e": 0.1})
    lrn = learner(cfg)
    assert lrn.epsilon() == 1.0  # type: ignore[attr-defined]
    lrn.global_step = 250
    assert lrn.epsilon() == pytest.approx(0.55)  # type: ignore[attr-defined]
    lrn.close()


@pytest.mark.parametrize("overrides", [PPO, DQN, PQN])
def test_mixed_precision_with_grad_scaler_trains_and_round_trips(
    overrides: dict[str, Any],
) -> None:
    # The CUDA fp16 path, exercised on CPU: autocast (bf16 on CPU) plus a GradScaler whose
    # state travels in the learner's state_dict.
    def mixed(lrn: Any) -> Any:
        lrn.precision.dtype = torch.bfloat16
        lrn.precision.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        return lrn

    cfg = config(**overrides)
    a = mixed(learner(cfg))
    a.warmup_optimizer()
    _iterate(a, 2)
    state = round_trip(a.state_dict())
    assert state["scaler"] is not None and state["scaler"]["scale"] > 0
    b = mixed(learner(cfg, torch_seed=99))
    b.load_state_dict(state)
    assert_same(a.state_dict(), b.state_dict())
    a.close()
    b.close()
