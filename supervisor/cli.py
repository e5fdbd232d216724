"""`rlsup`: the supervisor's command line. Keep heavy imports out (no torch/numpy/envpool)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

import supervisor

# (subcommand, module under supervisor.commands). Missing modules become stubs.
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
)


def _not_available(name: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        print(f"rlsup {name}: not available in this build", file=sys.stderr)
        return 1

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlsup", description="Fault-tolerant supervisor for RL training workers."
    )
    parser.add_argument("--version", action="version", version=f"rlsup {supervisor.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS:
        try:
            mod = importlib.import_module(f"supervisor.commands.{module}")
        except ImportError as exc:
            if exc.name not in (f"supervisor.commands.{module}",):
                raise
            stub = sub.add_parser(name, help="(not available in this build)")
            stub.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            stub.set_defaults(func=_not_available(name))
            continue
        mod.register(sub)
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
