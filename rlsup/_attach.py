"""`rlsup.attach()`: the run as the supervisor describes it to the script through the
environment (`RLSUP_RUN_DIR`, `RLSUP_TOTAL_STEPS`, `RLSUP_CHECKPOINT_EVERY_S`, the mode's knobs,
`RLSUP_PARAMS`, ...; docs/own-trainer.md), each variable checked where it is read and winning
over the script's own arguments (which a run outside rlsup goes by), made into a `Run`; and its
run directory, made and locked (`make_run_dir`, `take_lock`: one run directory, one writer).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlsup import _evaluation
from rlsup._errors import RunDirLocked, SdkError
from training import protocol as P

if TYPE_CHECKING:
    from rlsup._run import Run

DEFAULT_CHECKPOINT_EVERY_S = P.DEFAULT_CHECKPOINT_EVERY_S  # paced when dear (Run)


def env_int(name: str, default: int | None) -> int | None:
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
    from rlsup._run import Run  # which imports this module: taken where it is made

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
        seed=env_int(P.SEED_ENV, None),
        resume_count=env_int(P.RESUME_COUNT_ENV, 0) or 0,
        mode=os.environ.get(P.MODE_ENV) or None,
        knobs=_knobs_from_env(),
        total_steps=env_int(P.TOTAL_STEPS_ENV, total_steps) or total_steps or 0,
        checkpoint_every_s=every_s,
        checkpoint_every_steps=checkpoint_every_steps,
        keep=env_int(P.KEEP_CHECKPOINTS_ENV, keep) or keep or 3,
        heartbeat_at_once=heartbeat,
        step_deadline_s=step_deadline_s,
        handle_signals=handle_signals,
        exit_on_stop=exit_on_stop,
        algo=algo,
        device=device,
        lock_wait_s=lock_wait_s,
        params=_evaluation.params_from_env(params),
        keep_best=keep_best,
        host_mtbf_s=_env_float(P.MTBF_ENV, 0.0) or None,  # unset: unknown, or not adaptive
    )


def _knobs_from_env() -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    num_envs = env_int(P.NUM_ENVS_ENV, None)
    if num_envs is not None:
        knobs["num_envs"] = num_envs
    batch = os.environ.get(P.BATCH_SIZE_ENV)
    if batch:
        knobs["batch_size"] = batch if batch == "auto" else env_int(P.BATCH_SIZE_ENV, None)
    return knobs


def make_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SdkError(f"run directory {run_dir}: cannot create it: {exc}") from exc
    if not run_dir.is_dir() or not os.access(run_dir, os.W_OK | os.X_OK):
        raise SdkError(f"run directory {run_dir}: not a writable directory")


def take_lock(run_dir: Path, wait_s: float) -> int:
    try:
        return P.lock_run_dir(run_dir, wait_s)
    except P.RunDirBusy as exc:
        raise RunDirLocked(
            f"run directory {run_dir} is in use by another process (pid "
            f"{exc.holder}, holding {run_dir / P.LOCK_FILE}): one run directory, "
            "one writer"
        ) from exc
