"""`rlsup logs GAME [-n N] [-f]`: a game's worker log (JSON lines), like `tail`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import BinaryIO

from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_config_argument,
    load_config_or_exit,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "logs",
        help="print (and follow) a game's worker log",
        description="The last lines of <state_dir>/logs/GAME.log, each worker's stderr "
        "(structured JSON lines); -f follows it across restarts and rotation.",
    )
    add_config_argument(p)
    p.add_argument("game", help="the game's name from the configuration")
    p.add_argument("-n", "--lines", type=int, default=20, metavar="N", help="lines (default 20)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    names = [g.name for g in cfg.games]
    if args.game not in names:
        print(f"rlsup logs: no game {args.game!r}; configured: {', '.join(names)}", file=sys.stderr)
        return EXIT_USAGE
    path = cfg.logs_dir / f"{args.game}.log"
    try:
        with open(path, "rb") as f:
            for line in deque(f, maxlen=max(0, args.lines)):
                _write(line)
            if args.follow:
                _follow(f, path)
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
        return EXIT_OK
    return EXIT_OK


def _write(line: bytes) -> None:
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()


def _follow(handle: BinaryIO, path: Path) -> None:
    inode = os.fstat(handle.fileno()).st_ino
    while True:
        line = handle.readline()
        if line:
            _write(line)
            continue
        time.sleep(0.5)
        try:
            if os.stat(path).st_ino != inode:  # rotated (`<game>.log` -> `.1`): reopen
                handle.close()
                handle = open(path, "rb")  # noqa: SIM115
                inode = os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            continue
