"""structlog set up once per process: JSON lines off a terminal, a console renderer on one."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from training.streams import TolerantStream

_configured = False


def configure_logging(stream: TextIO | None = None, level: int = logging.INFO) -> None:
    global _configured
    if _configured:
        return
    # A log line that cannot be written (a full disk under a redirected stderr) is dropped,
    # never allowed to stop supervision.
    tolerant = TolerantStream(stream or sys.stderr)
    tty = tolerant.isatty()
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
        logger_factory=structlog.PrintLoggerFactory(tolerant),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    _configured = True
