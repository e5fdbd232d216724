"""How the read-only CLI commands (status, events, plot) show things: usage errors, durations,
human formatting and tables. The data they show comes from `supervisor.observe`.

Stdlib only (plus `supervisor.config`): `rlsup status` must start in milliseconds, so nothing
here may import torch, numpy, envpool or matplotlib.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from supervisor.commands._common import EXIT_USAGE
from supervisor.config import Config


class UsageError(Exception):
    """Bad input from the operator (exit 2); str() is the whole message."""


# ---- arguments and configuration ----------------------------------------------------------


def fail_usage(message: str) -> int:
    print(f"rlsup: error: {message}", file=sys.stderr)
    return EXIT_USAGE


_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.IGNORECASE)
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """'90s', '30m', '24h', '7d', '2w' or plain seconds → seconds; UsageError otherwise."""
    m = _DURATION_RE.fullmatch(text)
    if not m:
        raise UsageError(
            f"bad duration {text!r}: expected a number with a unit s, m, h, d or w "
            "(e.g. 90s, 30m, 24h, 7d)"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2).lower()]


def no_state_message(cfg: Config) -> str:
    return (
        f"no state database at {cfg.db_path} yet: the supervisor has never run with this "
        f"configuration. Start it with `rlsup run --config {cfg.path}` "
        f"(create a configuration with `rlsup init`)."
    )


# ---- human formatting ---------------------------------------------------------------------


def fmt_duration(seconds: float | None) -> str:
    """Compact: 45s, 12m, 3h05m, 2d04h."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def fmt_ago(ts: float | None, now: float) -> str:
    return "-" if ts is None else f"{fmt_duration(now - ts)} ago"


def fmt_time(ts: float | None) -> str:
    """Local wall time, e.g. 2025-01-31 14:05:09."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def fmt_count(n: float | None) -> str:
    """1234 → 1.2k, 12_345_678 → 12.3M."""
    if n is None:
        return "-"
    a = abs(n)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{n / div:.1f}{suffix}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def fmt_num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_detail(detail: Any) -> str:
    """An event's detail dict as `key=value` pairs, one line."""
    if not isinstance(detail, dict):
        return str(detail)
    parts = []
    for k, v in detail.items():
        text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        parts.append(f"{k}={text}")
    return " ".join(parts)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain left-aligned text table (numbers right-aligned)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            numeric = bool(re.fullmatch(r"[-+]?[\d.,]+[kMG%]?", cell))
            out.append(cell.rjust(widths[i]) if numeric else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])
