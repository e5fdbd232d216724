"""The CUDA paths for real, on a real GPU: each algorithm trains and resumes on `cuda:0` under
autocast (bf16 where the GPU has it, fp16 with a GradScaler when asked), fp32 runs with TF32 on,
a CUDA out-of-memory is exit 76 with error.json saying so, and under a real `rlsup run` the GPU
memory gate holds a game while a second process holds the memory, then starts it once freed,
and an OOM there is a `worker_oom` naming the GPU followed by a step down.

Skipped where torch sees no CUDA GPU (CI, this project's own machines); run where one is lent:
`python -m pytest tests/gpu` (docs/gpus.md says how). Nothing is faked: real NVML, real workers,
real envpool Breakout, a real second process holding GPU memory."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.runs import (
    MODES,
    env_for,
    events,
    heartbeat,
    rlsup,
    start_supervisor,
    wait_for,
)
from tests.training.workerutil import run as run_worker

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA GPU: run where one is lent (docs/gpus.md)"
    ),
    pytest.mark.timeout(420),
]

REPO = Path(__file__).resolve().parents[2]
GAME = "Breakout-v5"
# Small but real: whole rollouts, a few updates each, a checkpoint at the end.
ALGO_ARGS = {
    "ppo": ["--num-envs", "8", "--n-steps", "64", "--batch-size", "128"],
    "pqn": ["--num-envs", "8", "--n-steps", "64", "--batch-size", "128"],
    "dqn": ["--num-envs", "4", "--learning-starts", "512", "--buffer-size", "4096"],
}
STEPS = 2048


def worker_args(algo: str, total: int, *extra: str) -> list[str]:
    return [
        "--algo", algo, "--game", GAME, "--device", "cuda", "--total-steps", str(total),
        "--eval-episodes", "0", "--checkpoint-every-s", "600", *ALGO_ARGS[algo], *extra,
    ]  # fmt: skip


def hb_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "heartbeat.json").read_text())


@pytest.mark.parametrize("algo", ["ppo", "dqn", "pqn"])
def test_each_algorithm_trains_and_resumes_on_the_gpu(tmp_path: Path, algo: str) -> None:
    run_dir = tmp_path / algo
    first = run_worker(run_dir, *worker_args(algo, STEPS))
    assert first.returncode == 0, first.stderr[-3000:]
    hb = hb_of(run_dir)
    assert hb["device"] == "cuda:0"
    # Hopper and every GPU since Ampere has bf16 in hardware: "auto" takes it.
    assert hb["precision"] == "bf16"
    assert hb["gpu_mem_mb"] and hb["gpu_mem_mb"] > 0
    assert hb["torch_build"]["cuda"] and hb["torch_build"]["cuda_available"]
    assert hb["global_step"] >= STEPS and hb["last_checkpoint_step"] == hb["global_step"]
    again = run_worker(run_dir, *worker_args(algo, 2 * STEPS))
    assert again.returncode == 0, again.stderr[-3000:]
    hb2 = hb_of(run_dir)
    assert hb2["resumed_from_step"] == hb["global_step"]
    assert hb2["global_step"] >= 2 * STEPS and hb2["device"] == "cuda:0"


@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
def test_a_compiled_learner_trains_and_resumes_on_the_gpu(tmp_path: Path, mode: str) -> None:
    """`--compile` on the GPU (CUDA graphs with reduce-overhead): it trains, its checkpoint is
    the eager layout, and the next start resumes from it compiled again."""
    run_dir = tmp_path / mode
    first = run_worker(run_dir, *worker_args("ppo", STEPS, "--compile", mode))
    assert first.returncode == 0, first.stderr[-3000:]
    hb = hb_of(run_dir)
    assert hb["global_step"] >= STEPS and hb["last_checkpoint_step"] == hb["global_step"]
    again = run_worker(run_dir, *worker_args("ppo", 2 * STEPS, "--compile", mode))
    assert again.returncode == 0, again.stderr[-3000:]
    hb2 = hb_of(run_dir)
    assert hb2["resumed_from_step"] == hb["global_step"] and hb2["global_step"] >= 2 * STEPS


def test_fp16_with_a_grad_scaler_where_the_gpu_has_no_bf16(monkeypatch) -> None:
    """`--precision auto` on a GPU without bf16 in hardware (a T4, a V100) is fp16 with a
    GradScaler: this GPU has bf16, so the check that decides is answered no."""
    from torch import nn

    from training import optim

    monkeypatch.setattr(optim, "cuda_bf16_native", lambda device: False)
    device = torch.device("cuda")
    precision = optim.Precision(device, "auto", conv=True)
    assert precision.name == "fp16" and precision.scaler is not None
    net = nn.Sequential(nn.Conv2d(4, 8, 8, stride=4), nn.Flatten(), nn.LazyLinear(4)).to(device)
    x = torch.rand(32, 4, 84, 84, device=device)
    net(x)  # materialise the lazy layer before the optimizer sees it
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(5):
        with precision.autocast():
            out = net(x)
            assert out.dtype == torch.float16
            loss = out.float().pow(2).mean()
        norm = precision.step(loss, opt, net.parameters(), 0.5)
        assert torch.isfinite(norm)
    state = precision.state_dict()
    assert state is not None and state["scale"] > 0
    again = optim.Precision(device, "auto", conv=True)
    again.load_state_dict(state)
    assert again.scaler is not None and again.scaler.get_scale() == precision.scaler.get_scale()
    assert all(p.dtype == torch.float32 for p in net.parameters())


def test_fp32_on_cuda_runs_with_tf32() -> None:
    from training.device import setup_torch

    before = torch.get_float32_matmul_precision()
    try:
        setup_torch(torch.device("cuda"), 1)
        assert torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
        a = torch.randn(512, 512, device="cuda")
        assert torch.isfinite(a @ a).all()
    finally:
        torch.set_float32_matmul_precision(before)


# ---- a second process holding the GPU's memory ----------------------------------------------

HOLDER = """
import sys, time, torch
leave = int(float(sys.argv[1]) * 2**20)
free, _ = torch.cuda.mem_get_info()
x = torch.empty(max(0, free - leave), dtype=torch.uint8, device="cuda")
print("held", x.numel() // 2**20, "MiB", flush=True)
time.sleep(900)
"""


@contextlib.contextmanager
def gpu_memory_held(leave_mb: float) -> Iterator[subprocess.Popen[str]]:
    """Another process takes all but `leave_mb` of the GPU's free memory while the block runs."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(leave_mb)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("held"), line
        yield proc
    finally:
        proc.kill()
        proc.wait()


# A minibatch no GPU's leftover 2 GiB holds: 8192 frames of 4x84x84 through the Atari CNN.
OOM_ARGS = ["--num-envs", "64", "--n-steps", "128", "--batch-size", "8192", "--epochs", "1"]


def test_cuda_out_of_memory_is_exit_76_with_its_reason(tmp_path: Path) -> None:
    run_dir = tmp_path / "oom"
    with gpu_memory_held(2048):
        proc = run_worker(
            run_dir, "--algo", "ppo", "--game", GAME, "--device", "cuda", "--precision", "fp32",
            "--total-steps", "100000", "--eval-episodes", "0", *OOM_ARGS,
        )  # fmt: skip
    assert proc.returncode == 76, proc.stderr[-3000:]
    error = json.loads((run_dir / "error.json").read_text())
    assert "out of memory" in json.dumps(error).lower(), error


def gpu_config(tmp: Path, *, head: str = "", modes: str = "", gpu: str = "") -> Path:
    text = (
        'state_dir = "state"\ncheckpoint_every_s = 5\nstop_grace_s = 20\n'
        + head
        + MODES.format(max_concurrent=1)
        + modes
        + f'[[games]]\nname = "breakout"\nenv_id = "{GAME}"\nalgo = "ppo"\n'
        'total_steps = 100000000\nseed = 1\ndevice = "cuda"\nargs = { eval_episodes = 0 }\n'
        "[restart]\nbackoff_base_s = 0.3\nbackoff_max_s = 1\nbudget = 20\n"
        "budget_window_s = 600\nstable_after_s = 30\n"
        "[watchdog]\nstartup_grace_s = 120\nhang_timeout_s = 60\nkill_grace_s = 10\n" + gpu
    )
    path = tmp / "rlsup.toml"
    path.write_text(text)
    return path


def stop(proc: subprocess.Popen[bytes], config: Path, env: dict[str, str]) -> None:
    rlsup("stop", "--config", str(config), env=env, timeout=60)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_the_gate_holds_a_game_while_another_process_holds_the_memory(tmp_path: Path) -> None:
    config = gpu_config(tmp_path, gpu="[gpu]\nmin_free_mb = 20000\npoll_s = 1\ntimeout_s = 600\n")
    env = env_for(tmp_path)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    state = tmp_path / "state"
    with gpu_memory_held(4096):
        sup = start_supervisor(config, env)
        try:
            wait_for(lambda: events(state, "gpu_wait"), 60, "a gpu_wait event")
            time.sleep(3)
            assert heartbeat(state, "breakout") is None  # held: no worker started
            waited = time.monotonic()
            held = True
        except BaseException:
            stop(sup, config, env)
            raise
    try:
        # The holder is gone: the game starts on the next poll, on the GPU.
        hb = wait_for(
            lambda: (h := heartbeat(state, "breakout")) and h["global_step"] > 0 and h,
            120,
            "the game training once the memory is free",
        )
        assert held and time.monotonic() - waited < 120
        assert hb["device"] == "cuda:0"
        status = json.loads(rlsup("status", "--json", "--config", str(config), env=env).stdout)
        game = next(g for g in status["games"] if g["name"] == "breakout")
        assert game["gpu"] and game["gpu"]["uuid"].startswith("GPU-")
        assigned = events(state, "gpu_assigned")
        assert assigned and assigned[-1]["detail"]["uuid"] == game["gpu"]["uuid"], assigned
    finally:
        stop(sup, config, env)


def test_an_oom_under_the_supervisor_names_the_gpu_and_steps_down(tmp_path: Path) -> None:
    heavy = "[modes.heavy]\nnum_envs = 64\nn_steps = 128\nbatch_size = 8192\nmax_concurrent = 1\n"
    config = gpu_config(
        tmp_path,
        head='initial_mode = "heavy"\n',
        modes=heavy,
        gpu="[gpu]\nmin_free_mb = 512\npoll_s = 1\n",
    )
    env = env_for(tmp_path)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    state = tmp_path / "state"
    with gpu_memory_held(2048):
        sup = start_supervisor(config, env)
        try:
            oom = wait_for(lambda: events(state, "worker_oom"), 240, "a worker_oom event")
            down = wait_for(lambda: events(state, "scale_down"), 120, "a scale_down")
        finally:
            stop(sup, config, env)
    assert oom[0]["detail"].get("gpu"), oom[0]
    assert down[0]["detail"], down[0]
