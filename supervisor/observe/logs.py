"""Log formats: the supervisor's own log (structlog set up once per process: JSON lines off a
terminal, a console renderer on one, a syslog priority on each line under journald), and the
readable rendering of a worker's JSON lines for `rlsup logs`.

Stdlib at import time (structlog is imported by `configure_logging` only): `rlsup logs` uses
the renderer and must start fast.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from structlog.typing import EventDict, Processor, WrappedLogger

_configured = False

LEVELS = ("debug", "info", "warning", "error")
"""The choices of `rlsup run --log-level`, lowest first."""

# syslog(3) priorities, as systemd reads them from a `<N>` line prefix (SyslogLevelPrefix=).
SYSLOG_PRIORITY = {
    "critical": 2,
    "exception": 3,
    "error": 3,
    "warning": 4,
    "warn": 4,
    "notice": 5,
    "info": 6,
    "debug": 7,
}


def level_number(name: str) -> int:
    """'warning' → logging.WARNING; ValueError for an unknown name."""
    if name.lower() not in LEVELS:
        raise ValueError(f"unknown log level {name!r}; choose one of {', '.join(LEVELS)}")
    return logging.getLevelNamesMapping()[name.upper()]


def colors_wanted(stream: Any, env: Mapping[str, str] | None = None) -> bool:
    """ANSI colours only on a terminal, and never when NO_COLOR is set and non-empty
    (https://no-color.org)."""
    env = os.environ if env is None else env
    if env.get("NO_COLOR"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def on_journal(stream: Any, env: Mapping[str, str] | None = None) -> bool:
    """Is `stream` systemd's journal? The documented check (systemd.exec(5), $JOURNAL_STREAM):
    the variable's `device:inode` is the stream's own, so a redirected stderr is not taken
    for the journal even under systemd."""
    env = os.environ if env is None else env
    expected = env.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(part) for part in expected.split(":"))
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class SyslogPrefix:
    """Wraps the final renderer: `<4>` before a warning, `<3>` before an error, ..., so that
    journald stores each line with its priority (`journalctl -p warning -u rlsup`)."""

    def __init__(self, renderer: Processor) -> None:
        self.renderer = renderer

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
        level = str(event_dict.get("level", method_name)).lower()
        priority = SYSLOG_PRIORITY.get(level, SYSLOG_PRIORITY["info"])
        line = self.renderer(logger, method_name, event_dict)
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        return f"<{priority}>{line}"


def is_configured() -> bool:
    """Whether this process's log is set up (`rlsup run`): a warning then goes through it."""
    return _configured


def configure_logging(
    stream: TextIO | None = None,
    level: int = logging.INFO,
    env: Mapping[str, str] | None = None,
) -> None:
    global _configured
    if _configured:
        return
    import structlog

    from training.streams import TolerantStream

    target = stream or sys.stderr
    # A log line that cannot be written (a full disk under a redirected stderr) is dropped,
    # never allowed to stop supervision.
    tolerant = TolerantStream(target)
    renderer: Processor = (
        structlog.dev.ConsoleRenderer(colors=colors_wanted(tolerant, env))
        if tolerant.isatty()
        else structlog.processors.JSONRenderer()
    )
    if on_journal(target, env):
        renderer = SyslogPrefix(renderer)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(tolerant),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    _configured = True


# ---- reading a worker's log (`rlsup logs`) ------------------------------------------------

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_DIM = "\x1b[2m"
_LEVEL_STYLE = {
    "critical": "\x1b[1;31m",
    "exception": "\x1b[31m",
    "error": "\x1b[31m",
    "warning": "\x1b[33m",
    "warn": "\x1b[33m",
    "info": "\x1b[32m",
    "debug": "\x1b[2m",
}
_LEVEL_WIDTH = 8  # "critical", "warning "
_HIDDEN = ("timestamp", "level", "event")


def render_log_line(
    line: str, *, color: bool = False, local: Callable[[float], time.struct_time] | None = None
) -> str:
    """One JSON log line, readable: `2026-11-24 09:31:25 warning  checkpoint_failed  step=1234
    error=...` (local time, level, event, then the other fields as key=value; a value of
    several lines, such as a traceback, follows on its own lines, indented). A line that is not
    a JSON object is returned as it is. No trailing newline."""
    text = line.rstrip("\r\n")
    try:
        record = json.loads(text)
    except ValueError:
        return text
    if not isinstance(record, dict):
        return text

    def paint(style: str, s: str) -> str:
        return f"{style}{s}{_RESET}" if color and style else s

    level = str(record.get("level", ""))
    head = [
        paint(_DIM, _fmt_timestamp(record.get("timestamp"), local or time.localtime)),
        paint(_LEVEL_STYLE.get(level.lower(), ""), level.ljust(_LEVEL_WIDTH)),
        paint(_BOLD, str(record.get("event", ""))),
    ]
    pairs, blocks = [], []
    for key, value in record.items():
        if key in _HIDDEN:
            continue
        if isinstance(value, str) and "\n" in value:
            blocks.append(value.rstrip("\n"))
            continue
        pairs.append(f"{paint(_DIM, key + '=')}{_fmt_value(value)}")
    out = " ".join(head) + ("  " + " ".join(pairs) if pairs else "")
    for block in blocks:
        out += "\n" + "\n".join("    " + ln for ln in block.splitlines())
    return out


def _fmt_timestamp(value: Any, local: Callable[[float], time.struct_time]) -> str:
    """structlog's ISO UTC timestamp ('2026-11-24T09:31:25.123456Z') in local time."""
    if not isinstance(value, str):
        return "-"
    try:
        ts = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return value
    return time.strftime("%Y-%m-%d %H:%M:%S", local(ts))


def _fmt_value(value: Any) -> str:
    """Strings bare unless they would read ambiguously (empty, spaces, '=', quotes); anything
    else as compact JSON."""
    if isinstance(value, str):
        if value and not any(c in value for c in ' ="\t'):
            return value
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
