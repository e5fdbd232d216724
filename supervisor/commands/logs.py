"""`rlsup logs GAME [-n N] [-f] [--json | --pretty]`: a game's worker log, like `tail -F`.

The log is the worker's stderr, structured JSON lines. On a terminal each line is rendered
readably (local time, level, event, key=value; NO_COLOR turns the colours off); off a terminal,
or with `--json`, the lines are printed exactly as written. `--pretty` renders them anywhere.

`-f` follows the file by name across the worker's restarts (appended to) and rotations
(`GAME.log` renamed to `GAME.log.1`, a new `GAME.log` started): the rest of the old file is
printed, then the new one from its start, nothing lost or repeated. A log that does not exist
yet is waited for. Ctrl-C ends it with exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_config_argument,
    load_config_or_exit,
)

POLL_S = 0.2
READ_CHUNK = 1 << 20


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "logs",
        help="print (and follow) a game's worker log",
        description="The last lines of <state_dir>/logs/GAME.log, each worker's stderr "
        "(structured JSON lines), rendered readably on a terminal; -f follows it across "
        "restarts and rotation.",
    )
    add_config_argument(p)
    p.add_argument("game", help="the game's name from the configuration")
    p.add_argument("-n", "--lines", type=int, default=20, metavar="N", help="lines (default 20)")
    p.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines (Ctrl-C ends)"
    )
    form = p.add_mutually_exclusive_group()
    form.add_argument(
        "--json", action="store_true", help="the raw JSON lines (the default off a terminal)"
    )
    form.add_argument(
        "--pretty",
        action="store_true",
        help="render readably even off a terminal (the default on one)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    names = [g.name for g in cfg.games]
    if args.game not in names:
        print(f"rlsup logs: no game {args.game!r}; configured: {', '.join(names)}", file=sys.stderr)
        return EXIT_USAGE
    path = cfg.logs_dir / f"{args.game}.log"
    write = _writer(args)
    try:
        if args.follow:
            follow(path, max(0, args.lines), write)
        else:
            with open(path, "rb") as f:
                if args.lines > 0:
                    f.seek(tail_offset(f, args.lines))
                    write(f.read().splitlines(keepends=True))
    except FileNotFoundError:
        print(f"rlsup logs: no log yet at {path} (the game has not started)", file=sys.stderr)
        return EXIT_FAIL
    except PermissionError:
        print(
            f"rlsup logs: {path}: permission denied (the service's logs belong to its group)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # `rlsup logs pong | head`
        # Nothing more can reach the reader; keep the interpreter's final flush quiet.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    return EXIT_OK


Write = Callable[[list[bytes]], None]


def _writer(args: argparse.Namespace) -> Write:
    from supervisor.observe.logs import colors_wanted, render_log_line

    pretty = args.pretty or (not args.json and sys.stdout.isatty())
    color = colors_wanted(sys.stdout)
    out = sys.stdout.buffer

    def write(lines: list[bytes]) -> None:
        for line in lines:
            if pretty:
                text = render_log_line(line.decode("utf-8", "replace"), color=color)
                out.write(text.encode("utf-8", "replace") + b"\n")
            else:
                out.write(line)
        out.flush()

    return write


def tail_offset(f: BinaryIO, n: int, block: int = 64 * 1024) -> int:
    """Where the last `n` lines of `f` begin (an unterminated last line counts as one, like
    `tail`); with n = 0, the end of the last complete line (so that a line being written is
    printed whole once it is done)."""
    end = f.seek(0, os.SEEK_END)
    pos, found = end, 0
    while pos > 0:
        size = min(block, pos)
        pos -= size
        f.seek(pos)
        chunk = f.read(size)
        idx = len(chunk)
        while (idx := chunk.rfind(b"\n", 0, idx)) >= 0:
            if n == 0:
                return pos + idx + 1
            if pos + idx != end - 1:  # the last line's own terminator starts no line
                found += 1
                if found == n:
                    return pos + idx + 1
    return 0


class LogFollower:
    """`tail -F` for one log path: complete lines, in order, across rotations (the path now
    names another file: the old one is read to its end first), truncation (read again from the
    start) and a path that does not exist yet or for a while (waited for)."""

    def __init__(self, path: Path, handle: BinaryIO | None = None) -> None:
        self.path = path
        self.handle = handle  # the file being read, positioned (None: open `path` when it exists)
        self.partial = b""

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def poll(self) -> list[bytes]:
        """The complete lines written since the last call (maybe none)."""
        if self.handle is None and not self._open():
            return []
        assert self.handle is not None
        lines = self._read()
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return lines  # renamed away, the next one not created yet: keep the old one
        held = os.fstat(self.handle.fileno())
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            lines += self._read()  # what was written to the old file up to its rename
            if self.partial:  # its writer is gone: its last line will never be completed
                lines.append(self.partial + b"\n")
                self.partial = b""
            self.close()
            if self._open():
                lines += self._read()
        elif held.st_size < self.handle.tell():  # truncated in place: start over
            self.handle.seek(0)
            self.partial = b""
            lines += self._read()
        return lines

    def _open(self) -> bool:
        try:
            self.handle = open(self.path, "rb")  # noqa: SIM115 (held across polls)
        except FileNotFoundError:
            return False
        return True

    def _read(self) -> list[bytes]:
        assert self.handle is not None
        lines: list[bytes] = []
        while data := self.handle.read(READ_CHUNK):
            data = self.partial + data
            cut = data.rfind(b"\n") + 1
            lines += data[:cut].splitlines(keepends=True)
            self.partial = data[cut:]
        return lines


def follow(
    path: Path,
    lines: int,
    write: Write,
    *,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print the last `lines` lines of `path`, then what is written to it, until interrupted."""
    handle: BinaryIO | None = None
    try:
        handle = open(path, "rb")  # noqa: SIM115 (the follower closes it)
        handle.seek(tail_offset(handle, lines))
    except FileNotFoundError:
        print(f"rlsup logs: waiting for {path} (the game has not started)", file=sys.stderr)
    follower = LogFollower(path, handle)
    try:
        while True:
            new = follower.poll()
            if new:
                write(new)
            else:
                sleep(poll_s)
    finally:
        follower.close()
