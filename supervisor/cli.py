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
    ("join", "join"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlsup", description="Fault-tolerant supervisor for RL training workers."
    )
    parser.add_argument("--version", action="version", version=f"rlsup {supervisor.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for _name, module in COMMANDS:
        importlib.import_module(f"supervisor.commands.{module}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if not getattr(supervisor, "RLSUP_SUPERVISOR", False):  # pragma: no cover
        print(
            "rlsup: the imported `supervisor` package is not rlsup's "
            f"({supervisor.__file__}); is supervisord installed in this environment?",
            file=sys.stderr,
        )
        return 2
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
