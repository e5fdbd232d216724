"""The fast path (`--precision`): which arithmetic each setting picks on which CPU, that it
computes the same function as fp32, that checkpoints move exactly between the paths (in
process and through real worker processes), and the evaluation protocol (PPO sampling, DQN and
PQN epsilon 0.05, step caps, the wall budget, training's RNG left alone)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_algos_support import assert_same, config, learner, round_trip
from workerutil import heartbeat, run

from training import torchbuild
from training.args import ConfigError, WorkerConfig, validate
from training.evaluate import ATARI_MAX_EPISODE_STEPS, EVAL_EPSILON, evaluate
from training.networks import ActorCritic, scale_frames
from training.optim import Precision

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("one_torch_thread")]

CPU = torch.device("cpu")
FLAGS_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n"
FLAGS_PLAIN = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n"
TINY_PPO = {"game": "Breakout-v5", "algo": "ppo", "num_envs": 2, "n_steps": 16,
            "batch_size": 16, "epochs": 1}  # fmt: skip


@pytest.fixture
def cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str | None], None]:
    """Plays a CPU: its /proc/cpuinfo text (None: no file to read)."""

    def use(text: str | None) -> None:
        path = tmp_path / "cpuinfo"
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)
        monkeypatch.setenv(torchbuild.CPUINFO_PATH_ENV, str(path))

    return use


# ---- which arithmetic ------------------------------------------------------------------------


def test_auto_is_bf16_only_for_the_cnn_on_a_cpu_with_native_bf16(
    cpuinfo: Callable[[str | None], None],
) -> None:
    cpuinfo(FLAGS_BF16)
    assert torchbuild.cpu_bf16_native()
    assert Precision(CPU, "auto", conv=True).name == "bf16"
    assert Precision(CPU, "auto", conv=False).name == "fp32"  # tiny MLPs gain nothing
    assert Precision(CPU, "fp32", conv=True).name == "fp32"
    cpuinfo(FLAGS_PLAIN)  # emulated bf16 is slower than fp32: the fast path stays off
    assert not torchbuild.cpu_bf16_native()
    assert Precision(CPU, "auto", conv=True).name == "fp32"
    assert Precision(CPU, "bf16", conv=False).name == "bf16"  # asked for: given
    cpuinfo(None)  # no /proc/cpuinfo to read: no claim of bf16
    assert not torchbuild.cpu_bf16_native()
    assert Precision(CPU, "auto", conv=True).name == "fp32"


@pytest.mark.parametrize(
    ("major", "hip", "auto"),
    [(7, None, "fp16"), (8, None, "bf16"), (9, None, "bf16"), (7, "6.2", "bf16")],
)
def test_auto_on_cuda_is_bf16_only_where_the_gpu_has_it_in_hardware(
    monkeypatch: pytest.MonkeyPatch, major: int, hip: str | None, auto: str
) -> None:
    """A T4 or V100 (7.x) emulates bf16, slower than fp16 with a GradScaler: torch's
    is_bf16_supported() says yes there, so the choice reads the GPU's own capability."""
    asked: list[object] = []

    def props(device: object) -> object:
        asked.append(device)
        return type("Props", (), {"major": major})()

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.version, "hip", hip)
    gpu = torch.device("cuda", 1)
    with warnings.catch_warnings():  # a GradScaler without CUDA warns; with a GPU it does not
        warnings.simplefilter("ignore", UserWarning)
        p = Precision(gpu, "auto", conv=False)
    assert p.name == auto and (p.scaler is not None) == (auto == "fp16")
    assert asked == ([] if hip else [gpu]), "the worker's own GPU, not the current device"
    assert Precision(gpu, "bf16").name == "bf16" and Precision(gpu, "fp32").name == "fp32"
    assert torchbuild.resolve_precision("auto", "cuda", True, major >= 8 or bool(hip)) == auto


def test_a_bad_precision_is_a_config_error_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--precision.*fp8"):
        validate(WorkerConfig(precision="fp8"))
    with pytest.raises(ConfigError, match="--eval-budget-s"):
        validate(WorkerConfig(eval_budget_s=0))


