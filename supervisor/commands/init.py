"""`rlsup init [PATH]`: write a commented example configuration (never overwrites)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from supervisor.commands._common import EXIT_FAIL, EXIT_OK

EXAMPLE = Path(__file__).resolve().parent.parent / "example.toml"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "init",
        help="write an example configuration file",
        description="Write a commented example configuration (CartPole plus two "
        "Atari games, small CPU-friendly modes). Refuses to overwrite a file.",
    )
    p.add_argument(
        "path",
        nargs="?",
        default=None,
        help="where to write it (default: $RLSUP_CONFIG, else ./rlsup.toml)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from supervisor.config import resolve_config_path

    path = resolve_config_path(args.path)
    text = EXAMPLE.read_text(encoding="utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        print(f"rlsup init: {path} already exists; not overwriting it", file=sys.stderr)
        return EXIT_FAIL
    except OSError as exc:
        print(f"rlsup init: cannot create {path}: {exc.strerror}", file=sys.stderr)
        return EXIT_FAIL
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {path}; start it with: rlsup run --config {path}")
    return EXIT_OK
