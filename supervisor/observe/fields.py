"""Values read from disk by everything that reports (status, results, the dashboard, the
metrics): each checked where it is read, and a bad one reported once.

A run dir's files (heartbeat.json, eval.json, progress.csv, error.json) and the supervisor's
accounting.json are written by other processes, and anyone with access to the state dir can
leave a value that cannot be converted (`Infinity`, `NaN`, `"abc"`). Such a field reads as
unknown (None: shown as `-`, null in JSON) and is reported once per file and key for the life of
the process: a dashboard or the metrics thread that re-reads the file every few seconds does
not repeat itself. Stdlib at import time: `rlsup status` must start fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from _thread import allocate_lock
from collections.abc import Mapping
from typing import Any

from training.run_files import (
    MAX_UNIX_TIME,
    clean_eval,
    clean_heartbeat,
    finite_number,
    whole_number,
)

_reported: set[tuple[str, str]] = set()
# threading.Lock itself (`_thread`'s): the lock, without the threading module on a status line.
_lock = allocate_lock()


def report(source: str | os.PathLike[str], key: str, value: Any, want: str) -> None:
    """Say once per (file, key) that a value was left out: through the supervisor's log when
    it is set up (`rlsup run`, the metrics thread), else one line on stderr (the CLI: stdout
    may be a JSON document)."""
    where = os.fspath(source)
    with _lock:
        if (where, key) in _reported:
            return
        _reported.add((where, key))
    shown = json.dumps(value, default=str)  # as the file spells it: Infinity, NaN, "abc"
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    from supervisor.observe import logs  # stdlib; structlog only when the log is set up

    if logs.is_configured():
        import structlog

        structlog.get_logger("rlsup.supervisor").warning(
            "unusable_value", file=where, key=key, value=shown, expected=want
        )
        return
    with contextlib.suppress(OSError, ValueError):  # stderr closed: nothing else to tell
        print(f"rlsup: warning: {where}: {key} = {shown}: not {want}; shown as -", file=sys.stderr)


def forget_reported() -> None:
    """Report every bad value again (tests; a process that wants to repeat itself)."""
    with _lock:
        _reported.clear()


def heartbeat(data: Mapping[str, Any] | None, source: str | os.PathLike[str]) -> dict[str, Any]:
    """A heartbeat's fields with each unusable one left out and reported ({} for None)."""
    if data is None:
        return {}
    clean, bad = clean_heartbeat(data)
    for key in bad:
        top, _, sub = key.partition(".")
        value = data.get(top)
        shown = value.get(sub) if sub and isinstance(value, dict) else value
        report(source, key, shown, expected(sub or top))
    return clean


def evaluation(data: Mapping[str, Any] | None, source: str | os.PathLike[str]) -> dict[str, Any]:
    """An evaluation's fields (eval.json, or a heartbeat's `eval`), each unusable number left
    out and reported ({} for None)."""
    if data is None:
        return {}
    clean, bad = clean_eval(data)
    for key in bad:
        report(source, key, data.get(key), expected(key))
    return clean


def count(
    data: Mapping[str, Any], key: str, source: str | os.PathLike[str], *, label: str = ""
) -> int | None:
    """`data[key]` as a whole number >= 0, or None (absent, or reported as unusable, named
    `label` or the key)."""
    value = data.get(key)
    if value is None or value == "":
        return None
    got = whole_number(_number_of(value))
    if got is None:
        report(source, label or key, value, "a whole number >= 0")
    return got


def number(
    data: Mapping[str, Any],
    key: str,
    source: str | os.PathLike[str],
    lo: float = float("-inf"),
    hi: float = float("inf"),
    *,
    label: str = "",
) -> float | None:
    """`data[key]` as a finite number in [lo, hi] (a JSON number, or a CSV cell's text), or
    None (absent, or reported as unusable, named `label` or the key)."""
    value = data.get(key)
    if value is None or value == "":
        return None
    got = finite_number(_number_of(value), lo, hi)
    if got is None:
        report(source, label or key, value, _range_text(lo, hi))
    return got


def text(data: Mapping[str, Any], key: str, source: str | os.PathLike[str]) -> str | None:
    """`data[key]` when it is text, else None (absent, or reported as unusable)."""
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    report(source, key, value, "text")
    return None


def _number_of(value: Any) -> Any:
    """A CSV cell's text as the number it spells (else the text itself: unusable)."""
    if not isinstance(value, str):
        return value
    try:
        return float(value)
    except ValueError:
        return value


def _range_text(lo: float, hi: float) -> str:
    if lo == float("-inf") and hi == float("inf"):
        return "a finite number"
    if hi == float("inf"):
        return f"a finite number >= {lo:g}"
    return f"a number in [{lo:g}, {hi:g}]"


_EXPECTED = {
    "time": f"a Unix time in [0, {MAX_UNIX_TIME:g}]",
    "last_checkpoint_time": f"a Unix time in [0, {MAX_UNIX_TIME:g}]",
    "mean": "a finite number",
    "mean_return": "a finite number",
    "sps": "a finite number >= 0",
    "phase_deadline_s": "a finite number >= 0",
    "gpu_mem_mb": "a finite number >= 0",
    "seconds": "a finite number >= 0",
    "metrics": "an object of finite numbers",
    "write_failures": "an object of whole numbers",
    "dropped": "an object of whole numbers",
    "eval": "an object",
    "evals": "a list",
    **dict.fromkeys(("phase", "device", "game", "algo", "host", "precision", "writer",
                     "last_checkpoint_error", "last_checkpoint_sync_fallback"), "text"),
    **dict.fromkeys(("mirror_restore", "superseded", "torch_build", "checkpoint_request",
                     "start"), "an object"),
    **dict.fromkeys(("quarantined", "replay_damage"), "a list"),
}  # fmt: skip
_EXPECTED_DEFAULT = "a whole number >= 0"


def expected(key: str) -> str:
    """What a heartbeat or evaluation field must be, in words."""
    return _EXPECTED.get(key, _EXPECTED_DEFAULT)
