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
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from training.args import WorkerConfig
from training.envs import EpisodeTracker, make_env
from training.transfer import Uploader


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


# act(step, half, observations of that half) -> that half's actions for the env, having stored
# in the rollout buffers what the learner keeps of its acting.
Act = Callable[[int, int, torch.Tensor], np.ndarray]


class HalvesLearner(Protocol):
    """What `rollout_in_halves` uses of a rollout learner (PPO, PQN)."""

    cfg: WorkerConfig
    envs: Any
    tracker: EpisodeTracker
    b_obs: torch.Tensor
    b_dones: torch.Tensor
    b_rewards: torch.Tensor
    global_step: int
    phase_s: dict[str, float]
    interrupt: Callable[[], bool]
    _upload: Uploader

    def _abandon_rollout(
        self, step: int, next_obs: torch.Tensor, start_step: int, tracker_state: dict[str, Any]
    ) -> None: ...


def rollout_in_halves(
    learner: HalvesLearner,
    next_obs: torch.Tensor,
    next_done: torch.Tensor,
    start_step: int,
    tracker_state: dict[str, Any],
    act: Act,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A rollout of `learner` with its envs in halves (`learner.envs`: HalvedEnvs): each half
    acts and sends, then the other half's step is received (it stepped meanwhile). Both halves
    are received before it returns, cut short too (then None, the rollout abandoned as the
    synchronous path abandons it); else the observations and dones after the last step."""
    cfg, envs = learner.cfg, learner.envs
    clock, phase, upload = time.perf_counter, learner.phase_s, learner._upload.put
    next_obs, next_done = next_obs.clone(), next_done.clone()  # written a half at a time
    pending: list[int | None] = [None, None]  # the step whose result a half awaits

    def receive(half: int) -> None:
        step, cols = pending[half], envs.cols[half]
        assert step is not None
        t0 = clock()
        obs, reward, terminated, truncated, info = envs.recv(half)
        t1 = clock()
        learner.tracker.update(reward, terminated, truncated, info, cols)
        learner.b_rewards[step, cols] = upload(f"reward{half}", reward)
        next_obs[cols] = upload(f"obs{half}", obs)
        next_done[cols] = upload(f"done{half}", terminated | truncated).float()
        pending[half] = None
        phase["env"] += t1 - t0
        phase["copies"] += clock() - t1

    for step in range(cfg.n_steps):
        if learner.interrupt():
            for half in (0, 1):
                if pending[half] is not None:
                    receive(half)  # no step left in flight
            learner._abandon_rollout(step, next_obs, start_step, tracker_state)
            return None
        for half, cols in enumerate(envs.cols):
            t0 = clock()
            learner.b_obs[step, cols] = next_obs[cols]
            learner.b_dones[step, cols] = next_done[cols]
            t1 = clock()
            # A copy: a readback's pinned buffer is reused by the other half's read.
            actions = np.array(act(step, half, next_obs[cols]), copy=True)
            envs.send(half, actions)
            pending[half] = step
            phase["copies"] += t1 - t0
            phase["inference"] += clock() - t1
            if pending[1 - half] is not None:
                receive(1 - half)  # it stepped while this half acted
        learner.global_step += cfg.num_envs
    for half in (0, 1):
        if pending[half] is not None:
            receive(half)
    return next_obs, next_done
