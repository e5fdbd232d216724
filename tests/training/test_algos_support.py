"""Helpers shared by the algorithm tests: small configs, fresh learners, state comparison."""

from __future__ import annotations

import io
from typing import Any

import torch

from training.args import WorkerConfig, validate
from training.learner import Learner
from training.registry import make_learner

CPU = torch.device("cpu")


def config(**overrides: Any) -> WorkerConfig:
    base: dict[str, Any] = {"game": "CartPole-v1", "seed": 1, "threads": 1}
    return validate(WorkerConfig(**{**base, **overrides}))


def learner(cfg: WorkerConfig, env_seed: int = 7, torch_seed: int = 0) -> Learner:
    torch.manual_seed(torch_seed)
    return make_learner(cfg, CPU, env_seed)


def round_trip(state: dict[str, Any]) -> dict[str, Any]:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def assert_same(a: Any, b: Any, path: str = "state") -> None:
    """Deep equality of nested state: tensors exactly equal, everything else ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {set(a) ^ set(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def params_of(lrn: Learner) -> list[torch.Tensor]:
    net = getattr(lrn, "net", None) or lrn.q  # type: ignore[attr-defined]
    return [p.detach().clone() for p in net.parameters()]
