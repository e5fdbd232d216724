"""The interface the worker runtime drives, and what PPO and DQN share.

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

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import nn

from training.envs import EpisodeTracker
from training.protocol import WorkerConfig

if TYPE_CHECKING:
    from training.replay import ReplayBuffer


class Learner(Protocol):
    cfg: WorkerConfig
    device: torch.device
    global_step: int
    updates: int
    tracker: EpisodeTracker
    replay: ReplayBuffer | None

    def iterate(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def act_greedy(self, obs: np.ndarray) -> np.ndarray: ...
    def warmup_optimizer(self) -> None: ...
    def restart_envs(self, env_seed: int | None = None) -> None: ...
    def close(self) -> None: ...


def make_learner(cfg: WorkerConfig, device: torch.device, env_seed: int) -> Learner:
    if cfg.algo == "ppo":
        from training.ppo import PPOLearner

        return PPOLearner(cfg, device, env_seed)
    if cfg.algo == "dqn":
        from training.dqn import DQNLearner

        return DQNLearner(cfg, device, env_seed)
    raise ValueError(f"unknown algo {cfg.algo!r}")


# ---- pieces both algorithms use ------------------------------------------------------------


class Precision:
    """Mixed precision on CUDA (bf16, or fp16 with a GradScaler); plain fp32 elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.dtype: torch.dtype | None = None
        self.scaler: torch.amp.GradScaler | None = None
        if device.type == "cuda":
            if torch.cuda.is_bf16_supported():
                self.dtype = torch.bfloat16
            else:
                self.dtype = torch.float16
                self.scaler = torch.amp.GradScaler("cuda")

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield

    def step(
        self, loss: torch.Tensor, optimizer: torch.optim.Optimizer, params: Any, max_norm: float
    ) -> None:
        """backward, unscale, clip, optimizer step."""
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            nn.utils.clip_grad_norm_(params, max_norm)
            optimizer.step()
            return
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(params, max_norm)
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state is not None:
            self.scaler.load_state_dict(state)


class LRSchedule:
    """`cfg.lr_scheduler`: cosine per gradient update, step per `lr_step_size` agent steps."""

    def __init__(
        self, cfg: WorkerConfig, optimizer: torch.optim.Optimizer, total_updates: int
    ) -> None:
        self.kind = cfg.lr_scheduler
        self.step_size = cfg.lr_step_size
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if self.kind == "cosine":
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                optimizer, T_max=max(1, total_updates), eta_min=cfg.min_lr
            )
        elif self.kind == "step":
            self.scheduler = torch.optim.lr_scheduler.StepLR(
                optimizer, step_size=1, gamma=cfg.lr_step_gamma
            )

    def after_update(self) -> None:
        if self.kind == "cosine" and self.scheduler is not None:
            self.scheduler.step()

    def after_steps(self, global_step: int, updates: int) -> None:
        # One StepLR "epoch" per lr_step_size agent steps; only once the optimizer has stepped
        # (torch warns otherwise), catching up on any decays that fell due before that.
        if self.kind == "step" and self.scheduler is not None and updates > 0:
            while self.scheduler.last_epoch < global_step // self.step_size:
                self.scheduler.step()

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.scheduler is None else self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scheduler is not None and state is not None:
            self.scheduler.load_state_dict(state)


def warmup_adam(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Any,
) -> None:
    """One dummy step so the optimizer allocates its state now, then undo every trace of it.

    Parameters are copied back and each moment buffer and step counter is zeroed: Adam's
    lazily-created state is exactly zeros, so the first real step behaves as on a fresh
    optimizer.
    """
    saved = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad(set_to_none=True)
    loss_fn().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for p, s in zip(model.parameters(), saved, strict=True):
            p.copy_(s)
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
    del saved


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    return dict(rng.bit_generator.state)


def restore_rng(rng: np.random.Generator, state: dict[str, Any]) -> None:
    rng.bit_generator.state = state


def default_lr(cfg: WorkerConfig, atari_lr: float, vector_lr: float) -> float:
    if cfg.learning_rate is not None:
        return cfg.learning_rate
    return atari_lr if cfg.is_atari else vector_lr


def iterations_for(total_steps: int, unit: int) -> int:
    return math.ceil(total_steps / unit)
