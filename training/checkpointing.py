"""Checkpoint a learner (and its replay buffer) into the store without stalling training.

What the training loop pays for is a consistent capture: the learner's tensors copied into host
buffers kept from one checkpoint to the next (a memcpy per tensor; from a GPU, an asynchronous
copy into pinned memory that the writer waits for) and an O(1) copy-on-write snapshot of the
replay buffer. Serialising that copy (torch.save: pickling, the zip records and their CRCs, the
bulk of the cost: 20-100 ms for an Atari learner here) and writing, fsyncing and committing it
happen on a background thread while training goes on. The file is the same `learner.pt` a
synchronous save writes.

A capture that would not fit in the memory left (the copies and the serialised blob beside the
live learner) is not attempted: the checkpoint is taken synchronously, serialising straight from
the learner, and says so (`checkpoint_sync_fallback`).
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import io
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
import torch

from checkpoints import CheckpointStore, CheckpointWriteFailed, LoadedCheckpoint
from checkpoints.errors import PlacementFenced
from checkpoints.retention import EVAL_META
from training import rng
from training.args import WorkerConfig

if TYPE_CHECKING:
    from training.learner import Learner
    from training.replay import ReplayBuffer

REPLAY_META = "replay/meta.json"
LEARNER_FILE = "learner.pt"
STATE_FILE = "state.json"
CONFIG_FILE = "config.json"


@dataclasses.dataclass(frozen=True)
class CheckpointResult:
    step: int
    ok: bool
    pause_s: float  # how long the training loop was blocked
    seconds: float  # capture to commit
    bytes_written: int = 0
    bytes_linked: int = 0
    error: str | None = None
    # Base files that no longer matched their bytes when about to be linked (rewritten).
    bad_bases: tuple[str, ...] = ()
    fenced: bool = False  # refused: the game was placed on another host since
    captured_at: float = 0.0  # when the state was captured (Unix seconds)
    # Why this checkpoint was taken synchronously instead of in the background (memory).
    sync_fallback: str | None = None
    # CPU seconds the write took on its own thread (serialise, hash, compare, write, fsync):
    # on a host whose cores are all training, what the checkpoint takes from training besides
    # the pause (on the synchronous path it is part of the pause).
    cpu_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Capture:
    """Everything one checkpoint holds, taken at one instant of the training loop."""

    step: int
    learner_blob: bytes | None  # serialised in the loop (the synchronous path), or
    counters: dict[str, Any]
    replay: ReplayBuffer | None
    replay_snapshot: Any
    started: float
    evaluation: dict[str, Any] | None = None  # the evaluation of this very step, if any
    captured_at: float = 0.0  # Unix seconds: what a checkpoint request is compared with
    # ... copied into host buffers, serialised by the writer thread (the background path).
    learner_state: dict[str, Any] | None = None
    copied: Any = None  # a CUDA event the copies are done at (None: they are done)

    def learner_bytes(self) -> bytes | memoryview:
        if self.learner_blob is not None:
            return self.learner_blob
        assert self.learner_state is not None
        if self.copied is not None:
            self.copied.synchronize()
        return _serialise(self.learner_state)


def _serialise(state: dict[str, Any]) -> memoryview:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getbuffer()


def serialise_learner(learner: Learner) -> bytes:
    """The learner's state and the RNGs as `learner.pt` holds them (the synchronous path)."""
    buf = io.BytesIO()
    torch.save({"learner": learner.state_dict(), "rng": rng.capture()}, buf)
    return buf.getvalue()


