"""`--env-overlap on`: a rollout learner's envs as two envpool pools of half as many each,
stepped in turn, so that one half's envs step on their threads while the other half's actions
are computed (envpool's asynchronous `send`/`recv`).

A synchronous step (`envs.step(actions)`) leaves the device idle while every env steps, and
the env threads idle while the network acts. With two halves, per rollout step:

    act(half 0), send(half 0)     half 0's envs step ......................
    recv(half 1), act(half 1), send(half 1)          half 1's envs step ....
    recv(half 0), next step: act(half 0), send(half 0) ...  recv(half 1) ...

Envpool seeds env i of a pool with seed + i, so the two pools (seeds `seed` and
`seed + num_envs // 2`) are the very envs one pool of num_envs would be, column for column: the
rollout buffers keep their (step, env) layout, and the learner's state between iterations (no
step in flight: a rollout ends, or is cut short, with both halves received) is the synchronous
path's, so checkpoints and resume do not change. Each pool gets half the env threads.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from training.envs import make_env


class HalvedEnvs:
    """`num_envs` envs as two pools; `cols[k]`: half k's columns of a (..., num_envs) batch."""

    def __init__(self, game: str, num_envs: int, seed: int, threads: int | None) -> None:
        if num_envs < 2:
            raise ValueError(f"--env-overlap needs at least 2 envs, not {num_envs}")
        half = num_envs // 2
        per_pool = None if not threads else max(1, math.ceil(threads / 2))
        self.pools = [
            make_env(game, half, seed, per_pool),
            make_env(game, num_envs - half, seed + half, per_pool),
        ]
        self.cols = [slice(0, half), slice(half, num_envs)]
        self.observation_space = self.pools[0].observation_space
        self.action_space = self.pools[0].action_space

    def reset(self) -> tuple[np.ndarray, dict[str, Any]]:
        results = [pool.reset() for pool in self.pools]
        return np.concatenate([obs for obs, _ in results]), {}

    def send(self, half: int, actions: np.ndarray) -> None:
        self.pools[half].send(actions)

    def recv(self, half: int) -> tuple[Any, ...]:
        return tuple(self.pools[half].recv())

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
