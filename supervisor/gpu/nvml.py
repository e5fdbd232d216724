"""NVML's lifecycle: the one object that talks to the driver, from the vitals sampler's thread.

Everything else (the GPU gate, placement, the policy, status) reads `NvmlProbe.latest()`, the
snapshot of the last reading: the tick loop never calls NVML, so a driver call that hangs can
stall the sampler (and only the reading it was taking), never supervision.

- A driver that is not ready (late at boot, reloaded) is tried again with capped exponential
  backoff until it answers; it is never given up on.
- Every NVML call runs on a helper thread and is waited for at most `timeout_s`. A call that
  does not return leaves its thread behind (a C call cannot be cancelled): until it returns,
  no new call is made and every snapshot says `hung`.
- A GPU that fails its query (e.g. `NVMLError_GpuIsLost`, fallen off the bus) is reported in
  `lost` with its index and UUID; the others are read as usual. A failure of the whole library
  (the device count fails) drops the driver: it is initialised again after a backoff.

Each GPU is named by its NVML index AND its UUID (`GPU-…`): an index can change across a
reboot or a driver reload; the UUID cannot.

Test seam (test-only): with `RLSUP_FAKE_NVML=<scenario.json>` in the supervisor's environment,
`ScenarioBackend` reads that file (again at every call, so a test can rewrite it mid-run)
instead of loading NVML. Nothing else reads that variable.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from supervisor.gpu.vitals import GpuVitals

try:  # pure Python: importing it loads no driver (nvmlInit does)
    import pynvml  # type: ignore[import-untyped, unused-ignore]
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    pynvml = None

log = structlog.get_logger("rlsup.gpus")

MB = 1024 * 1024
FAKE_NVML_ENV = "RLSUP_FAKE_NVML"  # test-only: a scenario file instead of the driver
T = TypeVar("T")


# What NVML says when its library is not installed: no NVIDIA driver on this host at all (a
# driver that is installed but not loaded yet says "Driver Not Loaded").
LIBRARY_NOT_FOUND = "NVML Shared Library Not Found"


class NvmlFailure(Exception):
    """An NVML call failed. `lost`: the GPU is gone (fallen off the bus, reset required).
    `absent`: no NVIDIA driver is installed (NVML's library is missing): not a late driver."""

    def __init__(self, message: str, lost: bool = False, absent: bool = False) -> None:
        super().__init__(message)
        self.lost = lost
        self.absent = absent


class NvmlBackend(Protocol):
    """What the probe needs of NVML (pynvml in production, a scenario file in tests)."""

    def init(self) -> None: ...

    def count(self) -> int: ...

    def read(self, index: int) -> GpuVitals:
        """GPU `index`'s reading, uuid included; NvmlFailure when it cannot be read."""
        ...

    def uuid(self, index: int) -> str:
        """Its UUID ("" when even that cannot be read)."""
        ...


@dataclass(frozen=True)
class LostGpu:
    index: int
    uuid: str
    error: str


@dataclass(frozen=True)
class GpuSnapshot:
    """One reading of every GPU. `driver`: NVML answered (initialised and counted)."""

    ts: float  # monotonic, when taken
    driver: bool
    reason: str  # why not, when not ("ok" otherwise)
    gpus: tuple[GpuVitals, ...] = ()
    lost: tuple[LostGpu, ...] = ()
    hung: bool = False  # an NVML call did not return within the timeout
    absent: bool = False  # no NVIDIA driver installed (NVML's library missing): none will come

    def by_uuid(self, uuid: str) -> GpuVitals | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


NO_READING = GpuSnapshot(ts=0.0, driver=False, reason="not read yet")


# --- backends --------------------------------------------------------------------------------


def _failure(exc: Exception) -> NvmlFailure:
    lost = pynvml is not None and isinstance(exc, pynvml.NVMLError_GpuIsLost)
    absent = pynvml is not None and isinstance(exc, pynvml.NVMLError_LibraryNotFound)
    return NvmlFailure(str(exc) or type(exc).__name__, lost=lost, absent=absent)


class PynvmlBackend:
    """The real driver, through nvidia-ml-py."""

    def init(self) -> None:
        if pynvml is None:
            raise NvmlFailure("pynvml not importable")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:  # library not found, driver not loaded, …
            raise _failure(exc) from None

    def count(self) -> int:
        try:
            return int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise _failure(exc) from None

    def uuid(self, index: int) -> str:
        try:
            raw = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
        except pynvml.NVMLError:
            return ""
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def read(self, index: int) -> GpuVitals:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as exc:
            raise _failure(exc) from None
        util = _optional(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        temp = _optional(
            lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        )
        power_mw = _optional(lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
        return GpuVitals(
            index=index,
            mem_used_mb=float(mem.used) / MB,
            mem_total_mb=float(mem.total) / MB,
            util_pct=math.nan if util is None else util,
            temp_c=math.nan if temp is None else temp,
            power_w=None if power_mw is None else power_mw / 1000.0,
            uuid=self.uuid(index),
        )


def _optional(query: Callable[[], float]) -> float | None:
    """A reading some GPUs do not support (power, temperature on some boards)."""
    try:
        return float(query())
    except pynvml.NVMLError:
        return None


class ScenarioBackend:
    """TEST-ONLY: NVML as a JSON scenario file says, re-read at every call.

    `{"init": "ok" | "<error>", "hang_s": 0, "gpus": [{"uuid": "GPU-…", "total_mb": 81920,
    "used_mb": 1024, "temp_c": 40, "util_pct": 0, "lost": false}, …]}`; a GPU's index is its
    position. `hang_s` makes every read sleep that long (a hung driver call)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _scenario(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise NvmlFailure(f"fake NVML scenario unreadable: {exc}") from None
        return data if isinstance(data, dict) else {}

    def init(self) -> None:
        status = self._scenario().get("init", "ok")
        if status != "ok":
            raise NvmlFailure(str(status), absent=status == LIBRARY_NOT_FOUND)

    def count(self) -> int:
        data = self._scenario()
        if data.get("init", "ok") != "ok":
            raise NvmlFailure(str(data["init"]))
        time.sleep(float(data.get("hang_s", 0.0)))
        return len(data.get("gpus", []))

    def _gpu(self, index: int) -> dict[str, Any]:
        gpus = self._scenario().get("gpus", [])
        if index >= len(gpus):
            raise NvmlFailure("Invalid Argument")
        gpu: dict[str, Any] = gpus[index]
        return gpu

    def uuid(self, index: int) -> str:
        return str(self._gpu(index).get("uuid", ""))

    def read(self, index: int) -> GpuVitals:
        g = self._gpu(index)
        if g.get("lost"):
            raise NvmlFailure("GPU is lost", lost=True)
        return GpuVitals(
            index=index,
            mem_used_mb=float(g.get("used_mb", 0.0)),
            mem_total_mb=float(g.get("total_mb", 0.0)),
            util_pct=float(g.get("util_pct", 0.0)),
            temp_c=float(g.get("temp_c", 40.0)),
            power_w=None,
            uuid=str(g.get("uuid", "")),
        )


def default_backend() -> NvmlBackend:
    fake = os.environ.get(FAKE_NVML_ENV)
    if fake:  # test-only seam, see the module docstring
        log.warning("nvml_fake", scenario=fake)
        return ScenarioBackend(Path(fake))
    return PynvmlBackend()


# --- the probe -------------------------------------------------------------------------------


class NvmlHung(Exception):
    """An NVML call did not return within the timeout (or an earlier one still has not)."""


@dataclass
class _Caller:
    """Runs one NVML call at a time on a helper thread, waiting at most `timeout_s`."""

    timeout_s: float
    _busy: threading.Thread | None = field(default=None, repr=False)

    def __call__(self, fn: Callable[[], T]) -> T:
        if self._busy is not None and self._busy.is_alive():
            raise NvmlHung("an earlier NVML call has not returned")
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # carried back to the caller
                box["error"] = exc

        thread = threading.Thread(target=run, name="rlsup-nvml-call", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            self._busy = thread
            raise NvmlHung(f"NVML call did not return within {self.timeout_s:g}s")
        if "error" in box:
            raise box["error"]
        value: T = box["value"]
        return value


class NvmlProbe:
    """NVML for the supervisor. `refresh()` talks to the driver (the sampler thread only);
    `latest()`, `free_mb()` and `available()` read the last snapshot (any thread, no NVML).

    Also the real `gpugate.NvmlLike` (it has `free_mb`)."""

    def __init__(
        self,
        backend: NvmlBackend | None = None,
        *,
        timeout_s: float = 10.0,
        retry_base_s: float = 1.0,
        retry_max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._call = _Caller(timeout_s)
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self.clock = clock
        self._lock = threading.Lock()
        self._initialised = False
        self._retry_s = retry_base_s
        self._next_init = 0.0
        self._latest = NO_READING
        self.reason = ""
        self._absent = False  # the last init found no NVIDIA driver installed

    @property
    def backend(self) -> NvmlBackend:
        if self._backend is None:
            self._backend = default_backend()
        return self._backend

    # ---- readers (no NVML) ------------------------------------------------------------------

    def latest(self) -> GpuSnapshot:
        with self._lock:
            return self._latest

    def available(self) -> bool:
        """NVML answered at the last reading."""
        return self.latest().driver

    def free_mb(self, index: int) -> float | None:
        """Free memory of GPU `index` in MB at the last reading; None without a driver or
        such a (readable) GPU."""
        gpu = next((g for g in self.latest().gpus if g.index == index), None)
        return None if gpu is None else gpu.mem_free_mb

    # ---- the sampler thread's side ----------------------------------------------------------

    def gpus(self) -> tuple[GpuVitals, ...]:
        """Read every GPU now (NVML): the vitals sampler's call."""
        return self.refresh().gpus

    def refresh(self) -> GpuSnapshot:
        now = self.clock()
        snap = self._read(now)
        with self._lock:
            before, self._latest = self._latest, snap
        self.reason = snap.reason
        if (before.driver, before.hung) != (snap.driver, snap.hung) or before is NO_READING:
            log.info("nvml_probe", available=snap.driver, hung=snap.hung, reason=snap.reason,
                     gpus=[g.uuid or g.index for g in snap.gpus])  # fmt: skip
        for lost in snap.lost:
            if all(x.uuid != lost.uuid or x.index != lost.index for x in before.lost):
                log.warning("nvml_gpu_lost", gpu=lost.index, uuid=lost.uuid, error=lost.error)
        return snap

    def _read(self, now: float) -> GpuSnapshot:
        try:
            if not self._initialised:
                if now < self._next_init:
                    why = self.reason or "NVML not initialised"
                    return GpuSnapshot(now, False, why, absent=self._absent)
                self._init(now)
            return self._read_all(now)
        except NvmlHung as exc:
            return GpuSnapshot(now, self._initialised, str(exc), hung=True)
        except NvmlFailure as exc:
            self._drop(now, str(exc))
            return GpuSnapshot(now, False, str(exc), absent=exc.absent)

    def _init(self, now: float) -> None:
        try:
            self._call(self.backend.init)
        except NvmlFailure as exc:
            self._absent = exc.absent
            self._next_init = now + self._retry_s
            self._retry_s = min(self.retry_max_s, self._retry_s * 2)
            why = f"{exc} (next try in {self._next_init - now:.0f}s)"
            raise NvmlFailure(why, absent=exc.absent) from None
        self._initialised = True
        self._absent = False
        self._retry_s = self.retry_base_s

    def _drop(self, now: float, why: str) -> None:
        """The library failed as a whole: initialise again later."""
        if self._initialised:
            log.warning("nvml_failed", error=why)
            self._initialised = False
            self._next_init = now + self._retry_s

    def _read_all(self, now: float) -> GpuSnapshot:
        count = self._call(self.backend.count)
        gpus, lost = [], []
        for index in range(count):
            try:
                gpus.append(self._call(lambda i=index: self.backend.read(i)))  # type: ignore[misc]
            except NvmlFailure as exc:  # e.g. a GPU fallen off the bus: the others go on
                uuid = self._call(lambda i=index: self.backend.uuid(i))  # type: ignore[misc]
                lost.append(LostGpu(index, uuid, str(exc)))
        return GpuSnapshot(now, True, "ok", tuple(gpus), tuple(lost))
