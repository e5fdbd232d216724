"""What a benchmark ran on: every benchmark's JSON carries `host` (and prints it as its first line).

Numerics and speed differ between CPUs (AMX, AVX-512 or AVX2 for bf16; the core count), and the
CPU model of this project's machines changes between sessions: a figure is compared only with
figures that name the same CPU. oneDNN's ISA is what its kernels dispatch to (ONEDNN_VERBOSE
prints it once a primitive runs), asked in a child process so that a benchmark which does not
import torch stays torch-free.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import cache
from typing import Any

_PROBE = """
import torch
from torch.utils import mkldnn
conv = mkldnn.to_mkldnn(torch.nn.Conv2d(1, 1, 1))
conv(torch.zeros(1, 1, 2, 2).to_mkldnn())
print("capability:" + torch.backends.cpu.get_cpu_capability(), flush=True)
"""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_bf16_flags() -> list[str]:
    """The CPU's native bf16 flags (avx512_bf16, amx_bf16, ...), empty where it has none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return sorted(w for w in line.split(":", 1)[1].split() if "bf16" in w)
    except OSError:
        pass
    return []


def gpu_models() -> list[str]:
    """Each NVIDIA GPU as `nvidia-smi` names it, with its driver; empty where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def _torch_isas() -> tuple[str | None, str | None]:
    """(oneDNN's ISA, ATen's CPU capability), or None each where torch cannot say."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env={**os.environ, "ONEDNN_VERBOSE": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    isa = capability = None
    for line in out.splitlines():
        if ",info,cpu,isa:" in line:
            isa = line.split(",info,cpu,isa:", 1)[1].strip()
        elif line.startswith("capability:"):
            capability = line.split(":", 1)[1].strip()
    return isa, capability


@cache
def host_facts() -> dict[str, Any]:
    isa, capability = _torch_isas()
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_bf16_flags": cpu_bf16_flags(),
        "onednn_isa": isa,
        "torch_cpu_capability": capability,
        "machine": platform.machine(),
        "gpus": gpu_models(),
    }


def host_line() -> str:
    h = host_facts()
    bf16 = ", ".join(h["cpu_bf16_flags"]) or "no native bf16"
    gpus = "; GPU " + " + ".join(h["gpus"]) if h["gpus"] else ""
    return (
        f"host: {h['cpu_model']}, {h['cpu_count']} cores; oneDNN ISA {h['onednn_isa']}, "
        f"ATen {h['torch_cpu_capability']}; {bf16}{gpus}"
    )


if __name__ == "__main__":
    import json

    print(host_line())
    print(json.dumps(host_facts()))
