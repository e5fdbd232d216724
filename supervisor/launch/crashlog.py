"""Why a command game died, read from its log: a signal by its name, a Python traceback from its
first line through the exception line (never a tail cut mid-way, never the info lines that
happened to come last), and whether its last words were an ImportError (its interpreter lacks
a module: restarting cannot help). Pure text work over the end of the log and its `.1`."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

TRACEBACK_HEAD = "Traceback (most recent call last):"
READ_BYTES = 64 << 10  # how far back a traceback's first line is looked for
MESSAGE_CHARS = 4096  # the most an event or a status note carries
TAIL_LINES = 20  # without a traceback: the log's last lines
IMPORT_ERRORS = ("ModuleNotFoundError", "ImportError")


@dataclass(frozen=True)
class Death:
    """What the log says of a death: `message` for events and notes, `exception` the
    exception line when a traceback was found, `import_error` when that traceback was an
    ImportError and the process's last words."""

    message: str
    exception: str | None = None
    import_error: bool = False


def signal_message(returncode: int) -> str:
    """`-9` → "killed by signal 9 (SIGKILL)"."""
    number = -returncode
    try:
        return f"killed by signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"killed by signal {number}"


def read_end(path: Path, max_bytes: int = READ_BYTES) -> tuple[str, bool]:
    """The last `max_bytes` of the log, preceded by the end of its `.1` when the log is shorter
    (rotated while the worker ran, maybe mid-traceback). True when the text was cut at its
    start (its first line may be partial)."""
    chunks: list[bytes] = []
    cut = False
    want = max_bytes
    for p in (path, path.with_name(path.name + ".1")):
        try:
            with p.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - want))
                chunks.insert(0, f.read(want))
        except OSError:
            continue
        cut = size > want
        want -= min(size, want)
        if want <= 0:
            break
    return b"".join(chunks).decode("utf-8", "replace"), cut


def _is_exception_line(line: str) -> bool:
    return bool(line) and not line[0].isspace() and not line.startswith(TRACEBACK_HEAD)


def last_traceback(lines: list[str]) -> tuple[list[str], int] | None:
    """The last traceback in `lines`, from its first line through the exception line, and the
    index of the line after it; None when there is none (or its exception line is not there)."""
    starts = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK_HEAD]
    for start in reversed(starts):
        for end in range(start + 1, len(lines)):
            if _is_exception_line(lines[end]):
                return lines[start : end + 1], end + 1
    return None


def _fit(block: list[str]) -> str:
    """The traceback within MESSAGE_CHARS: its first line, the frames nearest the error and
    the exception line; the middle frames give way first."""
    text = "\n".join(block)
    if len(text) <= MESSAGE_CHARS:
        return text
    head, tail = block[0], [block[-1][: MESSAGE_CHARS // 2]]
    room = MESSAGE_CHARS - len(head) - len(tail[0]) - 16
    for line in reversed(block[1:-1]):
        if room - len(line) - 1 < 0:
            break
        tail.insert(0, line)
        room -= len(line) + 1
    return "\n".join([head, "  ...", *tail])


def death_from_log(path: Path, returncode: int) -> Death | None:
    """What the log `path` says of a death with `returncode`; None when it says nothing."""
    if returncode < 0:
        return Death(signal_message(returncode))
    text, cut = read_end(path)
    lines = [line.rstrip() for line in text.splitlines()]
    if cut and lines:
        lines = lines[1:]  # the first may be partial
    found = last_traceback(lines)
    if found is not None:
        block, after = found
        exception = block[-1].strip()[:500]
        last_words = not any(line.strip() for line in lines[after:])
        imported = last_words and exception.split(":", 1)[0].strip() in IMPORT_ERRORS
        return Death(_fit(block), exception, imported)
    tail = "\n".join([line for line in lines if line.strip()][-TAIL_LINES:])
    return Death(tail[-MESSAGE_CHARS:]) if tail else None
