"""Checkpoint a learner (and its replay buffer) into the store without stalling training.

What the training loop pays for is a consistent capture: the learner's state serialised in memory
(small: networks and optimizer) and an O(1) copy-on-write snapshot of the replay buffer. The
bytes reach the disk from a background thread while training goes on.
"""

from __future__ import annotations

import dataclasses
import io
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


@dataclasses.dataclass(frozen=True)
class Capture:
    """Everything one checkpoint holds, taken at one instant of the training loop."""

    step: int
    learner_blob: bytes
    counters: dict[str, Any]
    replay: ReplayBuffer | None
    replay_snapshot: Any
    started: float
    evaluation: dict[str, Any] | None = None  # the evaluation of this very step, if any
    captured_at: float = 0.0  # Unix seconds: what a checkpoint request is compared with


def serialise_learner(learner: Learner) -> bytes:
    buf = io.BytesIO()
    torch.save({"learner": learner.state_dict(), "rng": rng.capture()}, buf)
    return buf.getvalue()


def checkpoint_meta(cfg: WorkerConfig) -> dict[str, Any]:
    """What a checkpoint was trained for (MANIFEST.json `meta`): a run is tied to its game."""
    return {"game": cfg.game, "algo": cfg.algo}


def restore_learner(
    loaded: LoadedCheckpoint, learner: Learner, device: torch.device
) -> dict[str, Any]:
    """Load learner state + RNGs (weights only: no code runs) and return the saved counters.

    Replay chunks listed in `loaded.damaged` are left out of the buffer (see
    ReplayBuffer.load); everything else is restored exactly."""
    with loaded.open(LEARNER_FILE) as f:
        blob = torch.load(f, map_location=device, weights_only=True)
    learner.load_state_dict(blob["learner"])
    rng.restore(blob["rng"])
    counters: dict[str, Any] = loaded.read_json(STATE_FILE)
    if REPLAY_META in loaded.files():
        from training.replay import ReplayBuffer

        learner.replay = ReplayBuffer.load(loaded)
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
        self._thread: threading.Thread | None = None
        self.last_result: CheckpointResult | None = None
        # The latest evaluation ({"step", "mean", "episodes"}): a checkpoint captured at its
        # step records it in its manifest's meta (`eval`), which retention's keep_best ranks.
        self.evaluation: dict[str, Any] | None = None

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def capture(self, learner: Learner, counters: dict[str, Any]) -> Capture:
        started, captured_at = time.monotonic(), time.time()
        blob = serialise_learner(learner)
        replay = getattr(learner, "replay", None)
        snapshot = replay.begin_snapshot() if replay is not None else None
        step = learner.global_step
        ev = self.evaluation
        at_step = dict(ev) if ev is not None and ev.get("step") == step else None
        return Capture(step, blob, dict(counters), replay, snapshot, started, at_step, captured_at)

    def save_async(self, learner: Learner, counters: dict[str, Any]) -> bool:
        if self.in_flight:
            return False
        cap = self.capture(learner, counters)
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

    def _write(self, cap: Capture, pause_s: float | None) -> CheckpointResult:
        meta = checkpoint_meta(self.cfg)
        if self.cfg.epoch:
            meta["epoch"] = self.cfg.epoch  # which placement wrote it (several hosts)
        if cap.evaluation is not None:
            meta[EVAL_META] = cap.evaluation
        try:
            with self.store.begin(cap.step, meta) as writer:
                writer.write_bytes(LEARNER_FILE, cap.learner_blob)
                writer.write_json(STATE_FILE, cap.counters)
                writer.write_json(CONFIG_FILE, self.cfg.to_json())
                if cap.replay is not None:
                    cap.replay.save(writer, cap.replay_snapshot)
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
