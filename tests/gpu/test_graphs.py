"""`--cuda-graphs on` on a real GPU: each learner's gradient step and acting forward captured
as CUDA graphs (training/graphs.py) train as the eager path does, capture once, and resume
exactly; the capture's warm-up changes nothing a checkpoint holds. The CPU runs the same static
path uncaptured (tests/training/test_graphs.py, bit for bit against the eager path).

Skipped where torch sees no CUDA GPU; run where one is lent (docs/gpus.md)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from training.args import WorkerConfig, validate  # noqa: E402
from training.device import setup_torch  # noqa: E402
from training.registry import make_learner  # noqa: E402

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA GPU: run where one is lent (docs/gpus.md)"
    ),
    pytest.mark.timeout(300),
]

SETTINGS: dict[str, dict[str, Any]] = {
    "ppo": {"num_envs": 8, "n_steps": 32, "batch_size": 128},
    "pqn": {"num_envs": 8, "n_steps": 32, "batch_size": 128},
    "dqn": {"num_envs": 4, "learning_starts": 256, "buffer_size": 4096, "train_frequency": 4},
}  # fmt: skip


def _learner(algo: str, graphs: str, seed: int = 0, **more: Any) -> Any:
    cfg = validate(
        WorkerConfig(
            game="Breakout-v5", algo=algo, device="cuda", threads=4, eval_episodes=0,
            total_steps=10**6, cuda_graphs=graphs, **{**SETTINGS[algo], **more},
        )
    )  # fmt: skip
    device = torch.device("cuda:0")
    setup_torch(device, cfg.threads)
    torch.manual_seed(seed)
    learner = make_learner(cfg, device, 1)
    learner.warmup_optimizer()
    return learner


def _params(learner: Any) -> list[Any]:
    net = learner.net if hasattr(learner, "net") else learner.q
    return [p.detach().clone() for p in net.parameters()]


def _iterate(learner: Any, n: int) -> None:
    torch.manual_seed(7)  # the same sampling stream for both sides
    for _ in range(n):
        learner.iterate()
    torch.cuda.synchronize()


@pytest.mark.parametrize("algo", ["ppo", "pqn", "dqn"])
def test_the_captured_step_trains_as_the_eager_one(algo: str) -> None:
    """In fp32 (TF32 off: the same arithmetic either way) the graphed learner's parameters
    after a few iterations are the eager learner's, up to the capturable Adam's rounding."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    eager = _learner(algo, "off", precision="fp32")
    graphed = _learner(algo, "on", precision="fp32")
    try:
        _iterate(eager, 3)
        _iterate(graphed, 3)
        assert graphed.updates == eager.updates > 0
        assert graphed._update_graph.captures == 1  # captured once, replayed since
        assert graphed._act_graph.captures == 1
        if algo != "dqn":  # GAE / Q(lambda) over the rollout
            assert graphed._returns_graph.captures == 1
        for a, b in zip(_params(eager), _params(graphed), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        m_eager, m_graphed = eager.take_metrics(), graphed.take_metrics()
        for key, value in m_eager.items():
            assert m_graphed[key] == pytest.approx(value, rel=1e-3, abs=1e-5), key
    finally:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        eager.close()
        graphed.close()


@pytest.mark.parametrize("algo", ["ppo", "pqn", "dqn"])
def test_a_captured_learner_saves_and_resumes_exactly(algo: str) -> None:
    """A graphed learner's state (a capturable optimizer's, its step counter on the GPU) loads
    into a new one, which captures its own graphs after the load: the next iteration is the
    same (up to cuDNN's choice of kernels, which may differ between two processes' captures);
    and the state loads into an eager learner too."""
    a = _learner(algo, "on", precision="fp32")
    twin = _learner(algo, "on", precision="fp32")
    b = _learner(algo, "on", seed=99, precision="fp32")
    eager = _learner(algo, "off", seed=98, precision="fp32")
    try:
        _iterate(a, 2)
        _iterate(twin, 2)  # the same replay as a's, for DQN
        state = copy.deepcopy(a.state_dict())
        assert state["optimizer"]["param_groups"][0]["capturable"] is True
        for other in (b, eager):
            if algo == "dqn":
                other.replay = twin.replay
            other.load_state_dict(copy.deepcopy(state))
        assert not eager.optimizer.param_groups[0]["capturable"]
        for lrn in (a, b, eager):
            lrn.restart_envs(env_seed=11)
            _iterate(lrn, 1)
        assert b.global_step == a.global_step
        for x, y in zip(_params(a), _params(b), strict=True):
            torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6)
        for x, y in zip(_params(a), _params(eager), strict=True):
            torch.testing.assert_close(y, x, rtol=1e-3, atol=1e-4)
    finally:
        for lrn in (a, twin, b, eager):
            lrn.close()


def test_the_capture_changes_nothing_a_checkpoint_holds() -> None:
    """The warm-up steps torch needs before a capture train; they are put back in place."""
    learner = _learner("ppo", "on", precision="fp32")
    try:
        _iterate(learner, 1)  # captured during this iteration's first minibatch
        before = copy.deepcopy(learner.state_dict())
        learner._update_graph.reset()
        learner._act_graph.reset()
        r = learner._rollout_batch(torch.zeros_like(learner.b_rewards), learner.b_rewards)
        learner._update_graph.feed(**r, mb=torch.arange(learner.minibatch, device="cuda"))
        learner._update_graph._capture()  # warm-up and capture, no replay
        after = learner.state_dict()
        for key, value in before["net"].items():
            assert torch.equal(after["net"][key], value), key
        for pid, entry in before["optimizer"]["state"].items():
            for name, value in entry.items():
                assert torch.equal(after["optimizer"]["state"][pid][name], value), (pid, name)
    finally:
        learner.close()
