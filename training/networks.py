"""Networks: the Nature CNN for Atari frames, MLPs for vector observations (as CleanRL)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import torch
from torch import nn

Layer = TypeVar("Layer", nn.Linear, nn.Conv2d)


def layer_init(layer: Layer, std: float = math.sqrt(2), bias: float = 0.0) -> Layer:
    """CleanRL's orthogonal weight init with a constant bias."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class NatureCNN(nn.Module):
    """(N, 4, 84, 84) uint8 frames -> (N, 512) features; scales by 1/255 itself.

    Channels-last (NHWC) weights and activations: oneDNN's convolutions (and cuDNN's) run
    without converting layouts around every conv. The frames stay NCHW everywhere else (the
    replay, the rollout buffers); each forward converts its batch once, as uint8.

    `layer_norm`: a LayerNorm after every conv and the hidden linear layer, before its ReLU
    (PQN's network: what lets it learn without a target network)."""

    out_dim = 512

    def __init__(
        self, in_channels: int = 4, orthogonal: bool = True, layer_norm: bool = False
    ) -> None:
        super().__init__()
        init = layer_init if orthogonal else (lambda layer: layer)

        def norm(*shape: int) -> list[nn.Module]:
            return [nn.LayerNorm(list(shape))] if layer_norm else []

        self.net = nn.Sequential(
            init(nn.Conv2d(in_channels, 32, 8, stride=4)),
            *norm(32, 20, 20),
            nn.ReLU(),
            init(nn.Conv2d(32, 64, 4, stride=2)),
            *norm(64, 9, 9),
            nn.ReLU(),
            init(nn.Conv2d(64, 64, 3, stride=1)),
            *norm(64, 7, 7),
            nn.ReLU(),
            nn.Flatten(),
            init(nn.Linear(64 * 7 * 7, self.out_dim)),
            *norm(self.out_dim),
            nn.ReLU(),
        )
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor, scaled: bool = False) -> torch.Tensor:
        """`scaled`: `x` is already what `prescale_frames` makes (channels last, in [0, 1])."""
        return self.net(x if scaled else scale_frames(frames_layout(x)))


# A rollout's frames in bf16/fp16 (2 bytes a pixel) up to this size are cast once per update
# (8 envs x 128 steps: 58 MB); a larger rollout casts each minibatch as it goes.
PRESCALE_MAX_BYTES = 512 * 2**20


def prescale_frames(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 frames -> `dtype` in [0, 1], channels last: what the CNN's first conv takes."""
    if x.dim() == 4:  # one pass: the cast writes channels last (not a uint8 copy first)
        return x.to(dtype, memory_format=torch.channels_last).mul_(1.0 / 255.0)
    return x.to(dtype).mul_(1.0 / 255.0)


def rollout_frames(obs: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, bool]:
    """A rollout's observations for an update that reads each many times (PPO's and PQN's
    epochs): uint8 frames under a low-precision autocast are cast once here, not once per
    minibatch (5 % of PPO's update on a 2-core CPU), up to PRESCALE_MAX_BYTES. Returns the
    tensor to index and whether it is prescaled (the network's `scaled`; indexing keeps the
    channels-last layout). The first conv sees the same values either way."""
    if (
        dtype is not None
        and obs.dtype == torch.uint8
        and obs.dim() == 4
        and obs.numel() * 2 <= PRESCALE_MAX_BYTES
    ):
        return prescale_frames(obs, dtype), True
    return obs, False


def frames_layout(x: torch.Tensor) -> torch.Tensor:
    """A batch of frames in the CNN's layout (channels last; a no-op when it is already, so a
    batch fed to several networks, DQN's next frames, is converted once)."""
    if x.dim() != 4:
        return x
    return x.contiguous(memory_format=torch.channels_last)


def scale_frames(x: torch.Tensor) -> torch.Tensor:
    """uint8 frames -> [0, 1]. Under a low-precision autocast, straight from uint8 to that
    dtype (the first conv would cast the fp32 result to it anyway): a 256-frame minibatch
    then skips a 29 MB fp32 copy and its division, ~20 ms of a 75 ms update on 2 CPU cores."""
    kind = x.device.type
    if x.dtype == torch.uint8 and torch.is_autocast_enabled(kind):
        low = torch.get_autocast_dtype(kind)
        return x.to(low).mul_(1.0 / 255.0)
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)  # in place on the new copy: one pass less
    return x.float() / 255.0


