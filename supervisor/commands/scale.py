"""`rlsup scale --mode <rung>|auto [--game NAME]`: pin a mode (writes `desired`, the wish; the
supervisor records `mode_pinned`, and its hooks fire, when it reads it)."""

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
        "scale",
        help="pin a mode for all games or one (or hand back to auto)",
        description="Pin a rung of the mode ladder (host-wide, or for one game "
        "with --game), or 'auto' to hand the scope back to the stability policy. "
        "A running supervisor applies it within a tick (a stopped one at its start) and "
        "records it as a mode_pinned event.",
    )
    add_config_argument(p)
    p.add_argument("--mode", required=True, help="a mode name from the config, or 'auto'")
    p.add_argument("--game", default=None, help="only this game (default: host-wide)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    from supervisor.ledger import db
    from supervisor.stability import modes

    valid = [*cfg.mode_names, modes.AUTO]
    if args.mode not in valid:
        print(
            f"rlsup scale: unknown mode {args.mode!r}; expected one of: {', '.join(valid)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    names = [g.name for g in cfg.games]
    if args.game is not None and args.game not in names:
        print(
            f"rlsup scale: unknown game {args.game!r}; expected one of: {', '.join(names)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    scope = args.game or modes.HOST
    conn = db.connect(cfg.state_dir)
    try:
        modes.pin_mode(conn, cfg, scope, args.mode)
    finally:
        conn.close()
    what = f"game {args.game}" if args.game else "all games"
    if args.mode == modes.AUTO:
        print(f"{what}: mode handed back to the automatic policy")
    else:
        print(f"{what}: mode pinned to {args.mode}")
    return EXIT_OK
