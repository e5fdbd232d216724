"""What the algorithms share: mixed precision, learning-rate schedules, the optimizer's early
allocation, RNG state as plain data, defaults. Its own module so that the algorithms import it
and `learner.py` (the interface and the factory) imports them, with no cycle."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from training import torchbuild
from training.args import WorkerConfig


def cuda_bf16_native(device: torch.device) -> bool:
    """bf16 in hardware on this GPU (Ampere, compute capability 8.0, and newer; ROCm).
    Not `torch.cuda.is_bf16_supported()`: it counts emulated bf16 too (a T4 or V100 says yes),
    which is slower there than fp16 with a GradScaler, and it asks of the current device."""
    if torch.version.hip:
        return True
    return bool(torch.cuda.get_device_properties(device).major >= 8)


class Precision:
    """The networks' arithmetic (`--precision`): autocast to bf16 (or fp16 with a GradScaler
    on a CUDA GPU without bf16), or plain fp32. The weights, gradients and optimizer state stay
    fp32 in every mode (autocast casts per op), so a checkpoint saved under one mode resumes
    under another. Which one "auto" picks is `torchbuild.resolve_precision` (`conv`: the
    Atari CNN), the rule `rlsup doctor` reports too.
    """

    def __init__(self, device: torch.device, mode: str = "auto", *, conv: bool = False) -> None:
        self.device = device
        self.mode = mode
        cuda_bf16 = device.type == "cuda" and mode == "auto" and cuda_bf16_native(device)
        name = torchbuild.resolve_precision(mode, device.type, conv, cuda_bf16)
        self.dtype: torch.dtype | None = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)
        self.scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler("cuda") if name == "fp16" else None
        )

    @property
    def name(self) -> str:
        """What runs: "fp32", "bf16" or "fp16" (heartbeat, eval.json, the benchmark)."""
        if self.dtype is None:
            return "fp32"
        return "bf16" if self.dtype == torch.bfloat16 else "fp16"

    @property
    def graphable(self) -> bool:
        """Whether a step in this arithmetic can be a CUDA graph (training/graphs.py): not
        fp16's GradScaler, which reads its overflow check back to the host."""
        return self.scaler is None

    @contextlib.contextmanager
    def autocast(self, cache: bool = True) -> Iterator[None]:
        """`cache=False`: without autocast's cache of the weights' casts (a CUDA graph's
        captured step must cast them itself: the cache lives outside the graph)."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype, cache_enabled=cache):
            yield

    def step(
        self, loss: torch.Tensor, optimizer: torch.optim.Optimizer, params: Any, max_norm: float
    ) -> torch.Tensor:
        """backward, unscale, clip, optimizer step; returns the gradient norm before clipping,
        a tensor on the device (the metrics read it once per progress row, not per step)."""
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            norm = nn.utils.clip_grad_norm_(params, max_norm)
            optimizer.step()
            return norm
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(optimizer)
        norm = nn.utils.clip_grad_norm_(params, max_norm)
        self.scaler.step(optimizer)
        self.scaler.update()
        return norm

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state is not None:
            self.scaler.load_state_dict(state)


class LRSchedule:
    """`cfg.lr_scheduler` (`default`, the algorithm's, when unset): cosine or linear to
    `min_lr` per gradient update, step per `lr_step_size` agent steps."""

    def __init__(
        self,
        cfg: WorkerConfig,
        optimizer: torch.optim.Optimizer,
        total_updates: int,
        default: str = "none",
    ) -> None:
        self.kind = cfg.lr_scheduler or default
        self.step_size = cfg.lr_step_size
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if self.kind == "linear":
            # CleanRL's anneal_lr, per update instead of per rollout. In closed form of this
            # run's total (not LinearLR, whose checkpointed length would outlive a resume with
            # a larger total_steps and hold the rate at min_lr).
            end = min(1.0, cfg.min_lr / float(optimizer.param_groups[0]["lr"]))
            length = max(1, total_updates)

            def factor(update: int) -> float:
                return 1.0 - (1.0 - end) * min(update, length) / length

            self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        elif self.kind == "cosine":
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                optimizer, T_max=max(1, total_updates), eta_min=cfg.min_lr
            )
        elif self.kind == "step":
            self.scheduler = torch.optim.lr_scheduler.StepLR(
                optimizer, step_size=1, gamma=cfg.lr_step_gamma
            )

    def after_update(self) -> None:
        if self.kind in ("cosine", "linear") and self.scheduler is not None:
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


def never_interrupt() -> bool:
    """A learner's default `interrupt` (training/learner.py): outside the worker, never cut
    short."""
    return False


def _eager(method: Any) -> Any:
    """The function torch wrapped for torch.compile's sake (`functools.wraps` keeps it as
    `__wrapped__`); the method itself where there is no such wrapper."""
    return getattr(method, "__wrapped__", method)


class EagerAdam(torch.optim.Adam):
    """torch's Adam, without the import of its compiler on a cold start.

    torch wraps `Optimizer.add_param_group`, `zero_grad`, `state_dict` and `load_state_dict`
    in `torch._disable_dynamo`, and `Adam.step` in `_use_grad_for_differentiable`; each
    imports `torch._dynamo` on its first call, so building any torch optimizer costs a worker
    that never compiles anything about 0.95 s of its boot (benchmarks/boot_breakdown.py: 40 %
    of kill -> first step). The wrappers only tell torch.compile not to trace into these
    methods; run eagerly they are the functions they wrap. This class calls those functions
    (`__wrapped__`, kept by `functools.wraps`), with `step` under `no_grad` as the wrapper sets
    it (Adam is not `differentiable` here). Same arithmetic and the same state dict, bit for
    bit (tests/training/test_eager_adam.py); if a torch release drops a wrapper, the method is
    called as it is. A learner that compiles its step must use `torch.optim.Adam`."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _eager(torch.optim.Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _eager(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    def state_dict(self) -> Any:
        return _eager(torch.optim.Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict: Any) -> None:
        _eager(torch.optim.Optimizer.load_state_dict)(self, state_dict)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        with torch.no_grad():
            return _eager(torch.optim.Adam.step)(self, closure)


def make_adam(
    params: Any, lr: float, eps: float = 1e-8, capturable: bool = False
) -> torch.optim.Adam:
    """Adam with the fused kernel (one call updates every parameter). torch's default on a CPU
    is a Python loop over the parameters, several ops each: for DQN's batch-32 update on the
    Atari CNN that loop was about a quarter of the gradient step. Same arithmetic (fp32 moments,
    the same bias correction); the state dict is the same, so a checkpoint saved by either
    loads into the other. `EagerAdam`: no compiler import on a cold start. `capturable`: its
    step counter on the device, for a step captured in a CUDA graph (training/graphs.py)."""
    return EagerAdam(params, lr=lr, eps=eps, fused=True, capturable=capturable)


# An optimizer group's settings that choose how it runs, not what it computes: a checkpoint's
# are not this process's to take.
KERNEL_SETTINGS = ("foreach", "fused", "capturable")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a checkpoint's optimizer state and keep this optimizer's own kernel settings: torch
    takes a group's settings from the saved state (one saved before it was fused says
    fused=None; one saved by a CUDA-graphed learner says capturable=True)."""
    own = [{k: g[k] for k in KERNEL_SETTINGS if k in g} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, settings in zip(optimizer.param_groups, own, strict=True):
        group.update(settings)


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
