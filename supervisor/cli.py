"""`rlsup`: the supervisor's command line. Keep heavy imports out (no torch/numpy/envpool)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import supervisor

# (subcommand, module under supervisor.commands).
COMMANDS: tuple[tuple[str, str], ...] = (
    ("run", "run"),
    ("status", "status"),
    ("scale", "scale"),
    ("events", "events"),
    ("stop", "stop"),
    ("init", "init"),
    ("install-service", "install_service"),
    ("plot", "plot"),
    ("check-config", "check_config"),
    ("logs", "logs"),
    ("pull", "pull"),
    ("pin", "pin"),
    ("join", "join"),
    ("doctor", "doctor"),
    ("results", "results"),
    ("report", "report"),
    ("dashboard", "dashboard"),
    ("tensorboard", "tensorboard"),
)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given the command line, with only its command's module imported (`rlsup
    status` need not import what `rlsup run` does: structlog alone costs ~70 ms)."""
    parser = Parser(prog="rlsup", description="Fault-tolerant supervisor for RL training workers.")
    parser.add_argument("--version", action="version", version=f"rlsup {supervisor.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = _command_of(argv)
    for name, module in COMMANDS:
        if wanted is None or name == wanted:
            importlib.import_module(f"supervisor.commands.{module}").register(sub)
    return parser


class Parser(argparse.ArgumentParser):
    """argparse's parser, formatting help with `help_formatter` unless told otherwise; each
    command's parser is one too (argparse makes subparsers of the parser's class)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", help_formatter)
        super().__init__(**kwargs)


def help_formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's HelpFormatter, told the terminal's width as shutil.get_terminal_size() tells
    it (the same help). argparse makes a formatter for every argument it adds (to check its
    metavar), and one left to find the width itself imports shutil, and with it zlib, bz2 and
    lzma: ~2 ms of every `rlsup status`, for help it never prints."""
    return argparse.HelpFormatter(prog, width=terminal_columns() - 2)


def terminal_columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS when a positive number, else the width of
    the terminal on stdout, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


def _command_of(argv: Sequence[str] | None) -> str | None:
    """The command named on the command line, if it is one of ours (else None: all of them
    are registered, for --help and for argparse's message about an unknown one)."""
    args = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args if not a.startswith("-")), None)
    return first if first in {name for name, _ in COMMANDS} else None


def main(argv: Sequence[str] | None = None) -> int:
    if not getattr(supervisor, "RLSUP_SUPERVISOR", False):  # pragma: no cover
        print(
            "rlsup: the imported `supervisor` package is not rlsup's "
            f"({supervisor.__file__}); is supervisord installed in this environment?",
            file=sys.stderr,
        )
        return 2
    # This process is `rlsup` itself (the console script, `python -m supervisor.cli`), not a
    # caller's: what the command's imports build lives until it exits, so the collector is off
    # while they run, and what they built is frozen after: never walked again, in the full
    # collections of a long `rlsup run` nor in the one Python runs at exit (~9 ms of a 60 ms
    # `rlsup status`).
    program = argv is None
    if program:
        gc.disable()
    args = build_parser(argv).parse_args(argv)
    if program:
        gc.freeze()
        gc.enable()
    # `rlsup results --json | head`: a reader that stops reading is no failure of the command,
    # and no traceback (as `rlsup events -f | head` and `rlsup logs | head` already end): the
    # command's own exit code when it had finished (status's 0/3/4), else 0. stdout is flushed
    # here, not by the interpreter at exit, where the error would print "Exception ignored".
    try:
        code = int(args.func(args) or 0)
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe (a hook's): a real error
        _silence_stdout()
        return 0
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    return code


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll says POLLERR)."""
    import select  # a broken pipe's question only: not loaded by every command

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null: whatever is still buffered goes nowhere, quietly."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
