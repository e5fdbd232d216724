"""The pure maths: GAE, PPO losses, Double-DQN target, epsilon schedule, network heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.dqn import double_dqn_target, linear_epsilon
from training.envs import EpisodeTracker
from training.networks import ActorCritic, QNetwork
from training.ppo import gae, normalize_advantages, ppo_loss


def test_gae_matches_a_hand_computed_rollout() -> None:
    # One env, three steps; an episode ends after step 1 (so obs[2] follows a done).
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    dones = torch.tensor([[0.0], [0.0], [1.0]])
    next_value, next_done = torch.tensor([2.0]), torch.tensor([0.0])
    adv, ret = gae(rewards, values, dones, next_value, next_done, gamma, lam)
    d2 = 3.0 + 0.9 * 2.0 - 1.5  # bootstraps from next_value
    d1 = 2.0 - 1.0  # obs[2] follows a done: no bootstrap, no carry
    d0 = 1.0 + 0.9 * 1.0 - 0.5
    a1, a2 = d1, d2
    a0 = d0 + 0.9 * 0.5 * a1
    assert torch.allclose(adv[:, 0], torch.tensor([a0, a1, a2]))
    assert torch.allclose(ret, adv + values)


def test_gae_with_lambda_one_is_the_discounted_return_minus_value() -> None:
    rewards = torch.ones(4, 2)
    values = torch.zeros(4, 2)
    adv, _ = gae(rewards, values, torch.zeros(4, 2), torch.zeros(2), torch.ones(2), 0.5, 1.0)
    assert torch.allclose(adv[0], torch.full((2,), 1 + 0.5 + 0.25 + 0.125))


def test_ppo_policy_loss_clips_the_ratio() -> None:
    adv = torch.tensor([1.0, -1.0])
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 0.5]))  # ratios 1.5 and 0.5
    zero = torch.zeros(2)
    loss = ppo_loss(new, old, adv, zero, zero, zero, zero, clip_coef=0.2)
    # max(-A*r, -A*clip(r)): A=1, r=1.5 -> -1.2 ; A=-1, r=0.5 -> max(0.5, 0.8) = 0.8
    assert loss.policy.item() == pytest.approx((-1.2 + 0.8) / 2)


def test_ppo_value_loss_takes_the_worse_of_clipped_and_unclipped() -> None:
    z = torch.zeros(1)
    new_v, old_v, ret = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([1.0])
    loss = ppo_loss(z, z, z, new_v, old_v, ret, z, clip_coef=0.2)
    # unclipped error 0; clipped value 0.2 -> error 0.64; 0.5 * max = 0.32
    assert loss.value.item() == pytest.approx(0.32)


def test_ppo_loss_mask_ignores_dead_steps() -> None:
    z = torch.zeros(2)
    ent = torch.tensor([1.0, 100.0])
    loss = ppo_loss(z, z, z, z, z, z, ent, 0.2, mask=torch.tensor([1.0, 0.0]))
    assert loss.entropy.item() == pytest.approx(1.0)
    assert loss.total(0.5, 0.01).item() == pytest.approx(-0.01)


def test_normalize_advantages_uses_valid_entries_only() -> None:
    adv = torch.tensor([1.0, 3.0, 1000.0])
    out = normalize_advantages(adv, torch.tensor([1.0, 1.0, 0.0]))
    assert out[:2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-6)


def test_double_dqn_target_evaluates_the_online_argmax_with_the_target_net() -> None:
    rewards = torch.tensor([1.0, 1.0])
    dones = torch.tensor([0.0, 1.0])
    online = torch.tensor([[0.0, 5.0], [9.0, 0.0]])
    target = torch.tensor([[10.0, 2.0], [3.0, 4.0]])
    out = double_dqn_target(rewards, dones, 0.5, online, target)
    assert out.tolist() == [1.0 + 0.5 * 2.0, 1.0]


@pytest.mark.parametrize(("t", "expected"), [(0, 1.0), (50, 0.525), (100, 0.05), (10_000, 0.05)])
def test_linear_epsilon_anneals_then_stays(t: int, expected: float) -> None:
    assert linear_epsilon(1.0, 0.05, 100, t) == pytest.approx(expected)


def test_linear_epsilon_without_duration_is_final() -> None:
    assert linear_epsilon(1.0, 0.1, 0, 0) == 0.1


def test_dueling_head_shapes_and_mean_zero_advantage() -> None:
    net = QNetwork((4, 84, 84), 6, (), dueling=True)
    q = net(torch.zeros(3, 4, 84, 84, dtype=torch.uint8))
    assert q.shape == (3, 6)
    mlp = QNetwork((4,), 2, (16, 8), dueling=True)
    x = torch.randn(5, 4)
    h = mlp.trunk(x)
    assert mlp.value is not None
    assert torch.allclose(mlp(x).mean(dim=1), mlp.value(h).squeeze(1), atol=1e-6)


def test_actor_critic_shapes() -> None:
    for shape in ((4, 84, 84), (6,)):
        net = ActorCritic(shape, 3, (32, 32))
        obs = torch.zeros(2, *shape, dtype=torch.uint8 if len(shape) == 3 else torch.float32)
        logits, value = net(obs)
        assert logits.shape == (2, 3) and value.shape == (2,)
        assert torch.allclose(net.value(obs), value)


def test_episode_tracker_counts_real_atari_episodes_unclipped() -> None:
    tracker = EpisodeTracker(2, atari=True)
    no = np.zeros(2, dtype=bool)
    life_lost = np.array([True, False])
    tracker.update(np.ones(2), life_lost, no, {"reward": np.array([5.0, 2.0]), "terminated": no})
    assert tracker.episodes == 0
    game_over = np.array([True, False])
    info = {"reward": np.array([7.0, 1.0]), "terminated": game_over}
    tracker.update(np.ones(2), game_over, no, info)
    assert tracker.episodes == 1 and tracker.mean_return() == 12.0
    restored = EpisodeTracker(2, atari=True)
    restored.load_state_dict(tracker.state_dict())
    assert restored.episodes == 1 and list(restored.recent) == [12.0]
