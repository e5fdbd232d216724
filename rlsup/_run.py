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
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from checkpoints import CheckpointError, CheckpointStore, CheckpointWriter, LoadedCheckpoint
from checkpoints import NoValidCheckpoint as _StoreNoValid
from checkpoints._log import StdlibLogger
from checkpoints.errors import PlacementFenced
from checkpoints.retention import EVAL_META
from rlsup import _damage, _evaluation, _fence
from training import protocol as P
from training.checkpoint_request import CheckpointRequestWatch
from training.heartbeat import HeartbeatWriter, initial_heartbeat
from training.progress import ProgressLog
from training.protocol import ExitCode, Phase

if TYPE_CHECKING:
    import numpy as np

ARRAYS_DIR = "arrays"
DEFAULT_CHUNK_BYTES = 16 << 20
_ARRAY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
LOADING_DEADLINE_S = 3600.0  # verifying and reading a large checkpoint: the step need not move
CHECKPOINT_DEADLINE_S = 3600.0
RETRY_FAILED_CHECKPOINT_S = 60.0
PROGRESS_EVERY_S = 10.0
APPLY_EVERY_S = 0.05  # heartbeat() fields (metrics, returns) taken at most this often
DEFAULT_CHECKPOINT_EVERY_S = 600.0


class SdkError(RuntimeError):
    """A misuse of the SDK or a state it cannot go on from; the message says which."""


class RunDirLocked(SdkError):
    """Another process holds the run directory (two writers would corrupt each other)."""


class NoValidCheckpoint(SdkError):
    """Checkpoints exist but none verifies: never a silent restart from step 0."""


class CheckpointFailed(SdkError):
    """A checkpoint could not be committed (a full disk, an I/O error); nothing was changed."""


class ArrayDamaged(SdkError):
    """`load_arrays(name)`: chunks of the array are damaged in every checkpoint that holds them
    (one inode, hard-linked from checkpoint to checkpoint, rotted). `rows`: the [start, stop)
    ranges of the first axis they held; `load_arrays(name, salvage=True)` loads the rest with
    those rows zeroed."""

    def __init__(self, message: str, name: str, rows: list[tuple[int, int]]) -> None:
        super().__init__(message)
        self.name = name
        self.rows = rows


