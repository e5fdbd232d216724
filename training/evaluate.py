"""Evaluation on separate envs, by the field's conventions: unclipped returns of full games
(no life-loss ends), PPO sampling its policy (as CleanRL evaluates), DQN and PQN epsilon-greedy
with epsilon = 0.05 (the DQN papers' evaluation epsilon), episodes capped at the ALE standard of
108,000 frames (27,000 agent steps at frame skip 4) and the whole evaluation by a wall-time
budget. Why not greedy: an argmax policy in Breakout often never presses FIRE again after
losing a life, so its episodes run to the frame cap and score near zero while the policy it
came from scores well; sampling and a small epsilon are what published figures use.

eval.json records the protocol with the result, and counts the episodes the step cap
truncated (`capped`, included in the mean: that is the ALE convention) and the ones the wall
budget cut short (`unfinished`, left out: an unfinished game has no score).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from training.envs import make_env
from training.exploration import EVAL_EPSILON
from training.tasks import is_atari

if TYPE_CHECKING:
    from training.learner import Learner

MAX_EVAL_ENVS = 8
ATARI_MAX_EPISODE_STEPS = 27_000  # 108,000 frames at frame skip 4 (Machado et al. 2018)


def protocol(algo: str, env_id: str, max_episode_steps: int | None) -> dict[str, Any]:
    """How the episodes are played, for eval.json."""
    cap = max_episode_steps
    if cap is None and is_atari(env_id):
        cap = ATARI_MAX_EPISODE_STEPS
    sampled = algo == "ppo"
    return {
        "policy": "sample" if sampled else "epsilon-greedy",
        "epsilon": None if sampled else EVAL_EPSILON,
        "max_episode_steps": cap,  # None: the env's own limit
        "full_games": is_atari(env_id),  # Atari: game over, not life loss; unclipped score
    }


def evaluate(
    learner: Learner,
    env_id: str,
    episodes: int,
    seed: int,
    threads: int | None,
    *,
    max_episode_steps: int | None = None,
    budget_s: float | None = None,
    clock: Any = time.monotonic,
    interrupt: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Play `episodes` episodes with the learner's evaluation policy (`act_eval`); return
    mean/std/min/max over the finished ones, the counts and the protocol.

    A handful of envs run in parallel; each env plays at most its share of the episodes, so
    short episodes do not crowd out long ones. The actions' randomness comes from a generator
    seeded with `seed`, never from the learner's own RNG (an evaluation leaves training's
    random streams as they were). Past `budget_s` seconds the episodes still running are
    abandoned and counted as `unfinished`. `interrupt` (asked every env step; a checkpoint
    request, a preemption) abandons the evaluation at once: `interrupted` true, no figures.
    """
    proto = protocol(learner.cfg.algo, env_id, max_episode_steps)
    info: dict[str, Any] = {
        "protocol": {**proto, "episodes": episodes, "seed": seed, "budget_s": budget_s},
        "capped": 0,
        "unfinished": 0,
        "budget_hit": False,
        "interrupted": False,
    }
    if episodes <= 0:
        return {"episodes": 0, "mean": None, "std": None, "min": None, "max": None, **info}
    num_envs = min(episodes, MAX_EVAL_ENVS)
    quota = np.full(num_envs, episodes // num_envs)
    quota[: episodes % num_envs] += 1
    envs = make_env(
        env_id, num_envs, seed, threads, for_eval=True, max_episode_steps=proto["max_episode_steps"]
    )
    atari = is_atari(env_id)
    rng = np.random.default_rng(seed)
    running = np.zeros(num_envs, dtype=np.float64)
    played = np.zeros(num_envs, dtype=np.int64)
    returns: list[float] = []
    deadline = None if budget_s is None else clock() + budget_s
    try:
        obs, _ = envs.reset()
        while len(returns) < episodes:
            if interrupt is not None and interrupt():
                info["interrupted"] = True
                returns.clear()  # a part of the episodes says nothing of the policy
                break
            if deadline is not None and clock() >= deadline:
                info["budget_hit"] = True
                info["unfinished"] = int((played < quota).sum())  # one game running in each
                break
            obs, reward, terminated, truncated, step_info = envs.step(learner.act_eval(obs, rng))
            # Atari: the game's own score and game over (for_eval has no life-loss ends anyway)
            running += step_info["reward"] if atari else reward
            ended = np.asarray(step_info["terminated"], dtype=bool) if atari else terminated
            for env in np.flatnonzero(ended | truncated):
                if played[env] < quota[env]:
                    returns.append(float(running[env]))
                    info["capped"] += int(truncated[env] and not ended[env])
                played[env] += 1
                running[env] = 0.0
    finally:
        envs.close()
    if not returns:
        return {"episodes": 0, "mean": None, "std": None, "min": None, "max": None, **info}
    values = np.asarray(returns, dtype=np.float64)
    return {
        "episodes": len(returns),
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
        **info,
    }
