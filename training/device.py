"""The worker's device: which one it trains on (`--device`; asking for cuda where there is none is
refused, naming why), its threads and TF32, what the heartbeat says of the torch build, and
out-of-memory errors however torch spells them (exit 76, not a crash).

Torch at import, so not torchbuild.py's neighbour there: `rlsup status` imports that one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from training import torchbuild
from training.args import ConfigError
from training.oom import oom_kind


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA or host out of memory, however torch or numpy spells it (exit 76, not a crash):
    training.oom's test, which the SDK shares."""
    return oom_kind(exc) is not None


def torch_build(driver: str | None) -> dict[str, Any]:
    """The heartbeat's `torch_build`: what this torch can do, and the host's NVIDIA driver."""
    return {
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "driver": driver,
    }


def pick_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device cuda: {_no_cuda_reason(torchbuild.driver_version())}")
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def _no_cuda_reason(driver: str | None) -> str:
    if driver is not None and torch.version.cuda is None:
        return (
            f"no CUDA device is available: torch {torch.__version__} is a CPU-only build and "
            f"this host has an NVIDIA driver ({driver}); "
            + torchbuild.cuda_install_hint(str(torch.__version__).split("+", 1)[0])
        )
    if driver is None:
        return "no CUDA device is available: no NVIDIA driver on this host (use auto or cpu)"
    return "no CUDA device is available (use auto or cpu; `rlsup doctor` tells why)"


COMPILE_CACHE = "compile-cache"  # under the run directory: what --compile built, kept


def keep_compiled(run_dir: Path) -> Path:
    """`--compile`'s kernels and graphs cached in the game's run directory (private to its
    owner), so that a restart, after a crash or a reboot, loads them instead of compiling again
    (torch's default, a folder under /tmp, is gone after a reboot and shared by every user).
    Set whatever the environment held: torch writes its default into it on first use, so a
    value found there may be torch's own from an earlier compile in the parent process."""
    cache = run_dir / COMPILE_CACHE
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    return cache


def setup_torch(device: torch.device, threads: int) -> None:
    torch.set_num_threads(threads)
    if device.type == "cuda":
        # TF32 matmuls: ~2x on Ampere+ with negligible accuracy loss for RL.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
