"""Which torch build is installed, and is there an NVIDIA driver: answered without importing
torch (stdlib only at import), so the supervisor, `rlsup status` and `rlsup doctor` can ask.

Two sides of one truth:
- the installed build, from torch's distribution metadata (`importlib.metadata`): its local
  version (`+cpu`, `+cu128`) or, without one, whether it ships `libtorch_cuda.so`;
- the driver, from `/proc/driver/nvidia/version` (present whenever the NVIDIA kernel module is
  loaded, containers with the NVIDIA runtime included).

`python -m training.torchbuild` imports torch and prints what it can do as one JSON document
(`rlsup doctor` runs it in a subprocess so that its own process never loads torch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DRIVER_VERSION_PATH = "/proc/driver/nvidia/version"
# Test-only: a file to read instead of /proc/driver/nvidia/version; a missing path means "no
# driver". Lets the tests play a host with an NVIDIA driver on a machine without one.
DRIVER_PATH_ENV = "RLSUP_NVIDIA_DRIVER_PATH"

# Test-only: a file to read instead of /proc/cpuinfo (the CPU's flags: native bf16 or not).
CPUINFO_PATH_ENV = "RLSUP_CPUINFO_PATH"
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 …" and the open
# module's "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build …"
_DRIVER_RE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")

# What docs/gpus.md's install section says; the hints name it.
CUDA_INDEX_EXAMPLE = "https://download.pytorch.org/whl/cu128"


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version ("550.54.14"), "unknown" if its file says none that
    we can read, or None on a host without the driver."""
    path = os.environ.get(DRIVER_PATH_ENV) or DRIVER_VERSION_PATH
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
    except OSError:
        return None
    match = _DRIVER_RE.search(text)
    return match.group(1) if match else "unknown"


def cpu_bf16_native() -> bool:
    """Whether this CPU computes bf16 natively (avx512_bf16 or amx_bf16 in /proc/cpuinfo):
    oneDNN then runs bf16 convolutions and matmuls about twice as fast as fp32. Without them
    bf16 is emulated and slower, so the fast path stays off."""
    path = os.environ.get(CPUINFO_PATH_ENV) or "/proc/cpuinfo"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return not CPU_BF16_FLAGS.isdisjoint(line.split(":", 1)[-1].split())
    except OSError:
        pass
    return False


def resolve_precision(mode: str, device_type: str, conv: bool, cuda_bf16: bool) -> str:
    """What `--precision` MODE runs as: "fp32", "bf16" or "fp16". Torch-free, so that
    `rlsup doctor` says what a worker will pick; `training.optim.Precision` decides by it.

    "auto": on CUDA bf16 where the GPU has it (`cuda_bf16`), else fp16 (with a GradScaler);
    on the CPU bf16 only for a conv net (the Atari CNN) on a CPU with native bf16, where
    oneDNN runs it about twice as fast; fp32 otherwise (tiny MLPs gain nothing, and emulated
    bf16 is slower than fp32). "bf16" is bf16 everywhere, "fp32" fp32."""
    if mode == "fp32":
        return "fp32"
    if device_type == "cuda":
        return "bf16" if mode == "bf16" or cuda_bf16 else "fp16"
    return "bf16" if mode == "bf16" or (conv and cpu_bf16_native()) else "fp32"


@dataclasses.dataclass(frozen=True)
class InstalledTorch:
    """torch as installed, read from its metadata (no import)."""

    version: str | None  # "2.13.0+cpu"; None: torch is not installed
    cuda: bool | None  # built with CUDA kernels; None: unknown (not installed)

    @property
    def public_version(self) -> str | None:
        """The version without its local label ("2.13.0"): what a `torch==` pin names."""
        return None if self.version is None else self.version.split("+", 1)[0]

    def describe(self) -> str:
        if self.version is None:
            return "torch is not installed"
        return f"torch {self.version} ({'CUDA' if self.cuda else 'CPU-only'} build)"


def installed_torch() -> InstalledTorch:
    """The installed torch build: its local version label when it has one (`+cu128` is CUDA;
    `+cpu`, `+rocm…`, `+xpu` are not), else whether the wheel ships `libtorch_cuda.so` (PyPI's
    Linux wheels carry no label and are CUDA builds)."""
    import importlib.metadata  # here: `rlsup status` imports this module and never needs it

    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return InstalledTorch(None, None)
    lib = Path(str(dist.locate_file("torch/lib/libtorch_cuda.so")))
    return build_of(dist.version, lib.exists)


def build_of(version: str, ships_cuda_lib: Callable[[], bool]) -> InstalledTorch:
    """The build a torch version names: its local label, else what its wheel ships."""
    local = version.partition("+")[2]
    if local:
        return InstalledTorch(version, local.startswith("cu"))
    return InstalledTorch(version, ships_cuda_lib())


def cuda_install_hint(torch_version: str | None) -> str:
    """How to get torch's CUDA build: one sentence naming the commands."""
    label = CUDA_INDEX_EXAMPLE.rsplit("/", 1)[1]
    pin = f"torch=={torch_version}+{label}" if torch_version else "torch"
    return (
        "install torch's CUDA build: `make torch` (picks PyTorch's cu12x wheel index from the "
        "CUDA version `nvidia-smi` reports; or `make torch TORCH_INDEX="
        f"{CUDA_INDEX_EXAMPLE}`), or by hand `python -m pip install --index-url "
        f"{CUDA_INDEX_EXAMPLE} {pin}` in rlsup's environment; then `rlsup doctor` says whether "
        "it can use the GPUs"
    )


def cpu_fallback_reason(
    driver: str | None, torch_cuda: bool | None, cuda_available: bool | None = None
) -> str | None:
    """Why a `device = "auto"` worker trains on the CPU of a host with an NVIDIA driver
    ("no CUDA torch", "CUDA unavailable"), or None when nothing is amiss (no driver: the CPU is
    all there is; a CUDA torch that sees a GPU: it is used)."""
    if driver is None:
        return None
    if torch_cuda is False:
        return "no CUDA torch"
    if torch_cuda and cuda_available is False:
        return "CUDA unavailable"
    return None


# ---- the runtime probe: imports torch (run in a subprocess by `rlsup doctor`) ----------------


def runtime_report() -> dict[str, Any]:
    """What the torch in this process can do: versions, CUDA, and each device it sees."""
    import torch

    available = bool(torch.cuda.is_available())
    devices: list[dict[str, Any]] = []
    if available:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                {
                    "index": index,
                    "name": props.name,
                    "uuid": str(getattr(props, "uuid", "") or ""),
                    "capability": f"{props.major}.{props.minor}",
                    "memory_total_mb": round(props.total_memory / 2**20, 1),
                }
            )
    cudnn_ok = torch.backends.cudnn.is_available()  # type: ignore[no-untyped-call]
    cudnn = torch.backends.cudnn.version() if cudnn_ok else None  # type: ignore[no-untyped-call]
    return {
        "version": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "cuda_available": available,
        "device_count": len(devices),
        "arch_list": list(torch.cuda.get_arch_list()) if torch.version.cuda else [],
        "devices": devices,
        "driver": driver_version(),
    }


def main() -> int:
    try:
        report: dict[str, Any] = {"ok": True, **runtime_report()}
    except Exception as exc:  # torch missing or broken: say so, as JSON
        report = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
