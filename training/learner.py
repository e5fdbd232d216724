"""The interface the worker runtime drives (`Learner`), which PPO, DQN and PQN implement.
Imports none of them: training/registry.py makes one by its `--algo`.

Lifecycle (the worker's side):

    learner = make_learner(cfg, device, env_seed)   # envs made, nothing stepped yet
    learner.warmup_optimizer()                      # allocate optimizer state now (OOM early)
    learner.replay = restored_buffer                # DQN resume only: any time before iterate()
    learner.load_state_dict(state)                  # resume only
    while learner.global_step < cfg.total_steps:
        learner.iterate()
    learner.close()

Envs are (re)started lazily: the first iterate() after construction, after `restart_envs()` or
after a replay buffer is assigned resets every env (and, for DQN, calls `replay.add_reset` for
all of them) before it steps. A checkpoint therefore never needs the envs' state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from training.args import WorkerConfig
from training.envs import EpisodeTracker
from training.optim import Precision

if TYPE_CHECKING:
    from training.replay import ReplayBuffer


class Learner(Protocol):
    cfg: WorkerConfig
    device: torch.device
    global_step: int
    updates: int
    tracker: EpisodeTracker
    replay: ReplayBuffer | None
    precision: Precision  # the networks' arithmetic (--precision, resolved)

    def iterate(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    # The evaluation policy (training/evaluate.py): PPO samples, DQN and PQN are
    # epsilon-greedy; its randomness from `rng`, never from the learner's own streams.
    def act_eval(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...
    def warmup_optimizer(self) -> None: ...
    def restart_envs(self, env_seed: int | None = None) -> None: ...
    def close(self) -> None: ...
    # The diagnostics averaged since the last call (training/metrics.py), one device sync.
    def take_metrics(self) -> dict[str, float]: ...
