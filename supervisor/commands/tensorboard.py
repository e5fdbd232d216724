"""`rlsup tensorboard [--config PATH] [--print] [-- TENSORBOARD ARGS]`: TensorBoard over every
run of the state dir, one named run each (`--logdir_spec pong/s1:<run_dir>/tb,...`).

The built-in learners write `<run_dir>/tb/` themselves; for command games the supervisor's
tracking bridge writes it ([tracking] tensorboard, on by default). `--print` prints the command
line instead of running it (exit 0); exit 1 when no run has event files yet, 2 for a bad
configuration.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from supervisor.commands._common import EXIT_FAIL, EXIT_OK, add_config_argument, load_config_or_exit
from supervisor.config import Config

TB_DIR = "tb"  # training/metrics.py's and the tracking bridge's


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tensorboard",
        help="run TensorBoard over every run of the state dir (or --print its command line)",
        description="TensorBoard over each run's <run_dir>/tb/, one named run per game and seed.",
    )
    add_config_argument(p)
    p.add_argument("--print", action="store_true", help="print the command line, run nothing")
    p.add_argument(
        "args", nargs=argparse.REMAINDER, help="passed on to tensorboard (after --), e.g. --port"
    )
    p.set_defaults(func=run)


def logdir_spec(cfg: Config) -> list[tuple[str, Path]]:
    """(run name, its tb dir) for each configured run that has one."""
    out: list[tuple[str, Path]] = []
    for spec in cfg.games:
        tb = cfg.run_dir(spec.name) / TB_DIR
        if tb.is_dir():
            out.append((spec.name, tb))
    return out


def command(cfg: Config, extra: list[str]) -> list[str] | None:
    runs = logdir_spec(cfg)
    if not runs:
        return None
    if any("," in str(path) for _, path in runs):
        # TensorBoard splits the spec at commas: one run each, by its plain --logdir instead.
        runs = [(name, path) for name, path in runs if "," not in str(path)] or runs[:1]
    spec = ",".join(f"{name}:{path}" for name, path in runs)
    program = shutil.which("tensorboard")
    argv = [program] if program else [sys.executable, "-m", "tensorboard.main"]
    return [*argv, "--logdir_spec", spec, *[a for a in extra if a != "--"]]


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    argv = command(cfg, list(args.args or []))
    if argv is None:
        print(
            f"rlsup tensorboard: no run under {cfg.state_dir / 'runs'} has TensorBoard event "
            "files yet (<run_dir>/tb/): start the games first",
            file=sys.stderr,
        )
        return EXIT_FAIL
    if args.print:
        print(shlex.join(argv))
        return EXIT_OK
    os.execvp(argv[0], argv)
    return EXIT_OK  # not reached