def test_frames_scale_straight_from_uint8_under_autocast_and_as_before_without() -> None:
    x = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    assert torch.equal(scale_frames(x), x.float() / 255.0)  # the fp32 path: unchanged
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = scale_frames(x)
    assert low.dtype == torch.bfloat16
    assert torch.allclose(low.float(), x.float() / 255.0, atol=4e-3)


def test_the_fast_path_computes_the_same_policy_as_fp32() -> None:
    torch.manual_seed(0)
    net = ActorCritic((4, 84, 84), 4, ())
    x = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8)
    with torch.inference_mode():
        logits32, value32 = net(x)
        with Precision(CPU, "bf16").autocast():
            logits16, value16 = net(x)
    assert logits16.dtype == torch.bfloat16
    p32, p16 = logits32.softmax(1), logits16.float().softmax(1)
    assert (p32 - p16).abs().max() < 0.01, (p32 - p16).abs().max()
    assert torch.allclose(value16.float(), value32, atol=0.05, rtol=0.05)


# ---- checkpoints move between the paths -----------------------------------------------------


@pytest.mark.parametrize(("saved", "resumed"), [("bf16", "fp32"), ("fp32", "bf16")])
def test_state_saved_on_one_path_loads_exactly_on_the_other(saved: str, resumed: str) -> None:
    a = learner(config(**TINY_PPO, precision=saved))
    a.warmup_optimizer()
    for _ in range(2):
        a.iterate()
    assert a.precision.name == saved and a.updates > 0
    # Where the time went, by phase (what benchmarks/worker_throughput.py prints).
    phases = a.phase_s  # type: ignore[attr-defined]
    assert set(phases) == {"env", "inference", "copies", "update"}
    assert all(v > 0 for v in phases.values()), phases
    state = round_trip(a.state_dict())
    weights = [v for v in state["net"].values() if v.is_floating_point()]
    assert weights and all(v.dtype == torch.float32 for v in weights)  # fp32 master weights
    b = learner(config(**TINY_PPO, precision=resumed))
    b.warmup_optimizer()
    b.load_state_dict(state)
    assert b.precision.name == resumed
    assert_same(state, b.state_dict())
    b.iterate()  # and trains on
    assert b.global_step > a.global_step
    a.close()
    b.close()


def test_a_real_run_saved_on_the_fast_path_resumes_on_fp32_and_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    base = ("--game", "Breakout-v5", "--algo", "ppo", "--num-envs", "2", "--n-steps", "16",
            "--batch-size", "16", "--epochs", "1", "--threads", "1",
            "--eval-episodes", "0")  # fmt: skip
    for precision, total in (("bf16", 64), ("fp32", 128), ("bf16", 192)):
        proc = run(run_dir, *base, "--precision", precision, "--total-steps", str(total))
        assert proc.returncode == 0, proc.stderr[-2000:]
        hb = heartbeat(run_dir)
        assert hb is not None and hb["precision"] == precision
        assert hb["global_step"] == total
        assert hb["resumed_from_step"] == (None if total == 64 else total - 64)


# ---- evaluation ------------------------------------------------------------------------------


