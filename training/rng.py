"""Capture and restore the process-global RNGs (python, numpy, torch, cuda) as weights-only data.

The learner keeps its own numpy Generator in its state; these are the globals that library code
(torch.distributions, torch.nn.init, ...) draws from.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def restore(state: dict[str, Any]) -> None:
    """`state` as `capture` made it, its tensors wherever the loader's `map_location` put
    them: a checkpoint resumed on a GPU loads with the GPU as its map location, and the RNG
    states are host data (numpy and `torch.set_rng_state` take CPU tensors only)."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npy = state["numpy"]
    keys = npy["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda_states = [s.cpu() for s in state.get("cuda") or []]
    if cuda_states and torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_states)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def derive_env_seed(seed: int, resume_count: int) -> int:
    """Envs cannot be checkpointed; each resume gets a fresh, reproducible seed."""
    return int(np.random.SeedSequence([seed, resume_count]).generate_state(1)[0] % (2**31 - 1))
