"""`rlsup`: the supervisor's command line. Keep heavy imports out (no torch/numpy/envpool)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

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
)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given the command line, with only its command's module imported (`rlsup
    status` need not import what `rlsup run` does: structlog alone costs ~70 ms)."""
    parser = argparse.ArgumentParser(
        prog="rlsup", description="Fault-tolerant supervisor for RL training workers."
    )
    parser.add_argument("--version", action="version", version=f"rlsup {supervisor.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = _command_of(argv)
    for name, module in COMMANDS:
        if wanted is None or name == wanted:
            importlib.import_module(f"supervisor.commands.{module}").register(sub)
    return parser


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
    args = build_parser(argv).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