def test_ppo_evaluates_by_sampling_and_leaves_training_rngs_alone() -> None:
    lrn = learner(config(algo="ppo", num_envs=2, n_steps=16, batch_size=16))
    net = lrn.net  # type: ignore[attr-defined]
    with torch.no_grad():  # a uniform policy: sampling shows as varied actions
        for p in net.actor.parameters():
            p.zero_()
    obs = np.zeros((64, 4), dtype=np.float32)
    actions = lrn.act_eval(obs, np.random.default_rng(0))
    assert set(actions.tolist()) == {0, 1}  # argmax of equal logits would be all 0
    torch_rng, own_rng = torch.get_rng_state(), json.dumps(lrn.state_dict()["rng"])
    result = evaluate(lrn, "CartPole-v1", episodes=3, seed=5, threads=1)
    assert torch.equal(torch.get_rng_state(), torch_rng)
    assert json.dumps(lrn.state_dict()["rng"]) == own_rng
    assert result["episodes"] == 3
    assert result["protocol"] == {
        "policy": "sample", "epsilon": None, "max_episode_steps": None, "full_games": False,
        "episodes": 3, "seed": 5, "budget_s": None,
    }  # fmt: skip
    again = evaluate(lrn, "CartPole-v1", episodes=3, seed=5, threads=1)
    assert again["mean"] == result["mean"]  # seeded: the same episodes
    lrn.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"algo": "dqn", "num_envs": 2, "learning_starts": 100, "buffer_size": 1000},
        {"algo": "pqn", "num_envs": 2, "n_steps": 16, "batch_size": 32},
    ],
    ids=["dqn", "pqn"],
)
def test_q_learners_evaluate_epsilon_greedy(overrides: dict[str, Any]) -> None:
    lrn = learner(config(**overrides))
    obs = np.zeros((4000, 4), dtype=np.float32)
    greedy = lrn.act_greedy(obs)  # type: ignore[attr-defined]
    acted = lrn.act_eval(obs, np.random.default_rng(1))
    off = float((acted != greedy).mean())
    # A random action differs from the greedy one half the time (2 actions): ~0.025.
    assert 0.5 * EVAL_EPSILON / 2 < off < 2 * EVAL_EPSILON / 2, off
    result = evaluate(lrn, "CartPole-v1", episodes=2, seed=5, threads=1)
    assert result["protocol"]["policy"] == "epsilon-greedy"
    assert result["protocol"]["epsilon"] == EVAL_EPSILON
    lrn.close()


def test_atari_episodes_are_capped_counted_and_kept_in_the_mean() -> None:
    lrn = learner(config(**TINY_PPO))
    full = evaluate(lrn, "Breakout-v5", episodes=2, seed=3, threads=1, budget_s=0.001)
    assert full["protocol"]["max_episode_steps"] == ATARI_MAX_EPISODE_STEPS
    assert full["protocol"]["full_games"] is True
    capped = evaluate(lrn, "Breakout-v5", episodes=3, seed=3, threads=1, max_episode_steps=40)
    assert capped["episodes"] == 3
    # 40 agent steps are too few to lose 5 lives: every game is cut by the cap, and counted.
    assert capped["capped"] == 3 and capped["unfinished"] == 0
    assert capped["mean"] is not None
    lrn.close()


def test_the_wall_budget_ends_an_evaluation_and_counts_what_was_cut() -> None:
    lrn = learner(config(**TINY_PPO))
    ticks = iter(range(10**6))
    result = evaluate(lrn, "Breakout-v5", episodes=6, seed=3, threads=1, budget_s=50,
                      clock=lambda: float(next(ticks)))  # fmt: skip
    # One clock reading per step: 50 steps, no Breakout game is over that fast.
    assert result["budget_hit"] is True
    assert result["episodes"] == 0 and result["mean"] is None
    assert result["unfinished"] == 6
    assert result["protocol"]["budget_s"] == 50
    lrn.close()


def test_a_finished_run_is_not_held_by_its_evaluation(tmp_path: Path) -> None:
    """500 Breakout games would take an hour on this CPU: the budget ends it and says so."""
    run_dir = tmp_path / "run"
    proc = run(run_dir, "--game", "Breakout-v5", "--algo", "ppo", "--num-envs", "2",
               "--n-steps", "16", "--batch-size", "16", "--epochs", "1", "--threads", "1",
               "--total-steps", "32", "--eval-episodes", "500", "--eval-budget-s", "3",
               timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    ev = json.loads((run_dir / "eval.json").read_text())
    assert ev["budget_hit"] is True and ev["seconds"] < 60
    assert ev["episodes"] + ev["unfinished"] <= 500
    assert ev["protocol"]["policy"] == "sample" and ev["protocol"]["budget_s"] == 3
    assert ev["step"] == 32
