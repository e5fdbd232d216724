"""GPU gate: free GPU memory via NVML (nvidia-ml-py); without an NVIDIA driver, a no-op."""

from __future__ import annotations

import contextlib
from typing import Protocol


class GpuProbe(Protocol):
    def free_mb(self) -> float | None:
        """Free memory of the emptiest GPU in MiB, or None when there is no NVIDIA GPU."""


class NvmlProbe:
    """Reads NVML lazily; remembers that there is no driver after the first failure."""

    def __init__(self) -> None:
        self._nvml: object | None = None
        self._absent = False

    def free_mb(self) -> float | None:
        if self._absent:
            return None
        try:
            import pynvml  # type: ignore[import-untyped]

            if self._nvml is None:
                pynvml.nvmlInit()
                self._nvml = pynvml
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                self._absent = True
                return None
            free = [
                pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).free
                for i in range(count)
            ]
            return float(max(free)) / 2**20
        except Exception:
            # No library, no driver, no device: the gate is a no-op on this host.
            self._absent = True
            return None

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()  # type: ignore[attr-defined]
