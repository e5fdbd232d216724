"""Greedy evaluation on separate envs: unclipped returns of full games."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from training.envs import is_atari, make_env

if TYPE_CHECKING:
    from training.learner import Learner

MAX_EVAL_ENVS = 8


def evaluate(
    learner: Learner,
    env_id: str,
    episodes: int,
    seed: int,
    threads: int | None,
    *,
    max_episode_steps: int | None = None,
) -> dict[str, Any]:
    """Play `episodes` greedy episodes; return mean/std/min/max return and the count.

    A handful of envs run in parallel; each env plays at most its share of the episodes, so
    short episodes do not crowd out long ones. Episode length is capped by envpool's own
    `max_episode_steps` (Atari: 27,000 agent steps) unless a smaller cap is given.
    """
    if episodes <= 0:
        return {"episodes": 0, "mean": None, "std": None, "min": None, "max": None}
    num_envs = min(episodes, MAX_EVAL_ENVS)
    quota = np.full(num_envs, episodes // num_envs)
    quota[: episodes % num_envs] += 1
    envs = make_env(
        env_id, num_envs, seed, threads, for_eval=True, max_episode_steps=max_episode_steps
    )
    atari = is_atari(env_id)
    running = np.zeros(num_envs, dtype=np.float64)
    played = np.zeros(num_envs, dtype=np.int64)
    returns: list[float] = []
    try:
        obs, _ = envs.reset()
        while len(returns) < episodes:
            obs, reward, terminated, truncated, info = envs.step(learner.act_greedy(obs))
            # Atari: the game's own score and game over (for_eval has no life-loss ends anyway)
            running += info["reward"] if atari else reward
            ended = np.asarray(info["terminated"], dtype=bool) if atari else terminated
            for env in np.flatnonzero(ended | truncated):
                if played[env] < quota[env]:
                    returns.append(float(running[env]))
                played[env] += 1
                running[env] = 0.0
    finally:
        envs.close()
    values = np.asarray(returns, dtype=np.float64)
    return {
        "episodes": len(returns),
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
    }
