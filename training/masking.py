"""Means over a rollout's live steps, shared by the on-policy learners (ppo, pqn).

Envpool's next-step auto-reset leaves *dead* steps in a rollout (the step taken from an
observation that followed a done: its action is ignored, its reward 0); the losses and their
diagnostics average over the others. Its own module so that neither learner imports the other.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)
