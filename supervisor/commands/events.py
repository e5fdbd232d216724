"""`rlsup events [--since 24h] [--game NAME] [--kind KIND] [--json]`: the event log.

Newest last, local times. `--json` prints a list of `{"ts", "kind", "game", "detail"}`
(ts: Unix seconds; game: null for host-wide events; detail: the event's JSON object).
A bad duration, an unknown game or an unknown kind is a usage error (exit 2). With no state
database yet it prints how to start (stderr) and an empty log, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from typing import Any

from supervisor import render
from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    add_config_argument,
    load_config_or_exit,
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "events",
        help="the event log (reboots, crashes, restarts, mode changes, ...)",
        description="Print the supervisor's event log, newest last.",
    )
    add_config_argument(p)
    p.add_argument(
        "--since",
        default="24h",
        metavar="DURATION",
        help="how far back: 90s, 30m, 24h, 7d, 2w (default 24h)",
    )
    p.add_argument("--game", metavar="NAME", help="only this game's events")
    p.add_argument(
        "--kind",
        metavar="KIND",
        action="append",
        help="only this kind (repeatable): " + ", ".join(render.EVENT_KINDS),
    )
    p.add_argument("--json", action="store_true", help="a JSON list of {ts, kind, game, detail}")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    try:
        since_s = render.parse_duration(args.since)
    except render.UsageError as exc:
        return render.fail_usage(str(exc))
    kinds: list[str] = list(getattr(args, "kind", None) or [])
    with render.open_db_readonly(cfg.db_path) as conn:
        try:
            known_games = {g.name for g in cfg.games} | _distinct(conn, "workers", "game")
            known_kinds = set(render.EVENT_KINDS) | _distinct(conn, "events", "kind")
            if args.game is not None and args.game not in known_games:
                return render.fail_usage(
                    f"unknown game {args.game!r}; known: {', '.join(sorted(known_games))}"
                )
            bad = [k for k in kinds if k not in known_kinds]
            if bad:
                return render.fail_usage(
                    f"unknown event kind {bad[0]!r}; known: {', '.join(render.EVENT_KINDS)}"
                )
            if conn is None:
                print(render.no_state_message(cfg), file=sys.stderr)
                events: list[dict[str, Any]] = []
            else:
                events = render.query_events(
                    conn, since=time.time() - since_s, game=args.game, kinds=kinds
                )
        except sqlite3.Error as exc:
            print(f"rlsup: cannot read {cfg.db_path}: {exc}", file=sys.stderr)
            return EXIT_FAIL
    if args.json:
        print(json.dumps(events, indent=1))
    else:
        print(render_events(events, args.since))
    return EXIT_OK


def _distinct(conn: sqlite3.Connection | None, table: str, column: str) -> set[str]:
    if conn is None:
        return set()
    try:
        rows = conn.execute(f"SELECT DISTINCT {column} FROM {table} WHERE {column} IS NOT NULL")
        return {r[0] for r in rows}
    except sqlite3.OperationalError:
        return set()


def render_events(events: list[dict[str, Any]], since: str) -> str:
    if not events:
        return f"no events in the last {since}"
    rows = [
        [render.fmt_time(e["ts"]), e["kind"], e["game"] or "-", render.fmt_detail(e["detail"])]
        for e in events
    ]
    return render.render_table(("TIME", "KIND", "GAME", "DETAIL"), rows)
