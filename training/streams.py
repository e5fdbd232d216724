"""A log stream that never raises: a log line that cannot be written (the disk under the log
file is full, an I/O error) is dropped and counted, never allowed to crash the process that
logs it. Torch-free: the supervisor's logs use it too."""

from __future__ import annotations

from typing import TextIO


class TolerantStream:
    """Wraps a text stream; `write` and `flush` swallow OSError and count the lost writes.
    (What the buffered stream could not write stays in its buffer and goes out with the next
    write that succeeds, once space returns.)"""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.failures = 0

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError:
            self.failures += 1
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            self.failures += 1

    def isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False
