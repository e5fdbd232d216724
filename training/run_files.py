"""A worker's run directory as another process reads it: the files' names, and every value of
them checked where it is read (`clean_heartbeat`, `finite_number`, `read_json_file`).

Part of the contract (`training/protocol.py` hands every name on): apart from it because a
reader needs none of the rest, neither the heartbeat's dataclass nor the exit codes, phases and
locks; `rlsup status` reads a run dir's files on every line. Stdlib only.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from typing import Any

# Files inside a worker's run directory.
HEARTBEAT_FILE = "heartbeat.json"
PROGRESS_FILE = "progress.csv"
ERROR_FILE = "error.json"
EVAL_FILE = "eval.json"
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = "worker.lock"
# A sweep's trial run: the trial and the values the study drew for it, written by the supervisor
# before the run's first start ({"sweep", "trial", "params"}; docs/sweeps.md).
TRIAL_FILE = "trial.json"

PROGRESS_COLUMNS = (
    "time",
    "wall_s",
    "global_step",
    "episodes",
    "sps",
    "mean_return",
    "num_envs",
    "batch_size",
    "resume_count",
)


# ---- reading what another process wrote: every number checked where it is read --------------
# A heartbeat or an evaluation is written by rlsup's worker, by a user's script, or by anyone
# with access to the run dir; `json.dump(float("inf"))` writes `Infinity`. A value of the wrong
# type, not finite or out of range is no value: readers leave it out (status shows `-`), never
# convert it blindly (int(inf) raises OverflowError, "abc" > 0 TypeError).

MAX_COUNT = 2**63 - 1  # steps, episodes, pids: SQLite's INTEGER holds them
MAX_UNIX_TIME = 1e11  # seconds (year 5138): datetime can still show it


def whole_number(value: Any, lo: int = 0, hi: int = MAX_COUNT) -> int | None:
    """A JSON number in [lo, hi] as an int (a float is truncated), else None (bool, text,
    NaN, infinity or out of range)."""
    number = finite_number(value, lo, hi)
    return None if number is None else int(value)


def finite_number(value: Any, lo: float = -math.inf, hi: float = math.inf) -> float | None:
    """A JSON number that is finite and in [lo, hi], else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        return None
    return number if math.isfinite(number) and lo <= number <= hi else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _list(value: Any) -> list[Any] | None:
    return value if isinstance(value, list) else None


def _seconds(value: Any) -> float | None:
    return finite_number(value, 0.0)


def _time(value: Any) -> float | None:
    return finite_number(value, 0.0, MAX_UNIX_TIME)


# Each heartbeat field's check: the value to keep, or None when it is unusable.
_COUNT = whole_number
_SECONDS = _seconds
_TIME = _time
HEARTBEAT_CHECKS: dict[str, Any] = {
    **dict.fromkeys(("seq", "pid", "global_step", "total_steps", "episodes", "num_envs",
                     "batch_size", "last_checkpoint_step", "resumed_from_step", "schema",
                     "resume_count", "threads", "checkpoint_failures",
                     "checkpoint_sync_fallbacks"), _COUNT),
    **dict.fromkeys(("phase_deadline_s", "sps", "gpu_mem_mb"), _SECONDS),
    **dict.fromkeys(("time", "last_checkpoint_time"), _TIME),
    "mean_return": finite_number,
    **dict.fromkeys(("phase", "device", "game", "algo", "last_checkpoint_error", "host",
                     "precision", "writer", "last_checkpoint_sync_fallback"), _text),
    **dict.fromkeys(("mirror_restore", "superseded", "torch_build", "checkpoint_request",
                     "start"), _dict),
    **dict.fromkeys(("quarantined", "replay_damage"), _list),
}  # fmt: skip
EVAL_CHECKS: dict[str, Any] = {
    "mean": finite_number, "step": _COUNT, "episodes": _COUNT, "seconds": _SECONDS,
    "time": _TIME,
}  # fmt: skip


def clean_eval(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """An evaluation's fields (eval.json, a heartbeat's `eval`) with every unusable number
    left out, and the names of those left out."""
    return _checked(data, EVAL_CHECKS)


def clean_heartbeat(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A heartbeat's fields with every unusable value left out (fields unknown here are kept
    as they are), and the names of those left out; an `eval` is cleaned field by field
    ("eval.step" names one of its numbers), `metrics`, `write_failures` and `dropped` keep
    their numbers."""
    out, bad = _checked(data, HEARTBEAT_CHECKS)
    if "eval" in data:
        ev = _dict(data["eval"])
        if ev is None and data["eval"] is not None:
            bad.append("eval")
        if ev is not None:
            out["eval"], bad_eval = clean_eval(ev)
            bad += [f"eval.{key}" for key in bad_eval]
    if "evals" in data:
        evals = _list(data["evals"])
        out["evals"] = [clean_eval(e)[0] for e in evals or [] if isinstance(e, dict)]
        if evals is None:
            bad.append("evals")
    counted = (("metrics", finite_number), ("write_failures", _COUNT), ("dropped", _COUNT))
    for key, check in counted:
        if key in data:
            given = _dict(data[key])
            kept = {k: v for k, v in (given or {}).items() if check(v) is not None}
            out[key] = kept
            if given is None or len(kept) < len(given):
                bad.append(key)
    return out, bad


def _checked(
    data: Mapping[str, Any], checks: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    bad: list[str] = []
    for key, value in data.items():
        check = checks.get(key)
        if check is None or value is None:
            out[key] = value
        elif (kept := check(value)) is not None:
            out[key] = kept
        else:
            bad.append(key)
    return out, bad


MAX_STATE_FILE_BYTES = 4 << 20


def read_regular_file(path: str | os.PathLike[str], limit: int = MAX_STATE_FILE_BYTES) -> bytes:
    """The bytes of a small regular file, read without ever blocking or following a link.

    Run-dir files are written by another process and can be replaced by anyone with access to
    the directory: a FIFO planted as `heartbeat.json` must not block the supervisor's tick (a
    plain open() of a FIFO waits for a writer), nor a symlink lead it elsewhere. OSError
    (ELOOP, or EINVAL for anything but a regular file) otherwise.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(22, "not a regular file", str(path))
        chunks, size = [], 0
        while size < limit and (chunk := os.read(fd, min(1 << 20, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(read_regular_file(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
