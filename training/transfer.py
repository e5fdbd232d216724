"""Moving a rollout's data between the host and the learner's device without host syncs.

On a GPU, a training loop that reads a tensor back (`.item()`, `.cpu()`, `.numpy()`, a Python
`if` on a tensor) or copies a pageable numpy array up (`torch.as_tensor(arr, device="cuda")`,
which waits for the copy) stalls the host until the GPU has drained its queue, every step: at
the small batches of Atari RL a step is then bound by these waits, not by arithmetic.

- `Uploader.put(name, array)`: the array is copied into a pinned host buffer of its own (one
  per name, two in turn, so that a buffer is never rewritten while its copy may still be in
  flight), then to the device with `non_blocking=True`: the host goes on at once.
- `actions_to_host(actions, buffer)`: the one readback an env step needs (envpool takes numpy
  actions): into a pinned buffer, then a wait on that copy alone (a CUDA event), not on the
  device.

On the CPU both are what the loop did before: `torch.as_tensor` (no copy) and `.numpy()`.
"""

from __future__ import annotations

import numpy as np
import torch


class Uploader:
    """Host arrays to `device`, asynchronously on CUDA (see the module's docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._stages: dict[str, list[torch.Tensor]] = {}
        self._events: dict[str, list[torch.cuda.Event | None]] = {}
        self._turn: dict[str, int] = {}

    def put(self, name: str, array: np.ndarray) -> torch.Tensor:
        if not self.cuda:
            return torch.as_tensor(array, device=self.device)
        array = np.ascontiguousarray(array)
        dtype = torch.from_numpy(array[:0]).dtype if array.size else torch.float32
        stages = self._stages.get(name)
        if stages is None or stages[0].shape != array.shape or stages[0].dtype != dtype:
            stages = [torch.empty(array.shape, dtype=dtype, pin_memory=True) for _ in range(2)]
            self._stages[name], self._events[name], self._turn[name] = stages, [None, None], 0
        turn = self._turn[name]
        self._turn[name] = 1 - turn
        event = self._events[name][turn]
        if event is not None:
            event.synchronize()  # the copy from this buffer two puts ago (long done, in practice)
        stage = stages[turn]
        stage.numpy()[...] = array
        out = stage.to(self.device, non_blocking=True)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record()
        self._events[name][turn] = done
        return out


class ActionReadback:
    """`read(actions)`: the sampled actions as numpy for the env step, the loop's one readback."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None

    def read(self, actions: torch.Tensor) -> np.ndarray:
        if not self.cuda:
            return actions.numpy()
        if self._host is None or self._host.shape != actions.shape:
            self._host = torch.empty(actions.shape, dtype=actions.dtype, pin_memory=True)
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        assert self._event is not None
        self._host.copy_(actions, non_blocking=True)
        self._event.record()
        self._event.synchronize()  # this copy only: the env needs the actions now
        return self._host.numpy()  # envpool copies the actions in during step()


def permutation(
    size: int, device: torch.device, rng: np.random.Generator, gen: torch.Generator | None
) -> torch.Tensor:
    """A random order of `size` indices on `device`: drawn there from `gen` (a generator on
    the device, whose state is the learner's to save) on a GPU, from `rng` on the CPU (as
    before: the CPU path's numbers are unchanged)."""
    if gen is None:
        return torch.as_tensor(rng.permutation(size), device=device)
    return torch.randperm(size, device=device, generator=gen)


def device_generator(device: torch.device, rng: np.random.Generator) -> torch.Generator | None:
    """The learner's generator for draws made on a GPU (None on the CPU), seeded from `rng`."""
    if device.type != "cuda":
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(int(rng.integers(2**62)))
    return gen
