"""structlog set up once per process: JSON lines off a terminal, a console renderer on one."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

_configured = False


def configure_logging(stream: TextIO | None = None, level: int = logging.INFO) -> None:
    global _configured
    if _configured:
        return
    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if tty else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )
    _configured = True
