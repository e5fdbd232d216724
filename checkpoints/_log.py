"""The checkpoint store's logger: structlog's when it is importable (the service, the built-in
worker), else a stdlib `logging` adapter that takes the same `log.info("event", key=value)`
calls. The SDK (`import rlsup`) reaches the store from a user's own interpreter, which may have
nothing but the standard library: structlog is a dependency of the service, not of the SDK."""

from __future__ import annotations

import logging
from typing import Any, Protocol


class Logger(Protocol):
    """What the store calls: structlog's bound loggers and `StdlibLogger` both are one."""

    def info(self, event: str, **kw: Any) -> Any: ...

    def warning(self, event: str, **kw: Any) -> Any: ...

    def error(self, event: str, **kw: Any) -> Any: ...


class StdlibLogger:
    """`log.warning("event", key=value)` as one stdlib record, `event key=value ...`: without a
    logging configuration, Python's last-resort handler puts warnings and errors on stderr
    (which the supervisor keeps in the game's log), and info is dropped."""

    def __init__(self, name: str, **bound: Any) -> None:
        self._log = logging.getLogger(name)
        self._bound = bound

    def bind(self, **kw: Any) -> StdlibLogger:
        return StdlibLogger(self._log.name, **{**self._bound, **kw})

    def _emit(self, level: int, event: str, kw: dict[str, Any]) -> None:
        if self._log.isEnabledFor(level):
            pairs = " ".join(f"{k}={v!r}" for k, v in {**self._bound, **kw}.items())
            self._log.log(level, "%s %s", event, pairs)

    def debug(self, event: str, **kw: Any) -> None:
        self._emit(logging.DEBUG, event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._emit(logging.INFO, event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._emit(logging.WARNING, event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._emit(logging.ERROR, event, kw)


def get_logger(name: str) -> Logger:
    try:
        import structlog
    except ImportError:
        return StdlibLogger(name)
    log: Logger = structlog.get_logger(name)
    return log
