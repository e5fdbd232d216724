"""Helpers shared by subcommands: the --config option and loading it with exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from supervisor.config import Config, ConfigError, GameSpec, load_config, resolve_config_path

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
# `rlsup run`: another supervisor holds the state dir (EX_CANTCREAT). Distinct, so that a
# systemd unit does not restart into the same refusal (RestartPreventExitStatus=2 73).
EXIT_LOCKED = 73
# `rlsup status`: the supervisor is not running (as `systemctl is-active` says 3), or it runs
# and a game is FATAL. Monitoring scripts rely on them.
EXIT_NOT_RUNNING = 3
EXIT_FATAL_GAME = 4


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help="configuration file (default: $RLSUP_CONFIG, else ./rlsup.toml)",
    )


def load_config_or_exit(args: argparse.Namespace) -> Config:
    """The validated configuration, or a one-paragraph message and SystemExit(2)."""
    path = resolve_config_path(getattr(args, "config", None))
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"rlsup: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def become_state_owner(state_dir: Path) -> None:
    """Under sudo, write as the account that owns the state dir (the service's): a run dir,
    lock file or checkpoint left to root is one the service's worker can no longer open."""
    if os.geteuid() != 0:
        return
    try:
        st = state_dir.stat()
    except FileNotFoundError:
        return  # nothing of the service's yet: root's own state dir
    if st.st_uid == 0:
        return
    os.setgroups([])
    os.setresgid(st.st_gid, st.st_gid, st.st_gid)
    os.setresuid(st.st_uid, st.st_uid, st.st_uid)


def retention_of(game: GameSpec) -> dict[str, Any]:
    """A game's retention settings (CheckpointStore's keyword arguments) from its `args`, the
    worker's defaults otherwise: a command that commits into a game's store (`rlsup pull`) or
    shows what it keeps (`rlsup pin --list`) applies the worker's own policy, so it never
    deletes a best-evaluated, milestone or pinned checkpoint the worker keeps."""
    from training.args import WorkerConfig

    if game.command is not None:
        return {}
    args = game.args_dict
    return {
        "keep": args.get("keep_checkpoints", WorkerConfig.keep_checkpoints),
        "keep_best": args.get("keep_best", WorkerConfig.keep_best),
        "keep_every_steps": args.get("keep_every_steps", WorkerConfig.keep_every_steps),
    }
