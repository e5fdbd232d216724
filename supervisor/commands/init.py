"""`rlsup init [PATH]`: write a commented example configuration (never overwrites)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from supervisor.commands._common import EXIT_FAIL, EXIT_OK

HERE = Path(__file__).resolve().parent.parent
EXAMPLE = HERE / "example.toml"
# `--example byo`: a command game (your own training script) and a script to start from.
# `--example sweep`: a short CartPole sweep (docs/sweeps.md).
EXAMPLES = {
    "builtin": EXAMPLE,
    "byo": HERE / "example-byo.toml",
    "sweep": HERE / "example-sweep.toml",
}
BYO_SCRIPT = HERE / "templates" / "byo-train.py.txt"


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
    p.add_argument(
        "--example",
        choices=sorted(EXAMPLES),
        default="builtin",
        help="builtin: rlsup's own learners (default); byo: your own training script as a "
        "command game, with a train.py to start from written beside the file; sweep: a "
        "12-trial CartPole hyper-parameter search that finishes in minutes",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from supervisor.config import resolve_config_path

    path = resolve_config_path(args.path)
    example = getattr(args, "example", "builtin")
    text = EXAMPLES[example].read_text(encoding="utf-8")
    # The interpreter rlsup runs on has the SDK: the example's command uses it out of the box.
    text = text.replace('command = ["python",', f"command = [{json.dumps(sys.executable)},", 1)
    if not _write_new(path, text):
        return EXIT_FAIL
    print(f"wrote {path}")
    if example == "byo":
        script = path.parent / "train.py"
        if _write_new(script, BYO_SCRIPT.read_text(encoding="utf-8"), quiet_if_exists=True):
            print(f"wrote {script}: replace its toy loop with yours (docs/own-trainer.md)")
        else:
            print(f"kept {script}: the game runs it as it is")
    print(f"start it with: rlsup run --config {path}")
    if example == "sweep":
        print(f"then rank its trials with: rlsup results --sweep cartpole --config {path}")
    return EXIT_OK


def _write_new(path: Path, text: str, quiet_if_exists: bool = False) -> bool:
    """Write `text` to a file that must not exist yet (never overwrites)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        if not quiet_if_exists:
            print(f"rlsup init: {path} already exists; not overwriting it", file=sys.stderr)
        return False
    except OSError as exc:
        print(f"rlsup init: cannot create {path}: {exc.strerror}", file=sys.stderr)
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return True