def _env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SdkError(f"environment variable {name}={raw!r}: not an integer") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SdkError(f"environment variable {name}={raw!r}: not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise SdkError(f"environment variable {name}={raw!r}: must be a positive number")
    return value


def attach(
    run_dir: str | os.PathLike[str] | None = None,
    *,
    total_steps: int | None = None,
    checkpoint_every_s: float | None = None,
    checkpoint_every_steps: int | None = None,
    keep: int | None = None,
    heartbeat: bool | None = None,
    step_deadline_s: float = 600.0,
    handle_signals: bool = True,
    exit_on_stop: bool = True,
    algo: str = "",
    device: str = "",
    lock_wait_s: float = 10.0,
    params: dict[str, Any] | None = None,
    keep_best: int = 0,
) -> Run:
    """This process's run: under `rlsup run` the game's run directory (`RLSUP_RUN_DIR`, which
    wins over `run_dir`), standalone `run_dir` (made if missing). Takes the run directory's lock
    (waiting up to 10 s for a predecessor to let go), so two processes never write one run.

    total_steps / checkpoint_every_s / keep: defaults for what the supervisor sets
    (`RLSUP_TOTAL_STEPS`, `RLSUP_CHECKPOINT_EVERY_S`, `RLSUP_KEEP_CHECKPOINTS`); under rlsup the
    config's values win. checkpoint_every_steps: also due every that many steps.
    heartbeat: start heartbeating at once (True), or at the first `heartbeat()` (False); by
    default at once when the config promises heartbeats (`games.heartbeat = true`).
    step_deadline_s: how long the step may stand still while training before the supervisor
    calls the script hung (it checkpoints and loads under longer deadlines of their own).
    handle_signals: turn SIGTERM and SIGINT into `should_stop()` (main thread only).
    exit_on_stop: after a checkpoint committed while a stop is requested, exit 75 (stopped
    after a checkpoint), so the supervisor neither counts a crash nor waits for a kill.
    lock_wait_s: how long to wait for another process to let go of the run directory.
    params: the script's own hyper-parameters, overridden key by key by the config's `params`
    (`RLSUP_PARAMS`): `run.params`.
    keep_best: also keep the checkpoints of this many best evaluations (`run.evaluation()` at
    a checkpoint's step, before it), besides the newest `keep`.
    """
    supervised = bool(os.environ.get(P.RUN_DIR_ENV))
    if supervised:
        where = Path(os.environ[P.RUN_DIR_ENV])
    elif run_dir is not None:
        where = Path(run_dir)
    else:
        raise SdkError(
            "rlsup.attach(): no run directory: pass run_dir=... to run standalone, or start "
            "the script as a command game under `rlsup run` (which sets RLSUP_RUN_DIR)"
        )
    every_s = _env_float(P.CHECKPOINT_EVERY_S_ENV, checkpoint_every_s or DEFAULT_CHECKPOINT_EVERY_S)
    if heartbeat is None:
        heartbeat = os.environ.get(P.HEARTBEAT_ENV) == "1"
    return Run(
        where,
        supervised=supervised,
        game=os.environ.get(P.GAME_ENV) or where.name,
        seed=_env_int(P.SEED_ENV, None),
        resume_count=_env_int(P.RESUME_COUNT_ENV, 0) or 0,
        mode=os.environ.get(P.MODE_ENV) or None,
        knobs=_knobs_from_env(),
        total_steps=_env_int(P.TOTAL_STEPS_ENV, total_steps) or total_steps or 0,
        checkpoint_every_s=every_s,
        checkpoint_every_steps=checkpoint_every_steps,
        keep=_env_int(P.KEEP_CHECKPOINTS_ENV, keep) or keep or 3,
        heartbeat_at_once=heartbeat,
        step_deadline_s=step_deadline_s,
        handle_signals=handle_signals,
        exit_on_stop=exit_on_stop,
        algo=algo,
        device=device,
        lock_wait_s=lock_wait_s,
        params=_evaluation.params_from_env(params),
        keep_best=keep_best,
    )


def _knobs_from_env() -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    num_envs = _env_int(P.NUM_ENVS_ENV, None)
    if num_envs is not None:
        knobs["num_envs"] = num_envs
    batch = os.environ.get(P.BATCH_SIZE_ENV)
    if batch:
        knobs["batch_size"] = batch if batch == "auto" else _env_int(P.BATCH_SIZE_ENV, None)
    return knobs


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
        epoch = (_env_int(P.EPOCH_ENV, 0) or 0) if supervised else 0
        if epoch < 0:
            raise SdkError(f"environment variable {P.EPOCH_ENV}={epoch}: must be >= 0")
        self._fence = _fence.Fence.from_env(game, epoch, _say) if supervised else None
        self._mirror_restore = _fence.mirror_restore_from_env() if supervised else None
        self._make_run_dir()
        self._lock_fd = self._take_lock(lock_wait_s)
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
        self._requests = CheckpointRequestWatch(
            run_dir, False, None, self._on_request_report, poll_every_s=0.0
        )
        self._request_report: dict[str, Any] | None = None
        self._old_handlers: dict[int, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        if heartbeat_at_once:
            self._start_heartbeat()
        atexit.register(self.close)  # a script that just returns still publishes its last step

    # ---- the run directory ----------------------------------------------------------------

    def _make_run_dir(self) -> None:
        try:
            self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise SdkError(f"run directory {self.run_dir}: cannot create it: {exc}") from exc
        if not self.run_dir.is_dir() or not os.access(self.run_dir, os.W_OK | os.X_OK):
            raise SdkError(f"run directory {self.run_dir}: not a writable directory")

    def _take_lock(self, wait_s: float) -> int:
        try:
            return P.lock_run_dir(self.run_dir, wait_s)
        except P.RunDirBusy as exc:
            raise RunDirLocked(
                f"run directory {self.run_dir} is in use by another process (pid "
                f"{exc.holder}, holding {self.run_dir / P.LOCK_FILE}): one run directory, "
                "one writer"
            ) from exc

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
                threads=_env_int(P.THREADS_ENV, None),
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
        except CheckpointError as exc:
            raise SdkError(f"cannot read the checkpoints in {self.store.root}: {exc}") from exc
        finally:
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
        self._report_damage(loaded)
        return loaded.path

    def damaged_rows(self, name: str) -> list[tuple[int, int]]:
        """The rows ([start, stop) ranges of the first axis) of array `name` in the checkpoint
        `latest()` returned whose bytes are damaged in every checkpoint: what
        `load_arrays(name, salvage=True)` zeroes. [] when the array is whole."""
        if not self._looked:
            self.latest()
        return list(self._lost_rows.get(name, []))

    def _report_damage(self, loaded: LoadedCheckpoint) -> None:
        """Rot found while loading, never silent: each array's lost rows (or the files put
        right from an identical copy) on stderr and in the heartbeat's `replay_damage`."""
        self._lost_rows = {}
        if not loaded.damaged and not loaded.repaired:
            return
        totals: dict[str, int] = {}
        for array, chunks in _damage.chunks_by_array(loaded.damaged).items():
            try:  # the header verified (it is not salvageable): only a read error is left
                header = loaded.read_json(f"{ARRAYS_DIR}/{array}.json")
            except CheckpointError as exc:
                raise SdkError(f"cannot read the checkpoints in {self.store.root}: {exc}") from exc
            self._lost_rows[array] = _damage.rows_of_chunks(header, chunks)
            totals[array] = int(header["shape"][0]) if header["shape"] else 1
        entry: dict[str, Any] = {
            "checkpoint": loaded.path.name,
            "when": "load",
            "files": sorted({*loaded.damaged, *loaded.repaired}),
            "rows_lost": {a: [list(r) for r in rows] for a, rows in self._lost_rows.items()},
            "repaired": dict(loaded.repaired),
        }
        self._damage_reports.append(entry)
        for file, where in sorted(loaded.repaired.items()):
            _say(f"{loaded.path.name}/{file} was damaged; repaired from {where} (nothing lost)")
        for array, rows in self._lost_rows.items():
            files = sorted(f for f in loaded.damaged if f.startswith(f"{ARRAYS_DIR}/{array}."))
            _say(
                f"{loaded.path.name}: {', '.join(files)} damaged in every checkpoint holding "
                f"it: {_damage.describe(rows, totals[array])} of array {array!r} are lost; "
                f"load_arrays({array!r}) raises ArrayDamaged unless salvage=True"
            )
        if self._hb is not None:
            self._hb.update(replay_damage=list(self._damage_reports))
            self._hb.publish()

    @property
    def latest_step(self) -> int | None:
        """The step of the checkpoint `latest()` returned (None before, or without one)."""
        return None if self._loaded is None else self._loaded.step

    def checkpoint(self, step: int, **meta: Any) -> _CheckpointBlock:
        """`with run.checkpoint(step) as d:` -- write your files into the directory `d` (at
        most one subdirectory deep) and call `save_arrays()`; when the block exits cleanly
        every file is fsynced, listed with its sha256 in a manifest and the directory renamed
        into place atomically, then older checkpoints beyond `keep` are removed. When the
        block raises, nothing is committed. `meta`: JSON values kept in the manifest."""
        if self._writer is not None:
            raise SdkError("run.checkpoint(): a checkpoint block is already open")
        if step < 0:
            raise SdkError(f"run.checkpoint({step}): the step must be >= 0")
        return _CheckpointBlock(self, int(step), meta)

    def save_arrays(
        self, name: str, array: Any, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> dict[str, int]:
        """Put a numpy array (a replay buffer) into the open checkpoint, in chunks of
        `chunk_bytes`: a chunk equal to the same chunk of the previous checkpoint is hard-linked
        from it (compared byte for byte first), so only changed chunks are written, and nothing
        is copied in memory (a non-contiguous array is copied once). Returns bytes written and
        linked (the chunks; the small header aside)."""
        import numpy as np  # only the array functions need numpy

        writer = self._writer
        if writer is None:
            raise SdkError("run.save_arrays(): only inside a `with run.checkpoint(step):` block")
        _check_array_name(name)
        if chunk_bytes < 1:
            raise SdkError(f"run.save_arrays({name!r}): chunk_bytes must be >= 1")
        a = np.asarray(array)
        if a.dtype.hasobject or a.dtype.names is not None:
            raise SdkError(
                f"run.save_arrays({name!r}): dtype {a.dtype} is not a plain numeric type "
                "(objects would need pickle, which a checkpoint never holds)"
            )
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        flat = memoryview(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        before_w, before_l = writer.stats.bytes_written, writer.stats.bytes_linked
        chunks = math.ceil(a.nbytes / chunk_bytes)
        for i in range(chunks):
            view = flat[i * chunk_bytes : (i + 1) * chunk_bytes]
            writer.link_or_write(
                f"{ARRAYS_DIR}/{name}.{i:06d}",
                view,
                unchanged_since_step=self._base_step,
                expect_same=False,
                sync_at_commit=True,  # the kernel writes chunk i back while i+1 is written
            )
        stats = {
            "bytes_written": writer.stats.bytes_written - before_w,
            "bytes_linked": writer.stats.bytes_linked - before_l,
        }
        writer.write_json(
            f"{ARRAYS_DIR}/{name}.json",
            {
                "dtype": a.dtype.str,
                "shape": list(a.shape),
                "nbytes": int(a.nbytes),
                "chunk_bytes": int(chunk_bytes),
                "chunks": chunks,
            },
        )
        return stats

    def load_arrays(self, name: str, *, salvage: bool = False) -> np.ndarray:
        """The array `name` of the checkpoint `latest()` returned, read chunk by chunk into one
        new array (no second copy). SdkError when there is no checkpoint or no such array.
        ArrayDamaged when some of its chunks are damaged in every checkpoint (see `latest()`);
        salvage=True: the rest of it, with the rows of those chunks (`damaged_rows(name)`)
        set to zero, for a script that can drop or refill them (a replay buffer)."""
        import numpy as np

        _check_array_name(name)
        if not self._looked:
            self.latest()
        loaded = self._loaded
        if loaded is None:
            raise SdkError(f"run.load_arrays({name!r}): the run has no checkpoint")
        header_name = f"{ARRAYS_DIR}/{name}.json"
        if header_name not in loaded.files():
            have = sorted(
                f[len(ARRAYS_DIR) + 1 : -5]
                for f in loaded.files()
                if f.startswith(ARRAYS_DIR + "/") and f.endswith(".json")
            )
            raise SdkError(
                f"run.load_arrays({name!r}): {loaded.path.name} holds no such array "
                f"(it has: {', '.join(have) or 'none'})"
            )
        self._phase(Phase.LOADING, LOADING_DEADLINE_S)
        try:
            header = loaded.read_json(header_name)
            dtype = np.dtype(header["dtype"])
            if dtype.hasobject:
                raise SdkError(f"{loaded.path}/{header_name}: dtype {dtype} is not allowed")
            out = np.empty(tuple(header["shape"]), dtype=dtype)
            flat = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
            step = int(header["chunk_bytes"])
            if out.nbytes != int(header["nbytes"]):
                raise SdkError(f"{loaded.path}/{header_name}: shape and nbytes disagree")
            lost = set(_damage.chunks_by_array(loaded.damaged).get(name, []))
            if lost:
                self._refuse_or_accept_holes(loaded, name, header, salvage)
            for i in range(int(header["chunks"])):
                part = flat[i * step : (i + 1) * step]
                if i in lost:
                    part[:] = bytes(len(part))  # salvage: the damaged chunk's rows are zeros
                else:
                    loaded.read_into(f"{ARRAYS_DIR}/{name}.{i:06d}", part)
        except (KeyError, TypeError, ValueError) as exc:
            raise SdkError(f"{loaded.path}/{header_name}: not an array header: {exc}") from exc
        finally:
            self._back_to_work()
        return out

    def _refuse_or_accept_holes(
        self, loaded: LoadedCheckpoint, name: str, header: dict[str, Any], salvage: bool
    ) -> None:
        rows = self._lost_rows.get(name, [])
        where = _damage.describe(rows, int(header["shape"][0]) if header["shape"] else 1)
        if salvage:
            _say(f"load_arrays({name!r}, salvage=True): {where} are zeros (damaged)")
            return
        raise ArrayDamaged(
            f"run.load_arrays({name!r}): {loaded.path.name} holds damaged chunks of it, in "
            f"every checkpoint that has them: {where} are lost. Pass salvage=True to load the "
            f"rest with those rows zeroed (run.damaged_rows({name!r}) names them), or, with a "
            f"mirror, restore them before the next start: rlsup pull --game {self.game} --repair",
            name,
            rows,
        )

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
        wait = self.checkpoint_every_s
        if self._last_failed:
            wait = min(wait, RETRY_FAILED_CHECKPOINT_S)
        if time.monotonic() - self._last_attempt_mono >= wait:
            return True
        if self.checkpoint_every_steps is not None and step is not None:
            since = self.last_checkpoint_step or 0
            return step - since >= self.checkpoint_every_steps
        return False

    @property
    def preemption_deadline(self) -> float | None:
        """When this machine may be taken away (Unix seconds), or None when no notice is known:
        the `deadline` of the standing `checkpoint.request` (the supervisor writes it on a
        preemption notice), else `RLSUP_PREEMPTION_DEADLINE`. Read afresh at each call (a
        stat, and a small read while a request stands). With a deadline, checkpoint at once
        and keep each step short: `time.time()` is the clock to compare it with."""
        return P.preemption_deadline(self.run_dir)

    def _requested(self) -> bool:
        """A `checkpoint.request` newer than the state of the last checkpoint (one stat)."""
        self._requests.poll()
        return self._requests.due()  # after a failed checkpoint: again 10 s later

    def exit_stopped(self) -> NoReturn:
        """Exit 75, "stopped after a checkpoint": not a crash, resumed at the next start.
        Says so on stderr when the step moved past the last checkpoint (that work is redone):
        a loop that asks `should_stop()` twice can see a SIGTERM that its checkpoint question
        did not; read it once per iteration, before that question."""
        if self._training and self._step > (self.last_checkpoint_step or 0):
            _say(
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
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the checkpoint block's two ends -----------------------------------------------------

    def _begin(self, step: int, meta: dict[str, Any]) -> Path:
        base = self.store.latest()
        self._captured_at = time.time()
        full_meta = {
            "sdk": 1,
            "name": self.game,
            "step": step,
            "time": self._captured_at,
            "resume_count": self.resume_count,
            **meta,
        }
        if self._evaluated is not None and self._evaluated["step"] == step:
            full_meta.setdefault(EVAL_META, dict(self._evaluated))
        if self._fence is not None and self._fence.active:
            full_meta["epoch"] = self._fence.epoch  # which placement wrote it (several hosts)
        self._phase(Phase.CHECKPOINTING, CHECKPOINT_DEADLINE_S)
        try:
            self._writer = self.store.begin(step, full_meta)
        except CheckpointError as exc:
            self._back_to_work()
            self._failed(step, exc)
            raise CheckpointFailed(str(exc)) from exc
        self._base_step = base.step if base is not None and base.step != step else None
        return self._writer.staging

    def _end(self, step: int, error: BaseException | None) -> None:
        writer, self._writer = self._writer, None
        assert writer is not None
        self._last_attempt_mono = time.monotonic()
        fenced: PlacementFenced | None = None
        try:
            if error is not None:
                self._abandon(step, writer, error)
                return  # not an I/O failure: the script's own exception goes on as it is
            try:
                writer.adopt_staged()
                if self._fence is not None:
                    self._fence.check()  # the last moment before the rename: abort, not commit
                writer.commit()
            except PlacementFenced as exc:
                writer.abort()
                fenced = exc
            except (CheckpointError, OSError) as exc:
                writer.abort()
                self._failed(step, exc)
                raise CheckpointFailed(f"checkpoint at step {step} not committed: {exc}") from exc
        finally:
            self._back_to_work()
        if fenced is not None:
            self._fenced(step, fenced)
        self._last_failed = False
        self.last_checkpoint_step = step
        self.last_checkpoint_time = time.time()
        self.last_save_stats = {
            "bytes_written": writer.stats.bytes_written,
            "bytes_linked": writer.stats.bytes_linked,
            "seconds": writer.stats.seconds,
        }
        if self._hb is not None:
            self._hb.update(
                last_checkpoint_step=step, last_checkpoint_time=self.last_checkpoint_time
            )
        self._requests.poll()  # a request made before this state was captured: served by it
        self._requests.committed(self._captured_at, step)
        if self._hb is not None:
            self._hb.publish()
        if self.exit_on_stop and self.should_stop():
            self.exit_stopped()

    def _fenced(self, step: int, exc: PlacementFenced) -> NoReturn:
        """Several hosts: the game was placed again elsewhere since this process started.
        Nothing is committed from here on: error.json says why, and the process exits 77."""
        message = f"checkpoint at step {step}: {exc}"
        _say(message + "; exiting 77 (fenced)")
        with contextlib.suppress(OSError, CheckpointError):
            from checkpoints import write_json_atomic

            write_json_atomic(
                self.run_dir / P.ERROR_FILE,
                {"kind": "fenced", "message": message, "exit_code": int(ExitCode.FENCED),
                 "time": time.time(), "pid": os.getpid(), "step": step, "traceback": ""},
            )  # fmt: skip
        self.close(phase=Phase.STOPPING)
        raise SystemExit(int(ExitCode.FENCED))

    def _abandon(self, step: int, writer: CheckpointWriter, error: BaseException) -> None:
        """The block raised: nothing is committed. An I/O failure (a full disk under
        save_arrays, under the script's own writes, under torch.save) is a failed checkpoint,
        counted and retried like a failed commit: CheckpointFailed, chained to it."""
        why = _io_failure(error, writer.staging)  # before the abort frees the space
        writer.abort()
        if why is not None:
            self._failed(step, why)
            raise CheckpointFailed(f"checkpoint at step {step} not committed: {why}") from error

    def _failed(self, step: int, exc: BaseException | str) -> None:
        self._last_failed = True
        self._requests.failed()
        _say(f"checkpoint at step {step} failed: {exc}")
        if self._hb is not None:
            failures = self._hb.current.checkpoint_failures + 1
            self._hb.update(checkpoint_failures=failures, last_checkpoint_error=str(exc))
            self._hb.publish()  # the supervisor and `status` see it now, not a second later


class _CheckpointBlock:
    def __init__(self, run: Run, step: int, meta: dict[str, Any]) -> None:
        self._run, self._step, self._meta = run, step, meta

    def __enter__(self) -> Path:
        return self._run._begin(self._step, self._meta)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._run._end(self._step, exc)


def _io_failure(error: BaseException, staging: Path) -> str | None:
    """What went wrong when `error` (raised inside a checkpoint block) is an I/O failure, else
    None (a bug in the block, an interrupt: not the checkpoint's to swallow). I/O: an OSError
    or a CheckpointError, raised or in its chain; or any error while the checkpoint's
    filesystem has no space left (torch.save reports ENOSPC as a RuntimeError of its own)."""
    if not isinstance(error, Exception) or isinstance(error, SdkError):
        return None
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError | CheckpointError):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    if _no_space_left(staging):
        return f"{type(error).__name__}: {error} (no space left on {staging.parent})"
    return None


def _no_space_left(path: Path) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    # root may write into the blocks reserved for it; anyone else may not.
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks == 0 or st.f_favail == 0


def _check_array_name(name: str) -> None:
    if not isinstance(name, str) or _ARRAY_NAME.fullmatch(name) is None:
        raise SdkError(
            f"array name {name!r}: 1-100 characters [A-Za-z0-9_-], starting with a letter or "
            "digit (it names files in the checkpoint)"
        )


def _say(message: str) -> None:
    """A line on stderr: under rlsup that is the game's log, on the state disk, which may be
    full: a line lost there must never turn into the script's crash (an OSError from print)."""
    with contextlib.suppress(OSError, ValueError):  # ValueError: stderr closed
        print(f"rlsup: {message}", file=sys.stderr, flush=True)


def _finite(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise SdkError(f"heartbeat metric {value!r}: not a number") from None
    return f if math.isfinite(f) else None


def _int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) else 0
