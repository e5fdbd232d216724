"""`--cuda-graphs on` on the CPU: the learners take the graphed path (static input buffers fed
each step, the step as one function over them, the acting forward likewise), run uncaptured
because the CPU has no CUDA graphs. What the capture adds on a GPU (warm-up put back, the
learning rate as a device tensor, capturable Adam) is tests/gpu/test_graphs.py's.

Uncaptured, the graphed path must give bit for bit what the eager path gives: a static buffer
fed late, or read stale, would show as a different parameter."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.training.workerutil import small_learner
from training.args import ConfigError, WorkerConfig, validate
from training.graphs import StepGraph, _Snapshot, graphs_state
from training.optim import Precision, load_optimizer_state, make_adam

ATARI = {"game": "Breakout-v5", "num_envs": 2, "n_steps": 16, "batch_size": 16,
         "precision": "bf16"}  # fmt: skip
CASES: list[tuple[str, dict[str, Any]]] = [
    ("ppo", {}),
    ("ppo", ATARI),
    ("pqn", {}),
    ("pqn", ATARI),
    ("dqn", {"learning_starts": 64, "buffer_size": 2048, "train_frequency": 4}),
]


def _trained(algo: str, settings: dict[str, Any], graphs: str, iterations: int = 3) -> Any:
    torch.manual_seed(0)
    learner = small_learner(algo, cuda_graphs=graphs, **settings)
    learner.warmup_optimizer()
    for _ in range(iterations):
        learner.iterate()
    return learner


def _params(learner: Any) -> list[torch.Tensor]:
    net = learner.net if hasattr(learner, "net") else learner.q
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize(("algo", "settings"), CASES)
def test_the_graphed_path_uncaptured_trains_exactly_as_the_eager_one(
    algo: str, settings: dict[str, Any]
) -> None:
    eager = _trained(algo, settings, "off")
    graphed = _trained(algo, settings, "on")
    try:
        assert graphed.updates == eager.updates > 0
        for a, b in zip(_params(eager), _params(graphed), strict=True):
            assert torch.equal(a, b)
        assert graphed.take_metrics() == eager.take_metrics()
        assert graphed._update_graph is not None and graphed._update_graph.captures == 0
    finally:
        eager.close()
        graphed.close()


@pytest.mark.parametrize("algo", ["ppo", "pqn", "dqn"])
def test_a_graphed_learner_resumes_exactly_from_its_state(algo: str) -> None:
    settings = dict(CASES[[c[0] for c in CASES].index(algo)][1])
    a = _trained(algo, settings, "on", iterations=2)
    twin = _trained(algo, settings, "on", iterations=2)  # deterministic: the same replay
    state = copy.deepcopy(a.state_dict())
    torch.manual_seed(99)  # b's own initial weights differ: all must come from the state
    b = small_learner(algo, cuda_graphs="on", **settings)
    try:
        b.warmup_optimizer()
        if algo == "dqn":
            b.replay = twin.replay  # what the worker does with a restored buffer
        b.load_state_dict(state)
        for lrn in (a, b):
            lrn.restart_envs(env_seed=11)
            torch.manual_seed(5)
            lrn.iterate()
        assert b.global_step == a.global_step and b.updates == a.updates > 0
        for x, y in zip(_params(a), _params(b), strict=True):
            assert torch.equal(x, y)
    finally:
        for lrn in (a, b, twin):
            lrn.close()


def test_feeding_a_new_shape_makes_a_new_buffer_and_drops_the_graph() -> None:
    seen: list[int] = []

    def step(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        seen.append(inputs["x"].data_ptr())
        return inputs["x"].sum()

    graph = StepGraph(torch.device("cpu"), step)
    graph.feed(x=torch.ones(4))
    first = graph.inputs["x"]
    graph.feed(x=torch.full((4,), 2.0))
    assert graph.inputs["x"] is first  # same shape: copied into the same buffer
    assert float(graph()) == 8.0
    graph.feed(x=torch.ones(5))
    assert graph.inputs["x"] is not first
    assert float(graph()) == 5.0
    assert seen == [first.data_ptr(), graph.inputs["x"].data_ptr()]


def test_the_capture_warm_up_is_put_back_in_place() -> None:
    """What the warm-up steps change (parameters, the optimizer's moments and step counter) is
    restored into the same tensors; state the warm-up created is zeros, a fresh optimizer's."""
    net = torch.nn.Linear(3, 2)
    opt = make_adam(net.parameters(), lr=0.1)
    params = list(net.parameters())

    def step() -> None:
        opt.zero_grad()
        net(torch.ones(4, 3)).pow(2).sum().backward()
        opt.step()

    fresh = _Snapshot(params, opt)
    before = [p.detach().clone() for p in params]
    step()
    fresh.restore()
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True))
    assert all(float(v.abs().sum()) == 0.0 for s in opt.state.values() for v in s.values())
    step()
    trained = [p.detach().clone() for p in params]
    moments = {k: v.clone() for k, v in opt.state[params[0]].items()}
    addresses = [p.data_ptr() for p in params]
    again = _Snapshot(params, opt)
    step()
    step()
    again.restore()
    assert [p.data_ptr() for p in params] == addresses
    assert all(torch.equal(p, t) for p, t in zip(params, trained, strict=True))
    assert all(torch.equal(opt.state[params[0]][k], v) for k, v in moments.items())


def test_an_optimizer_state_keeps_this_process_kernel_settings() -> None:
    """A checkpoint of a graphed learner on a GPU says capturable=True; loaded by an eager
    learner (or on the CPU, where torch refuses a capturable foreach optimizer), this
    process's own settings stay."""
    net = torch.nn.Linear(3, 2)
    opt = make_adam(net.parameters(), lr=0.1)
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = copy.deepcopy(opt.state_dict())
    state["param_groups"][0].update(capturable=True, fused=None, foreach=True)
    load_optimizer_state(opt, state)
    group = opt.param_groups[0]
    assert (group["capturable"], group["fused"], group["foreach"]) == (False, True, None)
    radam = torch.optim.RAdam(net.parameters(), lr=0.1, foreach=True)
    saved = radam.state_dict()
    saved["param_groups"][0]["capturable"] = True
    load_optimizer_state(radam, saved)
    assert radam.param_groups[0]["capturable"] is False


def test_cuda_graphs_with_a_compile_mode_that_graphs_itself_is_refused() -> None:
    with pytest.raises(ConfigError, match="--cuda-graphs on with --compile reduce-overhead"):
        validate(WorkerConfig(game="CartPole-v1", cuda_graphs="on", compile="reduce-overhead"))
    with pytest.raises(ConfigError, match="--cuda-graphs 'yes'"):
        validate(WorkerConfig(game="CartPole-v1", cuda_graphs="yes"))
    validate(WorkerConfig(game="CartPole-v1", cuda_graphs="on", compile="default"))


def test_what_cuda_graphs_does_here_is_said() -> None:
    cpu = torch.device("cpu")
    on = validate(WorkerConfig(game="CartPole-v1", cuda_graphs="on"))
    off = validate(WorkerConfig(game="CartPole-v1"))
    fp32 = Precision(cpu, "fp32")
    assert graphs_state(off, cpu, fp32) == "off"
    assert graphs_state(on, cpu, fp32).startswith("uncaptured")
    assert graphs_state(on, torch.device("cuda"), fp32) == "captured"
