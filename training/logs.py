"""structlog set-up for a worker process: JSON lines when not a terminal, console when it is."""

from __future__ import annotations

import logging
import sys

import structlog

from training.streams import TolerantStream

# The worker's log sink: a full disk under the log file drops lines, never the worker.
STDERR = TolerantStream(sys.stderr)


def configure(**bind: object) -> structlog.stdlib.BoundLogger:
    renderer: structlog.typing.Processor
    if STDERR.isatty():
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=STDERR),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    log: structlog.stdlib.BoundLogger = structlog.get_logger("rlsup.worker").bind(**bind)
    return log