# Memory a capture must leave free (the loop allocates as it trains), and a seam for tests:
# RLSUP_FAULT_MEM_AVAILABLE=<bytes> stands in for what the kernel says is available.
MEMORY_MARGIN_BYTES = 64 << 20
MEM_AVAILABLE_ENV = "RLSUP_FAULT_MEM_AVAILABLE"
# A seam for tests: RLSUP_FAULT_CHECKPOINT_WRITE_S=<seconds> holds every write that long before
# it commits, as a slow disk would (whether a checkpoint falls due while one is written must not
# depend on how fast the test machine's disk is).
WRITE_DELAY_ENV = "RLSUP_FAULT_CHECKPOINT_WRITE_S"


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable, capped by its cgroup's limit (v2);
    None when neither can be read (then a capture is not refused)."""
    forced = os.environ.get(MEM_AVAILABLE_ENV)
    if forced:
        return int(forced)
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            rel = f.readline().strip().split(":", 2)[-1]
        cg = "/sys/fs/cgroup" + rel
        with open(f"{cg}/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        if limit != "max":
            with open(f"{cg}/memory.current", encoding="ascii") as f:
                found.append(int(limit) - int(f.read().strip()))
    except (OSError, ValueError, IndexError):
        pass
    return min(found) if found else None


def _dense(t: torch.Tensor) -> bool:
    """Does `t` fill its span of memory exactly (a memcpy of its bytes is the tensor)?"""
    if t.is_conj() or t.is_neg() or t.layout != torch.strided:
        return False
    return t.is_contiguous() or (
        t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    )


class HostCopies:
    """Host copies of a state dict's tensors, kept from one capture to the next (at most one
    checkpoint is in flight, so one set serves every checkpoint): a capture is one copy per
    tensor, no allocation once warm. Containers are rebuilt and anything else deep-copied, so the
    loop may change its own state the moment capture returns."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self.cuda = False  # the last copy read from a GPU (asynchronously)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    @staticmethod
    def tensor_bytes(obj: Any) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        if isinstance(obj, dict):
            return sum(HostCopies.tensor_bytes(v) for v in obj.values())
        if isinstance(obj, list | tuple):
            return sum(HostCopies.tensor_bytes(v) for v in obj)
        return 0

    def copy(self, obj: Any, path: tuple[Any, ...] = ()) -> Any:
        if path == ():
            self.cuda = False
        if isinstance(obj, torch.Tensor):
            return self._copy_tensor(obj, path)
        if isinstance(obj, dict):
            return {k: self.copy(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.copy(v, (*path, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(self.copy(v, (*path, i)) for i, v in enumerate(obj))
        if obj is None or isinstance(obj, str | int | float | bool):
            return obj
        return copy.deepcopy(obj)

    def _copy_tensor(self, t: torch.Tensor, path: tuple[Any, ...]) -> torch.Tensor:
        t = t.detach()
        buf = self._buffers.get(path)
        if (
            buf is None
            or buf.shape != t.shape
            or buf.dtype != t.dtype
            or (t.device.type == "cpu" and buf.stride() != t.stride())
        ):
            if t.device.type == "cuda":
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            else:
                buf = torch.empty_like(t, device="cpu")  # the same strides (channels_last)
            self._buffers[path] = buf
        if t.device.type == "cuda":
            self.cuda = True
            buf.copy_(t, non_blocking=True)
        elif t.device.type == "cpu" and _dense(t) and buf.stride() == t.stride():
            # One memcpy on this thread: `copy_` splits a large tensor over torch's intra-op
            # threads, and with the other cores busy (the envs, another worker) waiting for
            # them made the copy 40 ms instead of 1.5 ms (median, a 27 MB DQN state).
            ctypes.memmove(buf.data_ptr(), t.data_ptr(), t.numel() * t.element_size())
        else:
            buf.copy_(t)
        return buf


def checkpoint_meta(cfg: WorkerConfig) -> dict[str, Any]:
    """What a checkpoint was trained for (MANIFEST.json `meta`): a run is tied to its game."""
    return {"game": cfg.game, "algo": cfg.algo}


def restore_learner(
    loaded: LoadedCheckpoint, learner: Learner, device: torch.device
) -> dict[str, Any]:
    """Load learner state + RNGs (weights only: no code runs) and return the saved counters.

    Replay chunks listed in `loaded.damaged` are left out of the buffer (see
    training/replay_load.py); everything else is restored exactly."""
    with loaded.open(LEARNER_FILE) as f:
        blob = torch.load(f, map_location=device, weights_only=True)
    learner.load_state_dict(blob["learner"])
    rng.restore(blob["rng"])
    counters: dict[str, Any] = loaded.read_json(STATE_FILE)
    if REPLAY_META in loaded.files():
        from training.replay_load import load_buffer

        learner.replay = load_buffer(loaded)
    return counters


class Checkpointer:
    """At most one checkpoint in flight; failures are reported, never raised into training."""

    def __init__(
        self,
        store: CheckpointStore,
        cfg: WorkerConfig,
        log: structlog.stdlib.BoundLogger,
        on_result: Callable[[CheckpointResult], None],
        fence: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.log = log
        self.on_result = on_result
        self.fence = fence  # raises PlacementFenced when this placement may no longer commit
        self.write_delay_s = float(os.environ.get(WRITE_DELAY_ENV) or 0)
        self._thread: threading.Thread | None = None
        self.last_result: CheckpointResult | None = None
        self._copies = HostCopies()
        self._deferred = False  # one fell due while another was written (logged once)
        self._step = -1  # the step of the checkpoint taken last
        # The latest evaluation ({"step", "mean", "episodes"}): a checkpoint captured at its
        # step records it in its manifest's meta (`eval`), which retention's keep_best ranks.
        self.evaluation: dict[str, Any] | None = None

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def capture(
        self, learner: Learner, counters: dict[str, Any], background: bool = False
    ) -> Capture:
        """The checkpoint's content as of now. `background`: the learner's tensors copied into
        host buffers for the writer thread to serialise; else serialised here and now."""
        started, captured_at = time.monotonic(), time.time()
        state, event = None, None
        blob: bytes | None = None
        if background:
            state = self._copies.copy({"learner": learner.state_dict(), "rng": rng.capture()})
            if self._copies.cuda:
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record()
        else:
            blob = serialise_learner(learner)
        replay = getattr(learner, "replay", None)
        snapshot = replay.begin_snapshot() if replay is not None else None
        step = learner.global_step
        ev = self.evaluation
        at_step = dict(ev) if ev is not None and ev.get("step") == step else None
        return Capture(
            step, blob, dict(counters), replay, snapshot, started, at_step, captured_at,
            learner_state=state, copied=event,
        )  # fmt: skip

    def memory_shortfall(self, learner: Learner) -> str | None:
        """Why a background capture would not fit in memory now (None: it fits). It needs the
        host copies (unless already held from an earlier one), the serialised blob (about as
        large), and two replay chunks (the writer's scratch and a copy-on-write copy)."""
        available = available_memory()
        if available is None:
            return None
        held = self._copies.nbytes  # the state's size once a capture was taken
        size = held or HostCopies.tensor_bytes(learner.state_dict())
        need = size if held else 2 * size
        replay = getattr(learner, "replay", None)
        if replay is not None:
            need += 2 * int(replay.nbytes) // max(1, int(replay.num_chunks))
        if need + MEMORY_MARGIN_BYTES <= available:
            return None
        return (
            f"a background capture needs {need} bytes (host copies of the learner's "
            f"{size} bytes of tensors and their serialised form) and {MEMORY_MARGIN_BYTES} "
            f"bytes must stay free, but {available} bytes are available"
        )

    def save_async(self, learner: Learner, counters: dict[str, Any]) -> bool:
        """Capture now and write in the background; False (nothing taken) while one is in
        flight: the caller asks again (the training loop does, every iteration, until it is
        taken). A capture that would not fit in memory is taken synchronously instead."""
        if self.in_flight:
            if not self._deferred:  # once per write in flight: the loop asks every iteration
                self._deferred = True
                self.log.info(
                    "checkpoint_deferred", step=learner.global_step, in_flight_step=self._step
                )
            return False
        self._deferred = False
        self._step = learner.global_step
        shortfall = self.memory_shortfall(learner)
        if shortfall is not None:
            self.log.warning("checkpoint_sync_fallback", step=learner.global_step, reason=shortfall)
            cap = self.capture(learner, counters)
            self._write(cap, pause_s=None, sync_fallback=shortfall)
            return True
        cap = self.capture(learner, counters, background=True)
        pause_s = time.monotonic() - cap.started
        self._thread = threading.Thread(
            target=self._write, args=(cap, pause_s), name="checkpoint", daemon=True
        )
        self._thread.start()
        return True

    def save_sync(self, learner: Learner, counters: dict[str, Any]) -> CheckpointResult:
        self.wait()
        cap = self.capture(learner, counters)
        return self._write(cap, pause_s=None)

    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _write(
        self, cap: Capture, pause_s: float | None, sync_fallback: str | None = None
    ) -> CheckpointResult:
        cpu0 = time.thread_time()
        meta = checkpoint_meta(self.cfg)
        if self.cfg.epoch:
            meta["epoch"] = self.cfg.epoch  # which placement wrote it (several hosts)
        if cap.evaluation is not None:
            meta[EVAL_META] = cap.evaluation
        try:
            with self.store.begin(cap.step, meta) as writer:
                writer.write_bytes(LEARNER_FILE, cap.learner_bytes())
                writer.write_json(STATE_FILE, cap.counters)
                writer.write_json(CONFIG_FILE, self.cfg.to_json())
                if cap.replay is not None:
                    cap.replay.save(writer, cap.replay_snapshot)
                if self.write_delay_s > 0:
                    time.sleep(self.write_delay_s)  # the test seam above: a slow disk
                if self.fence is not None:
                    self.fence()  # the last moment before the rename: abort, not commit
                writer.commit()
            if cap.replay is not None:
                cap.replay.mark_committed(cap.replay_snapshot, cap.step)
            seconds = time.monotonic() - cap.started
            result = CheckpointResult(
                step=cap.step,
                ok=True,
                pause_s=seconds if pause_s is None else pause_s,
                seconds=seconds,
                bytes_written=writer.stats.bytes_written,
                bytes_linked=writer.stats.bytes_linked,
                bad_bases=tuple(writer.stats.bad_bases),
                captured_at=cap.captured_at,
            )
        except PlacementFenced as exc:
            result = dataclasses.replace(self._failed(cap, pause_s, exc), fenced=True)
        except (CheckpointWriteFailed, OSError) as exc:
            result = self._failed(cap, pause_s, exc)
        except Exception as exc:  # a bug must not take training down with it
            self.log.exception("checkpoint_bug", step=cap.step)
            result = self._failed(cap, pause_s, exc)
        finally:
            if cap.replay_snapshot is not None:
                cap.replay_snapshot.release()  # idempotent; stops copy-on-write
        result = dataclasses.replace(result, cpu_s=time.thread_time() - cpu0)
        if sync_fallback is not None:
            result = dataclasses.replace(result, sync_fallback=sync_fallback)
        self.last_result = result
        self.on_result(result)
        return result

    def _failed(self, cap: Capture, pause_s: float | None, exc: BaseException) -> CheckpointResult:
        seconds = time.monotonic() - cap.started
        reason = f"{type(exc).__name__}: {exc}"
        return CheckpointResult(
            step=cap.step,
            ok=False,
            pause_s=seconds if pause_s is None else pause_s,
            seconds=seconds,
            error=reason,
            captured_at=cap.captured_at,
        )
