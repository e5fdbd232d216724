"""DQN at the field's settings (issue 27): its own batch (32, not PPO's minibatch), the replay
ratio knob (--gradient-steps), Polyak target updates (--tau), the fused optimizer that an older
checkpoint's state must not switch off."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_algos_support import config, learner, round_trip

from training.args import ConfigError, WorkerConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL: dict[str, Any] = {
    "algo": "dqn",
    "num_envs": 4,
    "buffer_size": 2_000,
    "learning_starts": 256,
    "train_frequency": 4,
    "target_update_interval": 256,
    "total_steps": 10_000,
}


def test_dqn_trains_on_the_fields_batch_and_ppo_keeps_its_minibatch() -> None:
    dqn = config(algo="dqn")
    assert (dqn.batch_size, dqn.train_batch_size()) == (None, 32)
    # The worker's `--batch-size` still means DQN's batch when given (the flag's old contract).
    assert config(algo="dqn", batch_size=64).train_batch_size() == 64
    assert config(algo="dqn", dqn_batch_size=128).train_batch_size() == 128
    # PPO's default minibatch is CleanRL's 256 where it divides the rollout, else a divisor.
    assert config(algo="ppo").train_batch_size() == 256
    assert config(algo="ppo", num_envs=3).train_batch_size() == 192
    assert config(algo="ppo", batch_size="auto").train_batch_size() == 1024
    assert "--batch-size" not in WorkerConfig(algo="dqn").to_argv()


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"batch_size": 64, "dqn_batch_size": 128}, ["--batch-size 64", "--dqn-batch-size 128"]),
        ({"batch_size": "auto"}, ["--batch-size auto"]),
        ({"dqn_batch_size": 0}, ["--dqn-batch-size 0"]),
        ({"gradient_steps": 0}, ["--gradient-steps 0"]),
        ({"tau": 0.0}, ["--tau 0.0"]),
        ({"tau": 1.5}, ["--tau 1.5"]),
    ],
)
def test_bad_dqn_settings_are_refused_naming_the_flag(
    overrides: dict[str, Any], names: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        config(algo="dqn", **overrides)
    assert all(name in str(err.value) for name in names), str(err.value)


def test_the_batch_flags_parse_from_argv() -> None:
    cfg = WorkerConfig.from_argv(
        ["--algo", "dqn", "--dqn-batch-size", "48", "--gradient-steps", "2", "--tau", "0.5"]
    )
    assert (cfg.train_batch_size(), cfg.gradient_steps, cfg.tau) == (48, 2, 0.5)
    assert WorkerConfig.from_argv(cfg.to_argv()) == cfg
    assert WorkerConfig.from_argv(["--batch-size", "none"]).batch_size is None


def _steps_to(lrn: Any, step: int) -> None:
    while lrn.global_step < step:
        lrn.iterate()


def test_gradient_steps_multiply_the_updates_at_the_same_agent_steps() -> None:
    one = learner(config(**SMALL))
    two = learner(config(**SMALL, gradient_steps=2))
    _steps_to(one, 2_048)
    _steps_to(two, 2_048)
    assert one.global_step == two.global_step
    assert one.updates == (2_048 - 256) // 4
    assert two.updates == 2 * one.updates


def test_tau_moves_the_target_that_fraction_of_the_way() -> None:
    lrn: Any = learner(config(**SMALL, tau=0.25))
    _steps_to(lrn, 256)  # learning starts; nothing synced yet but the first copy
    before_q = [p.detach().clone() for p in lrn.q.parameters()]
    before_t = [p.detach().clone() for p in lrn.target.parameters()]
    lrn._sync_target()
    for q, t0, t1 in zip(before_q, before_t, lrn.target.parameters(), strict=True):
        torch.testing.assert_close(t1, t0 + 0.25 * (q - t0))
    hard: Any = learner(config(**SMALL))
    _steps_to(hard, 512)
    hard._sync_target()
    pairs = zip(hard.q.parameters(), hard.target.parameters(), strict=True)
    assert all(torch.equal(q, t) for q, t in pairs)


def test_an_unfused_checkpoints_optimizer_state_loads_and_stays_fused() -> None:
    lrn: Any = learner(config(**SMALL))
    _steps_to(lrn, 512)
    state = round_trip(lrn.state_dict())
    for group in state["optimizer"]["param_groups"]:  # as saved before the fused kernel
        group["fused"], group["foreach"] = None, None
    other: Any = learner(config(**SMALL))
    other.load_state_dict(state)
    assert all(g["fused"] is True for g in other.optimizer.param_groups)
    other.iterate()  # steps with the loaded moments
    assert other.updates > lrn.updates


@pytest.mark.parametrize("double_q", [True, False])
def test_no_double_q_values_the_next_state_by_the_target_networks_max(
    double_q: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.dqn as dqn

    lrn: Any = learner(config(**SMALL, double_q=double_q))
    _steps_to(lrn, 256)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    right = dqn.double_dqn_target

    def spy(r: Any, d: Any, g: float, online: torch.Tensor, target: torch.Tensor) -> Any:
        seen.append((online, target))
        return right(r, d, g, online, target)

    monkeypatch.setattr(dqn, "double_dqn_target", spy)
    lrn._train_step(lrn.replay)
    online, target = seen[0]
    assert (online is target) is (not double_q)
    if not double_q:  # the argmax of the target's own values: its max
        picked = right(torch.zeros(len(target)), torch.zeros(len(target)), 1.0, online, target)
        torch.testing.assert_close(picked, target.max(dim=1).values)
