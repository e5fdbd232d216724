"""What the rollout learners (PPO, PQN) share around their own acting and losses: their envs
(one pool, or two halves under --env-overlap: training/overlap.py), the iteration (a rollout,
then the update; cut short as training/learner.py says) and the epochs of minibatch steps over
the rollout, eager or replayed as a CUDA graph (training/graphs.py). Each learner brings its
rollout (`_rollout`, `_rollout_in_halves`), its update (`_update`) and its gradient step
(`_gradient_step`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from training.args import WorkerConfig
from training.envs import make_env
from training.graphs import StepGraph
from training.learner import RolloutCut
from training.metrics import Means
from training.optim import LRSchedule
from training.overlap import HalvedEnvs
from training.transfer import Uploader, permutation

Rolled = tuple[torch.Tensor, torch.Tensor]


class RolloutLearner(RolloutCut):
    cfg: WorkerConfig
    device: torch.device
    env_seed: int
    overlap: bool  # --env-overlap on with an even number of envs
    envs: Any
    rng: np.random.Generator
    updates: int
    minibatch: int
    schedule: LRSchedule
    interrupt: Callable[[], bool]
    _next_done: torch.Tensor
    _upload: Uploader
    _perm_gen: torch.Generator | None
    _update_graph: StepGraph | None
    _losses: Means

    # ---- envs ------------------------------------------------------------------------------
    def restart_envs(self, env_seed: int | None = None) -> None:
        """Reset every env before the next step; with a seed, recreate them with it."""
        if env_seed is not None:
            self.envs.close()
            self.env_seed = env_seed
            self.envs = self._make_envs(env_seed)
        self._next_obs = None

    def _make_envs(self, env_seed: int) -> Any:
        cfg = self.cfg
        if self.overlap:
            return HalvedEnvs(cfg.game, cfg.num_envs, env_seed, cfg.envpool_threads())
        return make_env(cfg.game, cfg.num_envs, env_seed, cfg.envpool_threads())

    def _reset_envs(self) -> torch.Tensor:
        obs, _ = self.envs.reset()
        self.tracker.reset_envs()
        self._next_done.zero_()
        return self._to_tensor(obs)

    def _to_tensor(self, obs: np.ndarray) -> torch.Tensor:
        return self._upload.put("obs", obs)

    # ---- the iteration ---------------------------------------------------------------------
    def iterate(self) -> None:
        self.interrupted = None
        next_obs = self._reset_envs() if self._next_obs is None else self._next_obs
        next_done = self._next_done
        # Where an abandoned rollout goes back to (training/learner.py: cut short).
        start_step, tracker_state = self.global_step, self.tracker.state_dict()
        if self.overlap:
            rolled = self._rollout_in_halves(next_obs, next_done, start_step, tracker_state)
            if rolled is None:
                return
            next_obs, next_done = rolled
        else:
            next_obs, next_done = self._rollout(next_obs, next_done, start_step, tracker_state)
            if self.interrupted:
                return
        self._next_obs, self._next_done = next_obs, next_done
        self._update(next_obs, next_done)

    def _rollout(
        self,
        next_obs: torch.Tensor,
        next_done: torch.Tensor,
        start_step: int,
        tracker_state: dict[str, Any],
    ) -> Rolled:
        """Every env stepped at once; cut short: `interrupted` set."""
        raise NotImplementedError

    def _rollout_in_halves(
        self,
        next_obs: torch.Tensor,
        next_done: torch.Tensor,
        start_step: int,
        tracker_state: dict[str, Any],
    ) -> Rolled | None:
        """With --env-overlap on (training/overlap.py); None when cut short."""
        raise NotImplementedError

    def _update(self, next_obs: torch.Tensor, next_done: torch.Tensor) -> None:
        """The rollout's returns, then `_minibatch_epochs` over it."""
        raise NotImplementedError

    def _gradient_step(
        self, r: dict[str, torch.Tensor], mb: torch.Tensor, cache: bool = True
    ) -> tuple[torch.Tensor, ...]:
        """One minibatch's step (`mb`: indices into the rollout `r`); its diagnostics."""
        raise NotImplementedError

    def _captured_step(self, static: dict[str, torch.Tensor]) -> torch.Tensor:
        """The gradient step a CUDA graph captures (training/graphs.py): static inputs (the
        rollout and the minibatch's indices, `mb`), its diagnostics stacked in one output."""
        metrics = self._gradient_step(static, static["mb"], cache=False)
        return torch.stack([m.detach().float() for m in metrics])

    def _minibatch_epochs(self, r: dict[str, torch.Tensor]) -> None:
        """`cfg.epochs` passes over the rollout `r` in minibatches of a random order, each a
        gradient step (the CUDA graph's replay, with --cuda-graphs on); cut short between two
        minibatches, after at least one (`interrupted = "update"`)."""
        cfg = self.cfg
        graph = self._update_graph
        if graph is not None:
            graph.feed(**r)
        size = cfg.rollout_size()
        taken = 0
        for _ in range(cfg.epochs):
            if self.interrupted:
                break
            order = permutation(size, self.device, self.rng, self._perm_gen)
            for start in range(0, size, self.minibatch):
                if taken and self.interrupt():
                    self.interrupted = "update"  # after at least one: the steps count
                    break
                taken += 1
                mb = order[start : start + self.minibatch]
                if graph is not None:
                    graph.feed(mb=mb)
                    self._losses.add_vector(graph())
                else:
                    self._losses.add(*self._gradient_step(r, mb))
                self.updates += 1
                self.schedule.after_update()
