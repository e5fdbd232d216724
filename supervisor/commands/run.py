"""`rlsup run`: the supervisor, in the foreground (systemd runs it; it never daemonizes)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_USAGE,
    add_config_argument,
    load_config_or_exit,
)
from supervisor.observe.logs import LEVELS

if TYPE_CHECKING:
    from supervisor.config import Config


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="run the supervisor in the foreground",
        description="Spawn one worker per game, watch them, restart them from "
        "their checkpoints. SIGTERM/SIGINT: graceful stop; SIGHUP: reload.",
    )
    add_config_argument(p)
    p.add_argument(
        "--exit-when-done",
        action="store_true",
        help="exit once every game is done or fatal, instead of idling: 0 when every game "
        "finished, 1 when one ended FATAL",
    )
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        help="where workers run: this host, or the hosts of a Ray cluster (overrides "
        "[cluster] backend)",
    )
    p.add_argument(
        "--address",
        help="the Ray head's host:port (overrides [cluster] address; default: auto)",
    )
    p.add_argument(
        "--log-level",
        choices=LEVELS,
        help="the supervisor's own log: the least severe level written (default: "
        "$RLSUP_LOG_LEVEL, else info); workers' logs are not affected",
    )
    p.set_defaults(func=run)


def state_umask(env: Mapping[str, str]) -> int:
    """State, runs and logs are private to their owner (umask 077), except under systemd,
    where the unit's UMask (0027) lets the service's group of operators read them; nothing is
    ever open to others."""
    if env.get("INVOCATION_ID"):
        current = os.umask(0o077)
        return current | 0o007
    return 0o077


def fatal_games_code(fatal: list[str]) -> int:
    """`--exit-when-done`: a script must tell a run that finished from one where a game
    ended FATAL (a service never asks this: a clean stop of it is always 0, or systemd's
    Restart=on-failure would start it again)."""
    if not fatal:
        return EXIT_OK
    print(
        f"rlsup run: {len(fatal)} game(s) ended FATAL: {', '.join(fatal)} (`rlsup status` "
        "says why)",
        file=sys.stderr,
    )
    return EXIT_FAIL


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    import dataclasses

    from supervisor.config import ConfigError, check_for_service, check_runs_match
    from supervisor.daemon import LockHeld, StartFailed, Supervisor, acquire_lock
    from supervisor.files import make_private_dir
    from supervisor.observe.logs import configure_logging, level_number

    level_name = args.log_level or os.environ.get("RLSUP_LOG_LEVEL") or "info"
    try:
        level = level_number(level_name)
    except ValueError as exc:
        print(f"rlsup run: RLSUP_LOG_LEVEL: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cluster = cfg.cluster
        if args.backend or args.address:
            cluster = dataclasses.replace(
                cluster,
                backend=args.backend or cluster.backend,
                address=args.address or cluster.address,
            )
            if cluster.backend == "ray" and cfg.mirror is None:
                raise ConfigError(
                    f"{cfg.path}: --backend ray needs a [mirror] table: on several hosts a "
                    "game that moves resumes from the mirror"
                )
            cfg = dataclasses.replace(cfg, cluster=cluster)
        check_runs_match(cfg)
        cfg = check_for_service(cfg)  # once, as this service runs them
    except ConfigError as exc:
        print(f"rlsup: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(level=level)
    _say_command_findings(cfg)
    os.umask(state_umask(os.environ))  # workers inherit it
    make_private_dir(cfg.state_dir)
    try:
        lock_fd = acquire_lock(cfg.state_dir)
    except LockHeld as exc:
        print(f"rlsup run: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except OSError as exc:
        print(f"rlsup run: cannot take {cfg.state_dir}/supervisor.lock: {exc}", file=sys.stderr)
        return EXIT_FAIL
    try:
        sup = Supervisor(cfg, exit_when_done=args.exit_when_done)
        code = sup.run()
        if code == EXIT_OK and args.exit_when_done:
            return fatal_games_code(sorted(n for n, rt in sup.games.items() if rt.state == "fatal"))
        return code
    except StartFailed as exc:
        print(f"rlsup run: {exc}", file=sys.stderr)
        return EXIT_FAIL
    finally:
        os.close(lock_fd)


def _say_command_findings(cfg: Config) -> None:
    """What each command game's start would trip on, said once at start-up (the journal under
    systemd). Not a refusal: one game's missing interpreter must not stop the others; that
    game ends FATAL at its first start, and this says why and what to do."""
    import structlog

    from supervisor.launch.probe import probe_command_games

    log = structlog.get_logger("rlsup.supervisor")
    for finding in probe_command_games(cfg):
        log.warning(
            "command_game_check", game=finding.game, error=finding.error, problem=finding.message
        )
