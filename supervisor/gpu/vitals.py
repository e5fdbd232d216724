"""One GPU's reading, as NVML gives it: what the probe produces and every reader (the gate,
placement, the stability policy, status) consumes. It lives with the GPUs, under the policy,
so the policy reads GPUs and the GPUs never read the policy."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuVitals:
    index: int
    mem_used_mb: float
    mem_total_mb: float
    util_pct: float
    temp_c: float
    power_w: float | None
    uuid: str = ""
    """NVML's `GPU-…` UUID: what names the GPU across reboots ("" when unreadable)."""

    @property
    def mem_free_mb(self) -> float:
        return self.mem_total_mb - self.mem_used_mb
