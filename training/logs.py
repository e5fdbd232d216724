"""structlog set-up for a worker process: JSON lines when not a terminal, console when it is.

structlog is imported only by `configure()`, which the built-in worker calls: the heartbeat
imports this module for `STDERR` alone, and the SDK (`import rlsup`) must import without the
service's dependencies (a user's own interpreter may have only the standard library)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from training.streams import TolerantStream

if TYPE_CHECKING:
    import structlog

# The worker's log sink: a full disk under the log file drops lines, never the worker.
STDERR = TolerantStream(sys.stderr)


def configure(**bind: object) -> structlog.stdlib.BoundLogger:
    import structlog

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