def mlp(
    in_dim: int,
    sizes: Sequence[int],
    activation: type[nn.Module] = nn.ReLU,
    orthogonal: bool = False,
    layer_norm: bool = False,
) -> nn.Sequential:
    """Hidden layers only: in_dim -> sizes[0] -> ... -> sizes[-1], each followed by activation
    (with `layer_norm`, by a LayerNorm and then the activation)."""
    layers: list[nn.Module] = []
    for size in sizes:
        linear = nn.Linear(in_dim, size)
        layers.append(layer_init(linear) if orthogonal else linear)
        if layer_norm:
            layers.append(nn.LayerNorm(size))
        layers.append(activation())
        in_dim = size
    return nn.Sequential(*layers)


class QNetwork(nn.Module):
    """Q(s, .) for DQN, with an optional dueling head: Q = V + A - mean(A)."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        n_actions: int,
        hidden: Sequence[int],
        dueling: bool = False,
    ) -> None:
        super().__init__()
        self.trunk: nn.Module
        if len(obs_shape) == 3:
            self.trunk = NatureCNN(obs_shape[0], orthogonal=False)
            feat = NatureCNN.out_dim
        else:
            self.trunk = mlp(math.prod(obs_shape), hidden)
            feat = hidden[-1] if hidden else math.prod(obs_shape)
        self.dueling = dueling
        self.advantage = nn.Linear(feat, n_actions)
        self.value = nn.Linear(feat, 1) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.trunk(obs if obs.dim() == 4 else obs.float())
        adv = self.advantage(h)
        if self.value is None:
            return adv
        return self.value(h) + adv - adv.mean(dim=1, keepdim=True)


class PQNetwork(nn.Module):
    """Q(s, .) for PQN, as CleanRL's pqn: LayerNorm after every hidden layer (the Nature CNN's
    convs and linear layer, or each MLP layer) and orthogonal init throughout."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.trunk: nn.Module
        if len(obs_shape) == 3:
            self.trunk = NatureCNN(obs_shape[0], layer_norm=True)
            feat = NatureCNN.out_dim
        else:
            self.trunk = mlp(math.prod(obs_shape), hidden, orthogonal=True, layer_norm=True)
            feat = hidden[-1] if hidden else math.prod(obs_shape)
        self.head = layer_init(nn.Linear(feat, n_actions))

    def forward(self, obs: torch.Tensor, scaled: bool = False) -> torch.Tensor:
        """Q(obs, .); `scaled`: frames from `prescale_frames`."""
        if obs.dim() == 4:
            return self.head(self.trunk(obs, scaled))
        return self.head(self.trunk(obs.float()))


class ActorCritic(nn.Module):
    """PPO policy and value: a shared CNN trunk for Atari, separate tanh MLPs for vectors."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.shared = len(obs_shape) == 3
        if self.shared:
            self.trunk = NatureCNN(obs_shape[0])
            self.actor = layer_init(nn.Linear(NatureCNN.out_dim, n_actions), std=0.01)
            self.critic = layer_init(nn.Linear(NatureCNN.out_dim, 1), std=1.0)
        else:
            dim = math.prod(obs_shape)
            last = hidden[-1] if hidden else dim
            self.actor = nn.Sequential(
                mlp(dim, hidden, nn.Tanh, orthogonal=True),
                layer_init(nn.Linear(last, n_actions), std=0.01),
            )
            self.critic = nn.Sequential(
                mlp(dim, hidden, nn.Tanh, orthogonal=True),
                layer_init(nn.Linear(last, 1), std=1.0),
            )

    def forward(self, obs: torch.Tensor, scaled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (N, A), value (N,)); `scaled`: frames from `prescale_frames`."""
        if self.shared:
            h = self.trunk(obs, scaled)
            return self.actor(h), self.critic(h).squeeze(-1)
        x = obs.float()
        return self.actor(x), self.critic(x).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.shared:
            return self.critic(self.trunk(obs)).squeeze(-1)
        return self.critic(obs.float()).squeeze(-1)


def compile_networks(mode: str, *modules: nn.Module) -> None:
    """`--compile`: torch.compile each module's forward (and so its backward) in place, its
    state dict unchanged (a checkpoint loads either way). "off": nothing is imported, nothing
    compiled (torch's compiler costs a second of every cold start just to import)."""
    if mode == "off":
        return
    for module in modules:
        module.compile(mode=None if mode == "default" else mode)
