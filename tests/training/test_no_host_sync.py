"""The learners' training loop reads nothing back from the device but the actions an env step
needs (training/transfer.py): on a GPU every other readback (`.item()`, `.cpu()`, `.numpy()`,
`.tolist()`, a Python `if` or `float()` on a tensor, `nonzero`) stalls the host until the GPU
drains its queue. CUDA's own sync checker (`torch.cuda.set_sync_debug_mode`) needs a GPU
(tests/gpu runs it); this test catches the same calls on the CPU, where CI runs, by watching
every torch call made while `iterate()` runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from workerutil import small_learner

READBACKS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.nonzero,
    torch.nonzero,
}
REPO = Path(__file__).resolve().parents[2]
SANCTIONED = {"read"}  # ActionReadback.read: the env step's actions


class ReadbackWatch(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        caller = sys._getframe(1)
        # The learners' own calls: on the CPU every tensor is on the host, so a readback inside
        # torch (an optimizer's step counter kept on the host, a device move to where a tensor
        # already is) cannot be told from one of the device; tests/gpu checks torch's with
        # CUDA's sync checker.
        ours = f"{REPO}/training/" in caller.f_code.co_filename
        to_host = func is torch.Tensor.to and any(
            (isinstance(a, str) and a.startswith("cpu"))
            or (isinstance(a, torch.device) and a.type == "cpu")
            for a in (*args[1:], *kwargs.values())
        )
        sanctioned = caller.f_code.co_name in SANCTIONED and "transfer" in caller.f_code.co_filename
        if ours and (func in READBACKS or to_host) and not sanctioned:
            where = f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}"
            self.found.append(f"{getattr(func, '__name__', func)} at {where}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("algo", ["ppo", "pqn", "dqn"])
def test_an_iteration_reads_back_only_the_actions(algo: str) -> None:
    extra: dict[str, Any] = {}
    if algo == "dqn":  # updates from the start, and mostly greedy actions (the readback's path)
        extra = {"learning_starts": 64, "buffer_size": 4096, "start_e": 0.05, "end_e": 0.05}
    learner = small_learner(algo, **extra)
    try:
        learner.iterate()  # the first one builds what later ones reuse
        watch = ReadbackWatch()
        with watch:
            learner.iterate()
            learner.iterate()
        assert watch.found == [], "\n".join(watch.found)
        loss = "policy_loss" if algo == "ppo" else "td_loss"
        assert loss in learner.take_metrics(), "the updates ran (read once, here)"
    finally:
        learner.close()
