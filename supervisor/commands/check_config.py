"""`rlsup check-config`: validate the configuration (and that it fits the runs on disk)."""

from __future__ import annotations

import argparse
import sys

from supervisor.commands._common import (
    EXIT_OK,
    EXIT_USAGE,
    add_config_argument,
    load_config_or_exit,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check-config",
        help="validate the configuration file",
        description="Load the configuration as `rlsup run` would (every key, every worker "
        "setting in every mode, and that no game's env_id or algo differs from its runs on "
        "disk; that each command game's program exists, and that its Python can import the SDK); "
        "exit 0 if it would start (warnings on stderr), 2 with the reason if not. The systemd "
        "unit runs it before a reload, so `systemctl reload` fails on a bad file.",
    )
    add_config_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    from supervisor.config import ConfigError, check_for_service, check_runs_match
    from supervisor.launch.probe import probe_command_games

    try:
        check_runs_match(cfg)
        check_for_service(cfg)  # as the service would: read-only commands skip this
    except ConfigError as exc:
        print(f"rlsup: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    findings = probe_command_games(cfg)  # each command game's program, started once
    for finding in findings:
        print(f"rlsup: {cfg.path}: {finding.line()}", file=sys.stderr)
    if any(f.error for f in findings):
        return EXIT_USAGE
    modes = " < ".join(cfg.mode_names)
    print(f"{cfg.path}: ok: {len(cfg.games)} games, modes {modes}, state in {cfg.state_dir}")
    return EXIT_OK
