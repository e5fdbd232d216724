"""What a script reports beyond its steps: evaluations (`run.evaluation()`, `run.evaluating()`),
its hyper-parameters (`run.params`, from `RLSUP_PARAMS`), and the names a metric may not take.

An evaluation is recorded exactly as rlsup's own worker records one (training/session.py): the
heartbeat's `eval` (the newest, whole) and `evals` (the last EVALS_KEPT, brief), published at
once, so the supervisor turns it into its `evaluation` event (the time split's evaluation
part, the curves, the dashboard) even when the script is killed a moment later; eval.json
(`rlsup results`' EVAL, `rlsup status`); and the manifest of a checkpoint taken at its step
(`meta.eval`, what retention's keep_best ranks). A value that is no finite number is dropped
and counted (the heartbeat's `dropped`), never a crash of the script or of a reader.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from checkpoints import write_json_atomic
from rlsup._errors import SdkError
from training import protocol as P
from training.protocol import Phase

if TYPE_CHECKING:
    from rlsup._run import Run

EVALUATING_DEADLINE_S = 3600.0  # `with run.evaluating():` the step may stand still this long
# The progress.csv columns rlsup writes itself: a metric of the same name would overwrite one.
RESERVED_METRICS = frozenset(P.PROGRESS_COLUMNS)
# An evaluation's own fields (eval.json): `**extra` may not take their names.
EVAL_FIELDS = ("step", "mean", "episodes", "seconds", "time")
MAX_PARAM_TEXT = 1000


def check_metric_names(metrics: dict[str, Any]) -> None:
    """ValueError naming a metric whose name is one of rlsup's own progress columns."""
    taken = sorted(RESERVED_METRICS.intersection(metrics))
    if taken:
        raise ValueError(
            f"run.heartbeat(): metric name {taken[0]!r} is reserved (rlsup writes that "
            f"progress.csv column itself: {', '.join(P.PROGRESS_COLUMNS)}); rename it, e.g. "
            f"{'my_' + taken[0]!r}"
            + ("; pass the mean return as mean_return=..." if taken[0] == "mean_return" else "")
        )


