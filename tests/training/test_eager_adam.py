"""The workers' Adam (training.optim.EagerAdam) is torch's fused Adam bit for bit, and a worker
never imports torch's compiler: building a torch optimizer imported `torch._dynamo`, about
0.95 s of every cold boot on this machine (benchmarks/boot_breakdown.py)."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn
from workerutil import REPO, committed_steps, worker_cmd

from training.optim import EagerAdam, load_optimizer_state, make_adam

CARTPOLE_PPO = ("--game", "CartPole-v1", "--algo", "ppo", "--threads", "1", "--eval-episodes", "0")


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(4, 8, 8, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 20 * 20, 6)
    )


def _train(opt_cls: type, steps: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    net = _net(0)
    opt = opt_cls(net.parameters(), lr=3e-4, eps=1e-5, fused=True)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        x = torch.rand(16, 4, 84, 84, generator=gen)
        net(x).square().mean().backward()
        opt.step()
    return net, opt


def test_same_parameters_and_state_as_torch_adam_bit_for_bit() -> None:
    ours, our_opt = _train(EagerAdam, 5)
    theirs, their_opt = _train(torch.optim.Adam, 5)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
    mine, other = our_opt.state_dict(), their_opt.state_dict()
    assert mine["param_groups"] == other["param_groups"]
    for k, state in other["state"].items():
        for name, value in state.items():
            assert torch.equal(mine["state"][k][name], value), (k, name)


def test_state_dicts_load_across_and_training_goes_on_identically() -> None:
    _, theirs = _train(torch.optim.Adam, 3)
    net_a, net_b = _net(0), _net(0)
    a = make_adam(net_a.parameters(), lr=3e-4, eps=1e-5)
    b = torch.optim.Adam(net_b.parameters(), lr=3e-4, eps=1e-5, fused=True)
    # Copies: torch loads a state's tensors without copying them when dtype and device match.
    load_optimizer_state(a, copy.deepcopy(theirs.state_dict()))
    b.load_state_dict(copy.deepcopy(theirs.state_dict()))
    x = torch.rand(8, 4, 84, 84, generator=torch.Generator().manual_seed(2))
    for net, opt in ((net_a, a), (net_b, b)):
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
    for p, q in zip(net_a.parameters(), net_b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert int(a.state_dict()["state"][0]["step"]) == 4


def test_closure_is_evaluated_with_grad_and_the_step_without() -> None:
    net = _net(0)
    opt = EagerAdam(net.parameters(), lr=1e-3, fused=True)
    x = torch.rand(2, 4, 84, 84)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        assert torch.is_grad_enabled()
        loss = net(x).sum()
        loss.backward()
        return loss

    before = [p.detach().clone() for p in net.parameters()]
    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.requires_grad
    assert all(not torch.equal(p, q) for p, q in zip(net.parameters(), before, strict=True))
    assert all(not p.requires_grad or p.grad_fn is None for p in net.parameters())


@pytest.mark.e2e
def test_a_worker_that_trains_checkpoints_and_resumes_never_imports_torch_dynamo(
    tmp_path: Path,
) -> None:
    # `-X importtime` logs every module the real worker imports, to the end of its run: a
    # first run that checkpoints, then a second that resumes from it (the restore path).
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for total in ("2048", "4096"):
        cmd = worker_cmd(run_dir, *CARTPOLE_PPO, "--total-steps", total)
        cmd[1:1] = ["-X", "importtime"]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                    if line.startswith("import time:")}  # fmt: skip
        assert "training.optim" in imported and "torch" in imported  # the log is read
        assert "torch._dynamo" not in imported, f"run to {total} imported torch._dynamo"
    assert max(committed_steps(run_dir)) >= 4096
