"""On a real GPU, each learner's training iteration makes no host synchronisation but the one
an env step needs (the sampled actions, read back through training/transfer.py, which waits on
that copy's event, not on the device): CUDA's own checker, `torch.cuda.set_sync_debug_mode(
"error")`, raises on any other (`.item()`, a blocking copy either way, `nonzero`, a Python `if`
on a device tensor), inside torch too. tests/training/test_no_host_sync.py catches the
learners' own readbacks on the CPU, where CI runs.

Skipped where torch sees no CUDA GPU; run where one is lent (docs/gpus.md)."""

from __future__ import annotations

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
    "dqn": {"num_envs": 4, "learning_starts": 256, "buffer_size": 4096, "start_e": 0.05,
            "end_e": 0.05},
}  # fmt: skip


@pytest.mark.parametrize(
    ("graphs", "overlap"), [("off", "off"), ("on", "off"), ("on", "on")], ids=str
)
@pytest.mark.parametrize("algo", ["ppo", "pqn", "dqn"])
def test_an_iteration_on_the_gpu_syncs_only_for_the_actions(
    algo: str, graphs: str, overlap: str
) -> None:
    if overlap == "on" and algo == "dqn":
        pytest.skip("--env-overlap is for the rollout learners")
    cfg = validate(
        WorkerConfig(
            game="Breakout-v5",
            algo=algo,
            device="cuda",
            threads=4,
            eval_episodes=0,
            total_steps=10**6,
            cuda_graphs=graphs,  # on: captured at the first iterations, replayed under the check
            env_overlap=overlap,  # on: two readbacks a step, one per half
            **SETTINGS[algo],
        )
    )
    device = torch.device("cuda:0")
    setup_torch(device, cfg.threads)
    learner = make_learner(cfg, device, 1)
    try:
        learner.warmup_optimizer()
        for _ in range(2):  # allocations, cuDNN's choices, the replay's learning start
            learner.iterate()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                learner.iterate()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        metrics = learner.take_metrics()
        assert ("policy_loss" if algo == "ppo" else "td_loss") in metrics, metrics
    finally:
        learner.close()