def _say(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a full log disk is no crash of the script
        print(f"rlsup: {message}", file=sys.stderr, flush=True)


# ---- hyper-parameters ------------------------------------------------------------------------


def _scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return len(value) <= MAX_PARAM_TEXT
    return value is None or isinstance(value, bool | int)


def params_from_env(defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """`run.params`: `defaults` (the script's own, for a run outside rlsup), overridden key by key
    by `RLSUP_PARAMS` (the config's `params`). SdkError when the variable is no JSON object of
    scalars (a number, a string, a boolean): a script must never train on half its settings."""
    out = dict(defaults or {})
    raw = os.environ.get(P.PARAMS_ENV)
    if raw is None or raw.strip() == "":
        return out
    shown = raw if len(raw) <= 200 else raw[:200] + "..."
    try:
        given = json.loads(raw)
    except ValueError as exc:
        raise SdkError(
            f"environment variable {P.PARAMS_ENV}={shown!r}: not JSON ({exc}); expected an "
            'object of scalars, e.g. {"lr": 0.0003}'
        ) from None
    if not isinstance(given, dict):
        raise SdkError(
            f"environment variable {P.PARAMS_ENV}={shown!r}: a JSON {type(given).__name__}, "
            'expected an object of scalars, e.g. {"lr": 0.0003}'
        )
    for key, value in given.items():
        if not _scalar(value):
            raise SdkError(
                f"environment variable {P.PARAMS_ENV}: {key} = {value!r} is no scalar (a finite "
                f"number, a string of at most {MAX_PARAM_TEXT} characters, a boolean)"
            )
    out.update(given)
    return out


# ---- evaluations -----------------------------------------------------------------------------


def _number(value: Any, what: str) -> float | None:
    """A finite float; None for a number that is not finite; SdkError for no number at all."""
    if isinstance(value, bool):
        raise SdkError(f"run.evaluation(): {what}={value!r} is not a number")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise SdkError(f"run.evaluation(): {what}={value!r} is not a number") from None
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _count(value: Any, what: str) -> int | None:
    """A whole number >= 0 (an integral float is taken); None when it is not finite, negative
    or fractional; SdkError for no number at all."""
    f = _number(value, what)
    if f is None or f < 0 or f != int(f) or f > P.MAX_COUNT:
        return None
    return int(value) if isinstance(value, int) else int(f)


def report(
    run: Run,
    step: Any,
    mean_return: Any,
    episodes: Any,
    seconds: Any,
    extra: dict[str, Any],
) -> bool:
    """`run.evaluation()`'s body: see its docstring."""
    clash = sorted(set(EVAL_FIELDS).intersection(extra))
    if clash:
        raise ValueError(
            f"run.evaluation(): {clash[0]!r} is one of the evaluation's own fields "
            f"({', '.join(EVAL_FIELDS)}); give it another name"
        )
    hb = run._start_heartbeat()
    at, mean = _count(step, "step"), _number(mean_return, "mean_return")
    if at is None or mean is None:
        bad = f"step={step!r}" if at is None else f"mean_return={mean_return!r}"
        hb.count_dropped("evaluation")
        hb.publish()
        _say(f"evaluation dropped: {bad} is no finite number (counted in the heartbeat)")
        return False
    fields_dropped = 0
    count = None if episodes is None else _count(episodes, "episodes")
    fields_dropped += episodes is not None and count is None
    if seconds is None and run._evaluating_since is not None:
        seconds = time.monotonic() - run._evaluating_since  # timed by `run.evaluating()`
    secs = None if seconds is None else _number(seconds, "seconds")
    if secs is not None and secs < 0:
        secs = None
    fields_dropped += seconds is not None and secs is None
    kept: dict[str, Any] = {}
    for key, value in extra.items():
        if value is None or isinstance(value, bool | str):
            kept[key] = value
        elif (number := _number(value, key)) is not None:
            kept[key] = number
        else:
            fields_dropped += 1
    if fields_dropped:
        hb.count_dropped("evaluation_field", fields_dropped)
    result: dict[str, Any] = {
        **kept,
        "step": at,
        "mean": mean,
        "episodes": count,
        "seconds": None if secs is None else round(secs, 3),
        "time": time.time(),
    }
    brief = {k: result[k] for k in EVAL_FIELDS}
    hb.update(eval=result, evals=[*hb.current.evals, brief][-P.EVALS_KEPT :])
    hb.publish()  # on disk now: the supervisor records it even if the script dies next
    # A checkpoint taken at this step records it (what keep_best ranks), as the worker's does.
    std = kept.get("std")
    run._evaluated = {
        "step": at,
        "mean": mean,
        "std": std if isinstance(std, float) else None,
        "episodes": count,
    }
    try:
        write_json_atomic(run.run_dir / P.EVAL_FILE, result)
    except OSError as exc:
        hb.count_failure("eval")
        hb.publish()
        _say(f"evaluation at step {at}: {P.EVAL_FILE} not written: {exc}")
    return True


class Evaluating:
    """`with run.evaluating():` the phase is `evaluating` (the step may stand still for
    `deadline_s`, not the training deadline), and an evaluation reported inside the block
    without `seconds` is timed by it."""

    def __init__(self, run: Run, deadline_s: float) -> None:
        if not math.isfinite(deadline_s) or deadline_s <= 0:
            raise SdkError(f"run.evaluating(deadline_s={deadline_s!r}): must be > 0")
        self._run, self._deadline_s = run, deadline_s

    def __enter__(self) -> Evaluating:
        run = self._run
        run._start_heartbeat()
        run._phase(Phase.EVALUATING, self._deadline_s)
        run._evaluating_since = time.monotonic()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._run._evaluating_since = None
        self._run._back_to_work()
