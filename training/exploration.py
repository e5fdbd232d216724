"""Epsilon-greedy exploration, shared by the Q-learners (dqn, pqn): the linear epsilon schedule,
the per-env draw and the evaluation's epsilon. Its own module so that neither learner imports the
other.
"""

from __future__ import annotations

import numpy as np

EVAL_EPSILON = 0.05  # DQN's evaluation epsilon (Mnih et al. 2015; CleanRL's dqn_atari eval)


def linear_epsilon(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at agent step t: start_e falling linearly to end_e at t = duration, then flat."""
    if duration <= 0:
        return end_e
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e) if end_e <= start_e else min(slope * t + start_e, end_e)


def epsilon_greedy(
    greedy: np.ndarray, epsilon: float, n_actions: int, rng: np.random.Generator
) -> np.ndarray:
    """Each env's greedy action, or with probability epsilon a uniform one (both drawn
    always, so the generator advances the same whatever epsilon is)."""
    explore = rng.random(len(greedy)) < epsilon
    uniform = rng.integers(0, n_actions, size=len(greedy))
    return np.where(explore, uniform, greedy)
