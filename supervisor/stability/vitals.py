"""Host vitals: RAM, swap, disk, CPU (psutil) and, where an NVIDIA driver exists, GPUs (NVML).

`VitalsSampler` samples on its own daemon thread so the tick loop never waits on psutil or
NVML; the loop reads `latest()`. The GPU part comes from `gpus.NvmlProbe`, which this thread
alone drives (each reading refreshes its snapshot; a driver not ready yet is tried again with
backoff, a hung call is timed out); without a driver it is absent. Timestamps are wall-clock
(`time.time()`): samples are persisted and compared with events across reboots.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped, unused-ignore]
import structlog

from supervisor.gpu.nvml import NvmlProbe
from supervisor.gpu.vitals import GpuVitals
from supervisor.stability.policy import Vitals

__all__ = ["NvmlProbe", "VitalsSampler", "from_json", "sample", "to_json"]

log = structlog.get_logger("rlsup.vitals")


_DEFAULT_PROBE = NvmlProbe()


def sample(
    state_dir: Path, probe: NvmlProbe | None = None, clock: Callable[[], float] = time.time
) -> Vitals:
    """One reading of the host. Cheap: no sleeping (CPU percent is since the previous call).

    GPUs come from `probe` (default: one process-wide probe), read now; `ts`
    from `clock` (the supervisor passes its step-free clock, the one the policy measures in).
    """
    probe = _DEFAULT_PROBE if probe is None else probe
    vm = psutil.virtual_memory()
    swap = psutil.swap_memory()
    disk = shutil.disk_usage(_existing(state_dir))
    return Vitals(
        ts=clock(),
        ram_available_pct=100.0 * vm.available / vm.total,
        swap_used_pct=float(swap.percent) if swap.total else 0.0,
        disk_free_pct=100.0 * disk.free / disk.total,
        gpus=probe.gpus(),
        cpu_pct=float(psutil.cpu_percent(interval=None)),
        load_1m=float(psutil.getloadavg()[0]),
    )


def _existing(path: Path) -> Path:
    """The state dir, or its nearest existing parent (before the supervisor creates it)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


class VitalsSampler:
    """Samples every `interval_s` on a daemon thread; keeps the latest reading."""

    def __init__(
        self,
        state_dir: Path,
        interval_s: float = 5.0,
        probe: NvmlProbe | None = None,
        sample_fn: Callable[[], Vitals] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.interval_s = interval_s
        self.probe = probe if probe is not None else NvmlProbe()
        self._sample = sample_fn or (lambda: sample(state_dir, self.probe, clock))
        self._latest: Vitals | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="rlsup-vitals", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def latest(self) -> Vitals | None:
        with self._lock:
            return self._latest

    def latest_json(self) -> tuple[float, dict[str, Any]] | None:
        """The latest reading's time and JSON (for the samples history)."""
        latest = self.latest()
        return (latest.ts, to_json(latest)) if latest is not None else None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def sample_once(self) -> Vitals | None:
        try:
            vitals = self._sample()
        except Exception:  # the thread must outlive any one bad reading
            log.exception("vitals_sample_failed")
            return None
        with self._lock:
            self._latest = vitals
        return vitals


# --- the `samples` table: samples(ts REAL, data TEXT JSON) ----------------------------------


def _num(x: float) -> float | None:
    """NaN (an unsupported reading) is not JSON: store null."""
    return None if math.isnan(x) else round(x, 3)


def _nan(x: Any) -> float:
    return math.nan if x is None else float(x)


def to_json(vitals: Vitals) -> dict[str, Any]:
    return {
        "ts": vitals.ts,
        "ram_available_pct": _num(vitals.ram_available_pct),
        "swap_used_pct": _num(vitals.swap_used_pct),
        "disk_free_pct": _num(vitals.disk_free_pct),
        "cpu_pct": _num(vitals.cpu_pct),
        "load_1m": _num(vitals.load_1m),
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "mem_used_mb": _num(g.mem_used_mb),
                "mem_total_mb": _num(g.mem_total_mb),
                "util_pct": _num(g.util_pct),
                "temp_c": _num(g.temp_c),
                "power_w": None if g.power_w is None else _num(g.power_w),
            }
            for g in vitals.gpus
        ],
    }


def from_json(data: dict[str, Any]) -> Vitals:
    return Vitals(
        ts=float(data["ts"]),
        ram_available_pct=_nan(data.get("ram_available_pct")),
        swap_used_pct=_nan(data.get("swap_used_pct")),
        disk_free_pct=_nan(data.get("disk_free_pct")),
        cpu_pct=_nan(data.get("cpu_pct", 0.0)),
        load_1m=_nan(data.get("load_1m", 0.0)),
        gpus=tuple(
            GpuVitals(
                index=int(g["index"]),
                mem_used_mb=_nan(g.get("mem_used_mb")),
                mem_total_mb=_nan(g.get("mem_total_mb")),
                util_pct=_nan(g.get("util_pct")),
                temp_c=_nan(g.get("temp_c")),
                power_w=None if g.get("power_w") is None else float(g["power_w"]),
                uuid=str(g.get("uuid") or ""),
            )
            for g in data.get("gpus", ())
        ),
    )
