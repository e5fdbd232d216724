"""The learner registry: `make_learner` builds the algorithm `cfg.algo` names (args.ALGOS).

Its own module so that the interface (training/learner.py) imports no algorithm: ppo and pqn
build on the interface's RolloutCut, and only this module (and the standby, to load them ahead)
imports them. No algorithm imports another: what they share lives in exploration, masking and
optim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from training.args import WorkerConfig
    from training.learner import Learner


def make_learner(cfg: WorkerConfig, device: torch.device, env_seed: int) -> Learner:
    if cfg.algo == "ppo":
        from training.ppo import PPOLearner

        return PPOLearner(cfg, device, env_seed)
    if cfg.algo == "dqn":
        from training.dqn import DQNLearner

        return DQNLearner(cfg, device, env_seed)
    if cfg.algo == "pqn":
        from training.pqn import PQNLearner

        return PQNLearner(cfg, device, env_seed)
    raise ValueError(f"unknown algo {cfg.algo!r}")
