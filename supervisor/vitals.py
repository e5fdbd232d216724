"""Host vitals: RAM, swap, disk, CPU (psutil) and, where an NVIDIA driver exists, GPUs (NVML).

`VitalsSampler` samples on its own daemon thread so the tick loop never waits on psutil or
NVML; the loop reads `latest()`. Without a driver the GPU part is absent: `NvmlProbe` tries
`nvmlInit` once and remembers the answer. Timestamps are wall-clock (`time.time()`): samples
are persisted and compared with events across reboots.
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

from supervisor.stability import GpuVitals, Vitals

try:  # pure Python: importing it loads no driver (nvmlInit does)
    import pynvml  # type: ignore[import-untyped, unused-ignore]
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    pynvml = None

log = structlog.get_logger("rlsup.vitals")

MB = 1024 * 1024


class NvmlProbe:
    """The NVML seam. Initialises once; without a driver every query answers "no GPU" cheaply.

    Also the real `gpugate.NvmlLike` (it has `free_mb`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checked = False
        self._ok = False
        self.reason = ""

    def available(self) -> bool:
        with self._lock:
            if not self._checked:
                self._checked = True
                self._ok, self.reason = _nvml_init()
                log.info("nvml_probe", available=self._ok, reason=self.reason)
            return self._ok

    def gpus(self) -> tuple[GpuVitals, ...]:
        if not self.available():
            return ()
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            log.warning("nvml_query_failed", error=str(exc))
            return ()
        out = []
        for index in range(count):
            try:
                out.append(_gpu_vitals(index))
            except pynvml.NVMLError as exc:  # e.g. a GPU fallen off the bus
                log.warning("nvml_query_failed", gpu=index, error=str(exc))
        return tuple(out)

    def free_mb(self, index: int) -> float | None:
        """Free memory of GPU `index` in MB; None without a driver or such a GPU."""
        if not self.available():
            return None
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return float(pynvml.nvmlDeviceGetMemoryInfo(handle).free) / MB
        except pynvml.NVMLError as exc:
            log.warning("nvml_query_failed", gpu=index, error=str(exc))
            return None


def _nvml_init() -> tuple[bool, str]:
    if pynvml is None:  # nvidia-ml-py missing: the same as no driver
        return False, "pynvml not importable"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # library not found, driver not loaded, …
        return False, str(exc)
    return True, "ok"


def _optional(query: Callable[[], float]) -> float | None:
    """A reading some GPUs do not support (power, temperature on some boards)."""
    try:
        return float(query())
    except pynvml.NVMLError:
        return None


def _gpu_vitals(index: int) -> GpuVitals:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    util = _optional(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    temp = _optional(lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    power_mw = _optional(lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    return GpuVitals(
        index=index,
        mem_used_mb=float(mem.used) / MB,
        mem_total_mb=float(mem.total) / MB,
        util_pct=math.nan if util is None else util,
        temp_c=math.nan if temp is None else temp,
        power_w=None if power_mw is None else power_mw / 1000.0,
    )


_DEFAULT_PROBE = NvmlProbe()


def sample(
    state_dir: Path, probe: NvmlProbe | None = None, clock: Callable[[], float] = time.time
) -> Vitals:
    """One reading of the host. Cheap: no sleeping (CPU percent is since the previous call).

    GPUs come from `probe` (default: one process-wide probe, so NVML is tried once); `ts`
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
            )
            for g in data.get("gpus", ())
        ),
    )
