"""The pure maths: GAE, PPO losses, Double-DQN target, Q(lambda) returns, epsilon schedule,
network heads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from training.dqn import double_dqn_target
from training.envs import EpisodeTracker
from training.exploration import epsilon_greedy, linear_epsilon
from training.networks import ActorCritic, PQNetwork, QNetwork
from training.ppo import gae, normalize_advantages, ppo_loss
from training.pqn import q_lambda_returns, q_loss


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


# ---- PQN -------------------------------------------------------------------------------------


def _q_lambda_example(returns_fn: Any) -> bool:
    """Does `returns_fn` give the hand-computed Q(lambda) returns of a small rollout?

    Two envs, four steps, gamma 0.9, lambda 0.8 (not 0.5: a swapped lambda must show).
    Env 0's episode ends at step 1, so obs[2] follows a done (dones[2] = 1): step 2 is the dead
    step; the returns are cut at step 1 and start again at step 2. Env 0 bootstraps after the
    last step from next_max_q = 50; env 1's last step ended its episode (next_done = 1).
    """
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 1.0]])
    max_q = torch.tensor([[10.0, 1.0], [20.0, 1.0], [30.0, 1.0], [40.0, 1.0]])
    dones = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    next_max_q, next_done = torch.tensor([50.0, 7.0]), torch.tensor([0.0, 1.0])
    g3 = 4 + 0.9 * 50  # bootstraps from the next observation's max Q: 49
    g2 = 3 + 0.9 * (0.8 * g3 + 0.2 * 40)  # 45.48
    g1 = 2.0  # the episode ended: no bootstrap, nothing of the dead step carried back
    g0 = 1 + 0.9 * (0.8 * g1 + 0.2 * 20)  # 6.04
    h3 = 1.0  # next_done: no bootstrap from 7
    h2 = 0.9 * (0.8 * h3 + 0.2 * 1)
    h1 = 0.9 * (0.8 * h2 + 0.2 * 1)
    h0 = 0.9 * (0.8 * h1 + 0.2 * 1)
    expected = torch.tensor([[g0, h0], [g1, h1], [g2, h2], [g3, h3]])
    got = returns_fn(rewards, max_q, dones, next_max_q, next_done, gamma, lam)
    return bool(torch.allclose(got, expected, atol=1e-5))


def test_q_lambda_returns_match_a_hand_computed_rollout() -> None:
    assert _q_lambda_example(q_lambda_returns)


def _swapped_lambda(r: Any, q: Any, d: Any, nq: Any, nd: Any, g: float, lam: float) -> Any:
    return q_lambda_returns(r, q, d, nq, nd, g, 1.0 - lam)


def _cleanrl_lambda_always(r: Any, q: Any, d: Any, nq: Any, nd: Any, g: float, lam: float) -> Any:
    return q_lambda_returns(r, q, d, nq, nd, g, 0.65)  # ignores the configured lambda


def _cut_one_step_late(r: Any, q: Any, d: Any, nq: Any, nd: Any, g: float, lam: float) -> Any:
    late = torch.cat([torch.zeros_like(d[:1]), d[:-1]])  # dones[t] read as dones[t + 1]
    return q_lambda_returns(r, q, late, nq, nd, g, lam)


@pytest.mark.parametrize("wrong", [_swapped_lambda, _cleanrl_lambda_always, _cut_one_step_late])
def test_sabotage_the_q_lambda_example_rejects_a_wrong_lambda_or_done_convention(
    wrong: Any,
) -> None:
    assert not _q_lambda_example(wrong)


def test_q_lambda_returns_span_one_step_q_learning_to_monte_carlo() -> None:
    rewards, max_q = torch.ones(3, 1), torch.tensor([[0.0], [5.0], [6.0]])
    dones, next_q, next_done = torch.zeros(3, 1), torch.tensor([8.0]), torch.tensor([0.0])
    one_step = q_lambda_returns(rewards, max_q, dones, next_q, next_done, 0.5, 0.0)
    assert one_step[:, 0].tolist() == [1 + 0.5 * 5, 1 + 0.5 * 6, 1 + 0.5 * 8]
    monte_carlo = q_lambda_returns(rewards, max_q, dones, next_q, next_done, 0.5, 1.0)
    assert monte_carlo[0, 0].item() == pytest.approx(1 + 0.5 + 0.25 + 0.125 * 8)


def test_q_loss_is_the_mean_squared_error_over_live_steps() -> None:
    q_taken, returns = torch.tensor([1.0, 2.0, 100.0]), torch.tensor([0.0, 4.0, 0.0])
    loss = q_loss(q_taken, returns, torch.tensor([1.0, 1.0, 0.0]))  # the dead step left out
    assert loss.item() == pytest.approx((1.0 + 4.0) / 2)


def test_epsilon_greedy_explores_at_the_given_rate() -> None:
    greedy = np.zeros(20_000, dtype=np.int64)
    acted = epsilon_greedy(greedy, 0.3, 4, np.random.default_rng(0))
    assert float((acted != 0).mean()) == pytest.approx(0.3 * 3 / 4, abs=0.01)
    assert (epsilon_greedy(greedy, 0.0, 4, np.random.default_rng(0)) == 0).all()


def test_pqn_network_has_a_layer_norm_after_every_hidden_layer() -> None:
    cnn = PQNetwork((4, 84, 84), 6, ())
    assert cnn(torch.zeros(3, 4, 84, 84, dtype=torch.uint8)).shape == (3, 6)
    layers = [m for m in cnn.trunk.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    norms = [m for m in cnn.trunk.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(layers) == len(norms) == 4  # three convs and the hidden linear layer
    vector = PQNetwork((4,), 2, (16, 8))
    assert vector(torch.randn(5, 4)).shape == (5, 2)
    norms = [m for m in vector.trunk.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert [n.normalized_shape for n in norms] == [(16,), (8,)]
