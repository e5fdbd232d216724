"""`rlsup.attach()` and the `Run` it returns: a user's script's side of the contract with the
supervisor (docs/own-trainer.md). Levels, each opted into by calling it:

- L1 `heartbeat(step, **metrics)`: `<run_dir>/heartbeat.json` in the worker's schema (a thread
  keeps `seq` moving; the supervisor judges progress by `step`), and `progress.csv` rows;
- L2 `latest()`, `checkpoint(step)`, `save_arrays()` / `load_arrays()`: the checkpoint store the
  built-in learners use (atomic commit, sha256 manifest, retention, newest-corrupt -> previous),
  with large arrays chunked and hard-linked from the previous checkpoint when unchanged;
- L3 `should_stop()` / `should_checkpoint()` / `exit_stopped()`: SIGTERM becomes a flag, the
  interval and the supervisor's requests become one question;
- L4 `knobs`: the mode's num_envs / batch size, for a game whose config lists the knobs it honours;
  `params`: the game's declared hyper-parameters (`RLSUP_PARAMS`);
- `evaluation(step, mean_return, ...)`: an evaluation, recorded as rlsup's own worker records
  one (rlsup/_evaluation.py).

This module is the run's life: `Run`, its heartbeats, the stop and checkpoint questions,
`close()`. `attach()` and the run directory are rlsup/_attach.py's, the checkpoint block's
commit rlsup/_commit.py's, the arrays (and the damage a load finds in them) rlsup/_arrays.py's,
the exceptions rlsup/_errors.py's; `rlsup` and rlsup.sb3 import them all from here.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from checkpoints import CheckpointError, CheckpointStore, CheckpointWriter, LoadedCheckpoint
from checkpoints import NoValidCheckpoint as _StoreNoValid
from checkpoints._log import StdlibLogger
from checkpoints.errors import CheckpointUnreadable
from rlsup import _arrays, _commit, _damage, _evaluation, _exits, _fence
from rlsup._arrays import DEFAULT_CHUNK_BYTES, LOADING_DEADLINE_S
from rlsup._attach import attach, env_int, make_run_dir, take_lock
from rlsup._errors import (
    ArrayDamaged,
    CheckpointFailed,
    NoValidCheckpoint,
    RunDirLocked,
    SdkError,
    say,
)
from training import protocol as P
from training.checkpoint_request import CheckpointRequestWatch
from training.heartbeat import HeartbeatWriter, initial_heartbeat
from training.progress import ProgressLog
from training.protocol import ExitCode, Phase

if TYPE_CHECKING:
    import numpy as np

# What the SDK's other modules import from here (attach and the exceptions live next door).
__all__ = [
    "ArrayDamaged",
    "CheckpointFailed",
    "NoValidCheckpoint",
    "Run",
    "RunDirLocked",
    "SdkError",
    "attach",
]

RETRY_FAILED_CHECKPOINT_S = 60.0
PROGRESS_EVERY_S = 10.0
APPLY_EVERY_S = 0.05  # heartbeat() fields (metrics, returns) taken at most this often


class Run:
    """One training run's link to rlsup. Make it with `rlsup.attach()`."""

    def __init__(
        self,
        run_dir: Path,
        *,
        supervised: bool,
        game: str,
        seed: int | None,
        resume_count: int,
        mode: str | None,
        knobs: dict[str, Any],
        total_steps: int,
        checkpoint_every_s: float,
        checkpoint_every_steps: int | None,
        keep: int,
        heartbeat_at_once: bool,
        step_deadline_s: float,
        handle_signals: bool,
        exit_on_stop: bool,
        algo: str,
        device: str,
        lock_wait_s: float = 10.0,
        params: dict[str, Any] | None = None,
        keep_best: int = 0,
        host_mtbf_s: float | None = None,
    ) -> None:
        if checkpoint_every_steps is not None and checkpoint_every_steps < 1:
            raise SdkError(f"checkpoint_every_steps={checkpoint_every_steps}: must be >= 1")
        self.run_dir = run_dir
        self.supervised = supervised
        self.game = game
        self.seed = seed
        self.resume_count = resume_count
        self.mode = mode
        self.knobs = knobs
        self.params: dict[str, Any] = dict(params or {})  # the game's declared `params`
        self.total_steps = total_steps
        self.checkpoint_every_s = checkpoint_every_s
        self.checkpoint_every_steps = checkpoint_every_steps
        self.step_deadline_s = step_deadline_s
        self.exit_on_stop = exit_on_stop
        self._algo, self._device = algo, device
        self._closed = False
        # Several hosts: the placement's fence (RLSUP_EPOCH); none on one host, or standalone.
        epoch = (env_int(P.EPOCH_ENV, 0) or 0) if supervised else 0
        if epoch < 0:
            raise SdkError(f"environment variable {P.EPOCH_ENV}={epoch}: must be >= 0")
        self._fence = _fence.Fence.from_env(game, epoch, say) if supervised else None
        self._mirror_restore = _fence.mirror_restore_from_env() if supervised else None
        make_run_dir(run_dir)
        self._lock_fd = take_lock(run_dir, lock_wait_s)
        # A library's logger (the user's logging configuration decides), never structlog's:
        # it prints to stdout unless configured, and may not be installed at all.
        try:
            self.store = CheckpointStore(
                run_dir / P.CHECKPOINT_DIR,
                keep=keep,
                keep_best=keep_best,
                log=StdlibLogger("rlsup.checkpoints"),
            )
        except ValueError as exc:
            os.close(self._lock_fd)
            raise SdkError(f"rlsup.attach(): {exc}") from None
        self.store.sweep()  # staging dirs of a predecessor killed mid-checkpoint
        self._loaded: LoadedCheckpoint | None = None
        self._looked = False
        self._lost_rows: dict[str, list[tuple[int, int]]] = {}  # array -> rows lost on load
        self._damage_reports: list[dict[str, Any]] = []  # the heartbeat's replay_damage
        self.resumed_from_step: int | None = None
        self.last_checkpoint_step: int | None = None
        self.last_checkpoint_time: float | None = None  # wall clock of the last commit
        self.last_save_stats: dict[str, Any] | None = None
        self._last_attempt_mono = time.monotonic()
        self._began_mono: float | None = None  # the open checkpoint block's start
        # The host's MTBF (RLSUP_HOST_MTBF_S): the interval shortens by Young's rule, on an
        # assumed cost until a block's is measured, then paced by that cost (_attempted).
        self._host_mtbf_s = host_mtbf_s
        self._interval_s = P.checkpoint_interval_s(
            checkpoint_every_s, cost_s=P.ASSUMED_CHECKPOINT_COST_S, mtbf_s=host_mtbf_s
        )
        self._last_failed = False
        self._writer: CheckpointWriter | None = None
        self._base_step: int | None = None
        self._stop_reason: str | None = None
        self._evaluated: dict[str, Any] | None = None  # the newest evaluation (checkpoint meta)
        self._evaluating_since: float | None = None  # inside `with run.evaluating():`
        # The supervisor (through any wrapper: `sh -c`, `uv run`, `torchrun`), when it says.
        self._parent = (
            P.ParentWatch.from_env() if supervised and os.environ.get(P.PARENT_PID_ENV) else None
        )
        self._hb: HeartbeatWriter | None = None
        self._training = False
        self._step = 0
        self._applied_at = -math.inf
        self._progress: ProgressLog | None = None
        self._progress_at = -math.inf
        self._started_wall = time.time()
        self._captured_at = 0.0  # when the open checkpoint block began (its state's time)
        # `checkpoint.request` as rlsup's learners see it: one commit per request, reported in
        # the heartbeat when seen and when served (the supervisor waits for `committed`).
        # Looked at every 50 ms at most: a stat at every step was 4 % of a CartPole loop.
        self._requests = CheckpointRequestWatch(run_dir, False, None, self._on_request_report)
        self._request_report: dict[str, Any] | None = None
        self._old_handlers: dict[int, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        if heartbeat_at_once:
            self._start_heartbeat()
        self._unhook = _exits.install_excepthook(self)  # what it lets escape, told as a worker
        atexit.register(self.close)  # a script that just returns still publishes its last step

    # ---- L1: heartbeats ---------------------------------------------------------------------

    def _start_heartbeat(self) -> HeartbeatWriter:
        if self._hb is None:
            hb = initial_heartbeat(self.game, self._algo, self.total_steps, self._device)
            self._hb = HeartbeatWriter(self.run_dir, hb)
            self._hb.update(
                writer="sdk",
                resume_count=self.resume_count,
                resumed_from_step=self.resumed_from_step,
                last_checkpoint_step=self.last_checkpoint_step,
                last_checkpoint_time=self.last_checkpoint_time,
                num_envs=_int_or_zero(self.knobs.get("num_envs")),
                batch_size=_int_or_zero(self.knobs.get("batch_size")),
                threads=env_int(P.THREADS_ENV, None),
                checkpoint_request=self._request_report,
                replay_damage=list(self._damage_reports),
                mirror_restore=self._mirror_restore,
            )
            self._hb.start()
        return self._hb

    def heartbeat(
        self,
        step: int,
        *,
        episodes: int | None = None,
        mean_return: float | None = None,
        **metrics: float,
    ) -> None:
        """Say that training reached `step` (agent steps, or whatever the script counts; it
        must move for the supervisor to see progress). Cheap (a few hundred nanoseconds but
        every 50 ms): call it every step. The step is always current; the other fields are
        taken at most every 50 ms.
        `mean_return`, `episodes` and any other numbers show in status, plot and metrics (no
        finite number: blank, counted); rlsup's own progress columns (`sps`, ...) are no
        metric names (ValueError)."""
        if metrics and not _evaluation.RESERVED_METRICS.isdisjoint(metrics):
            _evaluation.check_metric_names(metrics)
        self._step = int(step)  # read by the heartbeat thread (`live_step`): always current
        now = time.monotonic()
        if self._training and now - self._applied_at < APPLY_EVERY_S:
            return  # called every environment step: the rest waits for the next 50 ms
        self._applied_at = now
        hb = self._start_heartbeat()
        if not self._training:
            self._training = True
            hb.live_step = lambda: self._step
            hb.set_phase(Phase.TRAINING, self.step_deadline_s)
        values = {k: _finite(v) for k, v in metrics.items()}
        fields: dict[str, Any] = {"metrics": values}
        if episodes is not None:
            fields["episodes"] = int(episodes)
        if mean_return is not None:
            fields["mean_return"] = _finite(mean_return)
        dropped = sum(v is None for v in values.values())
        dropped += mean_return is not None and fields["mean_return"] is None
        if dropped:
            hb.count_dropped("metric", dropped)
        hb.progress(int(step), **fields)
        if now - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at = now
            self._progress_row(hb.current)

    def evaluation(
        self,
        step: int,
        mean_return: float,
        *,
        episodes: int | None = None,
        seconds: float | None = None,
        **extra: Any,
    ) -> bool:
        """An evaluation at `step`: its mean return over `episodes` episodes that took
        `seconds` (timed inside `with run.evaluating():`), `extra` figures (std=...). Recorded
        as rlsup's worker records one (rlsup/_evaluation.py): evaluate, then checkpoint, and
        the checkpoint records it for `keep_best`. False, counted, nothing recorded, when step
        or mean_return is no finite number."""
        return _evaluation.report(self, step, mean_return, episodes, seconds, extra)

    def evaluating(
        self, deadline_s: float = _evaluation.EVALUATING_DEADLINE_S
    ) -> _evaluation.Evaluating:
        """`with run.evaluating(): ...; run.evaluation(step, mean)`: the step may stand still
        for `deadline_s` (a long evaluation is no hang); the evaluation is timed by it."""
        return _evaluation.Evaluating(self, deadline_s)

    def _on_request_report(self, report: dict[str, Any]) -> None:
        self._request_report = report
        if self._hb is not None:
            self._hb.update(checkpoint_request=report)
            self._hb.publish()

    def _progress_row(self, hb: P.Heartbeat) -> None:
        if self._progress is None:
            columns = P.PROGRESS_COLUMNS + tuple(sorted(hb.metrics))
            self._progress = ProgressLog(self.run_dir, self._progress_failed, columns=columns)
        row: dict[str, Any] = {
            "time": round(time.time(), 3),
            "wall_s": round(time.time() - self._started_wall, 3),
            "global_step": hb.global_step,
            "episodes": hb.episodes,
            "sps": hb.sps,
            "mean_return": "" if hb.mean_return is None else hb.mean_return,
            "num_envs": hb.num_envs,
            "batch_size": hb.batch_size,
            "resume_count": self.resume_count,
        }
        row.update({k: "" if v is None else v for k, v in hb.metrics.items()})
        self._progress.append(row)

    def _progress_failed(self) -> None:
        if self._hb is not None:
            self._hb.count_failure("progress")

    def _phase(self, phase: Phase, deadline_s: float) -> None:
        if self._hb is not None:
            self._hb.set_phase(phase, deadline_s)

    def _back_to_work(self) -> None:
        if self._training:
            self._phase(Phase.TRAINING, self.step_deadline_s)
        else:
            self._phase(Phase.STARTING, self.step_deadline_s)

    # ---- L2: checkpoints ---------------------------------------------------------------------

    def latest(self) -> Path | None:
        """The newest checkpoint that verifies (its directory, read-only by convention), or None
        when the run has none. A corrupt newer one is quarantined (`.corrupt-*`, reported to the
        supervisor) and the one before it returned. Raises NoValidCheckpoint when checkpoints
        exist but none verifies, and SdkError when the store cannot be read.

        An array chunk unchanged for a while is one file hard-linked into every checkpoint: if
        it rots, no checkpoint is whole. It is repaired from an identical file when the store
        has one; else the newest checkpoint is returned all the same, its lost rows reported
        (stderr, the heartbeat's `replay_damage`, `damaged_rows()`), and `load_arrays()` of
        that array raises ArrayDamaged unless the script opts into the holes."""
        self._phase(Phase.LOADING, LOADING_DEADLINE_S)
        try:
            loaded = self.store.load_latest(salvage=_damage.is_array_chunk, whole_first=True)
        except _StoreNoValid as exc:
            raise NoValidCheckpoint(str(exc)) from exc
        except CheckpointUnreadable as exc:  # EIO, EACCES: the disk, not the checkpoint
            _exits.unreadable(self, f"cannot read the checkpoints in {self.store.root}", exc)
        except CheckpointError as exc:
            raise SdkError(f"cannot read the checkpoints in {self.store.root}: {exc}") from exc
        finally:
            if not self._closed:
                self._back_to_work()
        self._looked = True
        self._loaded = loaded
        if loaded is None:
            return None
        self.resumed_from_step = loaded.step
        self.last_checkpoint_step = loaded.step
        captured = loaded.meta.get("time")
        if isinstance(captured, int | float) and not isinstance(captured, bool):
            # A request older than the state resumed from is served already.
            self._requests.committed(float(captured), loaded.step)
        if self._hb is not None:
            self._hb.update(
                resumed_from_step=loaded.step,
                last_checkpoint_step=loaded.step,
                quarantined=[name for name, _ in loaded.quarantined],
            )
        _arrays.report_damage(self, loaded)
        return loaded.path

    def damaged_rows(self, name: str) -> list[tuple[int, int]]:
        """The rows ([start, stop) ranges of the first axis) of array `name` in the checkpoint
        `latest()` returned whose bytes are damaged in every checkpoint: what
        `load_arrays(name, salvage=True)` zeroes. [] when the array is whole."""
        if not self._looked:
            self.latest()
        return list(self._lost_rows.get(name, []))

    @property
    def latest_step(self) -> int | None:
        """The step of the checkpoint `latest()` returned (None before, or without one)."""
        return None if self._loaded is None else self._loaded.step

    def checkpoint(self, step: int, **meta: Any) -> _commit.CheckpointBlock:
        """`with run.checkpoint(step) as d:` -- write your files into the directory `d` (at
        most one subdirectory deep) and call `save_arrays()`; when the block exits cleanly
        every file is fsynced, listed with its sha256 in a manifest and the directory renamed
        into place atomically, then older checkpoints beyond `keep` are removed. When the
        block raises, nothing is committed. `meta`: JSON values kept in the manifest."""
        if self._writer is not None:
            raise SdkError("run.checkpoint(): a checkpoint block is already open")
        if step < 0:
            raise SdkError(f"run.checkpoint({step}): the step must be >= 0")
        return _commit.CheckpointBlock(self, int(step), meta)

    def save_arrays(
        self, name: str, array: Any, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> dict[str, int]:
        """Put a numpy array (a replay buffer) into the open checkpoint, in chunks of
        `chunk_bytes`: a chunk equal to the same chunk of the previous checkpoint is hard-linked
        from it (compared byte for byte first), so only changed chunks are written, and nothing
        is copied in memory (a non-contiguous array is copied once). Returns bytes written and
        linked (the chunks; the small header aside)."""
        return _arrays.save(self, name, array, chunk_bytes)

    def load_arrays(self, name: str, *, salvage: bool = False) -> np.ndarray:
        """The array `name` of the checkpoint `latest()` returned, read chunk by chunk into one
        new array (no second copy). SdkError when there is no checkpoint or no such array.
        ArrayDamaged when some of its chunks are damaged in every checkpoint (see `latest()`);
        salvage=True: the rest of it, with the rows of those chunks (`damaged_rows(name)`)
        set to zero, for a script that can drop or refill them (a replay buffer)."""
        return _arrays.load(self, name, salvage)

    # ---- L3: stopping ------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self._stop_reason == "SIGINT":
            raise KeyboardInterrupt  # a second Ctrl-C: the operator means it
        self._stop_reason = self._stop_reason or name

    def should_stop(self) -> bool:
        """Was the run asked to stop (SIGTERM: `rlsup stop`, a reboot, a preemption; SIGINT;
        the supervisor gone)? Then checkpoint (`should_checkpoint()` is True) and exit."""
        if self._stop_reason is None and self._parent is not None and self._parent.gone():
            self._stop_reason = "supervisor gone"
        return self._stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        self.should_stop()
        return self._stop_reason

    def request_stop(self, reason: str = "requested") -> None:
        """Ask for a stop from inside the script (as SIGTERM would)."""
        self._stop_reason = self._stop_reason or reason

    def should_checkpoint(self, step: int | None = None) -> bool:
        """Is a checkpoint due: a stop was asked for, the supervisor asked for one now
        (`checkpoint.request` in the run dir, newer than the last commit), the interval
        `checkpoint_every_s` passed since the last one (60 s after a failed one), or, with
        `checkpoint_every_steps`, that many steps since?"""
        if self.should_stop():
            return step is None or step != self.last_checkpoint_step
        if self._requested():
            return True
        wait = self._interval_s
        if self._last_failed:
            wait = min(wait, RETRY_FAILED_CHECKPOINT_S)
        if time.monotonic() - self._last_attempt_mono >= wait:
            return True
        if self.checkpoint_every_steps is not None and step is not None:
            since = self.last_checkpoint_step or 0
            return step - since >= self.checkpoint_every_steps
        return False

    def _clock(self) -> float:
        """should_checkpoint()'s clock (one, for rlsup/_commit.py too)."""
        return time.monotonic()

    def _attempted(self) -> None:
        """A checkpoint was just tried (rlsup/_commit.py), committed or not: the interval of
        `should_checkpoint()` counts from now, on the clock it reads, paced by what the block
        cost the script (it stalls it all: training.protocol.checkpoint_interval_s)."""
        self._last_attempt_mono = now = self._clock()
        cost = now - (self._began_mono or now)
        self._interval_s = P.checkpoint_interval_s(
            self.checkpoint_every_s, cost, cost, cost_s=cost, mtbf_s=self._host_mtbf_s
        )
        if self._hb is not None:
            self._hb.update(checkpoint_interval_s=round(self._interval_s, 3))

    @property
    def preemption_deadline(self) -> float | None:
        """When this machine may be taken away (Unix seconds), or None when no notice is known:
        the `deadline` of the standing `checkpoint.request` (the supervisor writes it on a
        preemption notice), else `RLSUP_PREEMPTION_DEADLINE`. Read afresh at each call (a
        stat, and a small read while a request stands). With a deadline, checkpoint at once
        and keep each step short: `time.time()` is the clock to compare it with."""
        return P.preemption_deadline(self.run_dir)

    def _requested(self) -> bool:
        """A `checkpoint.request` newer than the state of the last checkpoint (a stat at most
        every 50 ms)."""
        # After a failed checkpoint: due again 10 s later.
        return self._requests.due(self._requests.refresh())

    def exit_stopped(self) -> NoReturn:
        """Exit 75, "stopped after a checkpoint": not a crash, resumed at the next start.
        Says so on stderr when the step moved past the last checkpoint (that work is redone):
        a loop that asks `should_stop()` twice can see a SIGTERM that its checkpoint question
        did not; read it once per iteration, before that question."""
        if self._training and self._step > (self.last_checkpoint_step or 0):
            say(
                f"exiting 75 at step {self._step} without a checkpoint of it (last "
                f"committed: {self.last_checkpoint_step}); the steps since are redone"
            )
        self.close(phase=Phase.STOPPING)
        raise SystemExit(int(ExitCode.STOPPED))

    def close(self, phase: Phase | None = None) -> None:
        """Stop heartbeating, let go of the run directory and the signal handlers. Idempotent;
        the process's exit does the same."""
        if self._closed:
            return
        self._closed = True
        if self._hb is not None:
            fields: dict[str, Any] = {"global_step": self._step} if self._training else {}
            if phase is not None:
                fields["phase"] = str(phase)
            self._hb.update(**fields)  # the last step, not the one 50 ms before it
            self._hb.stop()
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)
        self._unhook()
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _finite(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise SdkError(f"heartbeat metric {value!r}: not a number") from None
    return f if math.isfinite(f) else None


def _int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) else 0
