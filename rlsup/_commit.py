"""The checkpoint block's two ends (`with run.checkpoint(step) as d:`): `begin` opens a
writer on the store (the manifest's meta: step, time, the evaluation at that step, the
placement's epoch); `end` commits what the block wrote (after the fence's last word), or
abandons it when the block raised. A failed commit, or an I/O failure inside the block (a full
disk under `save_arrays()`, the script's own writes, torch.save), is CheckpointFailed: counted
in the heartbeat, and `should_checkpoint()` asks again within 60 s. A fenced placement (several
hosts) exits 77, committing nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from checkpoints import CheckpointError, CheckpointWriter
from checkpoints.errors import PlacementFenced
from checkpoints.retention import EVAL_META
from rlsup import _exits
from rlsup._errors import CheckpointFailed, SdkError, say
from training.protocol import ExitCode, Phase

if TYPE_CHECKING:
    from rlsup._run import Run

CHECKPOINT_DEADLINE_S = 3600.0


class CheckpointBlock:
    """`with run.checkpoint(step) as d:`: `begin` on the way in (`d` is the staging
    directory), `end` on the way out (commit, or abandon when the block raised)."""

    def __init__(self, run: Run, step: int, meta: dict[str, Any]) -> None:
        self._run, self._step, self._meta = run, step, meta

    def __enter__(self) -> Path:
        return begin(self._run, self._step, self._meta)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end(self._run, self._step, exc)


def begin(run: Run, step: int, meta: dict[str, Any]) -> Path:
    base = run.store.latest()
    run._began_mono = run._clock()  # the block's cost paces the next (Run._attempted)
    run._captured_at = time.time()
    full_meta = {
        "sdk": 1,
        "name": run.game,
        "step": step,
        "time": run._captured_at,
        "resume_count": run.resume_count,
        **meta,
    }
    if run._evaluated is not None and run._evaluated["step"] == step:
        full_meta.setdefault(EVAL_META, dict(run._evaluated))
    if run._fence is not None and run._fence.active:
        full_meta["epoch"] = run._fence.epoch  # which placement wrote it (several hosts)
    run._phase(Phase.CHECKPOINTING, CHECKPOINT_DEADLINE_S)
    try:
        run._writer = run.store.begin(step, full_meta)
    except CheckpointError as exc:
        run._back_to_work()
        _failed(run, step, exc)
        raise CheckpointFailed(str(exc)) from exc
    run._base_step = base.step if base is not None and base.step != step else None
    return run._writer.staging


def end(run: Run, step: int, error: BaseException | None) -> None:
    writer, run._writer = run._writer, None
    assert writer is not None
    run._attempted()  # the interval counts from here, on should_checkpoint()'s clock
    fenced: PlacementFenced | None = None
    try:
        if error is not None:
            _abandon(run, step, writer, error)
            return  # not an I/O failure: the script's own exception goes on as it is
        try:
            writer.adopt_staged()
            if run._fence is not None:
                run._fence.check()  # the last moment before the rename: abort, not commit
            writer.commit()
        except PlacementFenced as exc:
            writer.abort()
            fenced = exc
        except (CheckpointError, OSError) as exc:
            writer.abort()
            _failed(run, step, exc)
            raise CheckpointFailed(f"checkpoint at step {step} not committed: {exc}") from exc
    finally:
        run._back_to_work()
    if fenced is not None:
        _fenced(run, step, fenced)
    run._last_failed = False
    run.last_checkpoint_step = step
    run.last_checkpoint_time = time.time()
    run.last_save_stats = {
        "bytes_written": writer.stats.bytes_written,
        "bytes_linked": writer.stats.bytes_linked,
        "seconds": writer.stats.seconds,
    }
    if run._hb is not None:
        run._hb.update(last_checkpoint_step=step, last_checkpoint_time=run.last_checkpoint_time)
    run._requests.poll()  # a request made before this state was captured: served by it
    run._requests.committed(run._captured_at, step)
    if run._hb is not None:
        run._hb.publish()
    if run.exit_on_stop and run.should_stop():
        run.exit_stopped()


def _fenced(run: Run, step: int, exc: PlacementFenced) -> NoReturn:
    """Several hosts: the game was placed again elsewhere since this process started.
    Nothing is committed from here on: error.json says why, and the process exits 77."""
    message = f"checkpoint at step {step}: {exc}"
    _exits.exit_with(run, "fenced", message + "; exiting 77 (fenced)", int(ExitCode.FENCED), step)


def _abandon(run: Run, step: int, writer: CheckpointWriter, error: BaseException) -> None:
    """The block raised: nothing is committed. An I/O failure (a full disk under
    save_arrays, under the script's own writes, under torch.save) is a failed checkpoint,
    counted and retried like a failed commit: CheckpointFailed, chained to it."""
    why = _io_failure(error, writer.staging)  # before the abort frees the space
    writer.abort()
    if why is not None:
        _failed(run, step, why)
        raise CheckpointFailed(f"checkpoint at step {step} not committed: {why}") from error


def _failed(run: Run, step: int, exc: BaseException | str) -> None:
    run._last_failed = True
    run._requests.failed()
    say(f"checkpoint at step {step} failed: {exc}")
    if run._hb is not None:
        failures = run._hb.current.checkpoint_failures + 1
        run._hb.update(checkpoint_failures=failures, last_checkpoint_error=str(exc))
        run._hb.publish()  # the supervisor and `status` see it now, not a second later


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
