"""`--compile`: the networks compiled in place train as the eager ones do, and their state is
the eager one's (a checkpoint of either loads into the other). On the CPU, where CI runs (the
GPU's modes, CUDA graphs included, are measured where one is lent: docs/gpus.md)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from workerutil import heartbeat, run, small_learner

from training import rng
from training.args import ConfigError, WorkerConfig, validate
from training.device import COMPILE_CACHE


def _learner(algo: str, compile_mode: str) -> Any:
    rng.seed_everything(3)
    return small_learner(algo, 7, compile=compile_mode, seed=3)


@pytest.mark.e2e  # inductor runs the C++ compiler
@pytest.mark.timeout(300)
def test_a_compiled_ppo_learner_trains_as_the_eager_one() -> None:
    eager, compiled = _learner("ppo", "off"), _learner("ppo", "default")
    try:
        assert compiled.net._compiled_call_impl is not None, "compiled in place"
        assert eager.net._compiled_call_impl is None
        assert eager.state_dict()["net"].keys() == compiled.state_dict()["net"].keys()
        compiled.load_state_dict(eager.state_dict())  # the same start, exactly
        for learner in (eager, compiled):
            rng.seed_everything(11)
            learner.iterate()
        assert eager.global_step == compiled.global_step
        for (name, a), b in zip(
            eager.net.state_dict().items(), compiled.net.state_dict().values(), strict=True
        ):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=name)
        assert eager.take_metrics().keys() == compiled.take_metrics().keys()
    finally:
        eager.close()
        compiled.close()


def test_an_unknown_compile_mode_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="compile"):
        validate(WorkerConfig(compile="fast"))


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_compiled_worker_keeps_its_compiled_code_in_its_run_dir(tmp_path: Path) -> None:
    """What --compile built stays in `<run_dir>/compile-cache` (private), so the next start,
    after a crash or a reboot, loads it instead of compiling again; the checkpoint resumes."""
    run_dir = tmp_path / "run"
    args = ("--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--threads", "1",
            "--eval-episodes", "0", "--compile", "default")  # fmt: skip
    first = run(run_dir, *args, "--total-steps", "1024")
    assert first.returncode == 0, first.stderr[-3000:]
    cache = run_dir / COMPILE_CACHE
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    built = {p.relative_to(cache) for p in cache.rglob("*") if p.is_file()}
    assert built, "nothing was cached"
    again = run(run_dir, *args, "--total-steps", "2048")
    assert again.returncode == 0, again.stderr[-3000:]
    assert heartbeat(run_dir)["resumed_from_step"] == 1024
