"""`rlsup events [--since 24h] [--game NAME] [--kind KIND] [--json]`: the event log.

Newest last, local times. `--json` prints a list of `{"ts", "kind", "game", "detail"}`
(ts: Unix seconds; game: null for host-wide events; detail: the event's JSON object).
A bad duration, an unknown game or an unknown kind is a usage error (exit 2). With no state
database yet it prints how to start (stderr) and an empty log, and exits 0.

`-f`/`--follow` streams the events as they are recorded (polling the database read-only for
ids above the last one seen), one line each; with `--json`, one JSON object per line (JSON
Lines, the shape of the list's items). It starts with the new events only, or with those of
`--since` when given; it waits for a database that does not exist yet; Ctrl-C ends it (exit 0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

from supervisor.commands import _render as render
from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    add_config_argument,
    load_config_or_exit,
)
from supervisor.config import Config
from supervisor.ledger import reads
from supervisor.observe import readonly

POLL_S = 0.5
DEFAULT_SINCE = "24h"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "events",
        help="the event log (reboots, crashes, restarts, mode changes, ...)",
        description="Print the supervisor's event log, newest last.",
    )
    add_config_argument(p)
    p.add_argument(
        "--since",
        metavar="DURATION",
        help="how far back: 90s, 30m, 24h, 7d, 2w (default 24h; with -f, none: only the "
        "events recorded from now on)",
    )
    p.add_argument("--game", metavar="NAME", help="only this game's events")
    p.add_argument(
        "--kind",
        metavar="KIND",
        action="append",
        help="only this kind (repeatable): " + ", ".join(readonly.EVENT_KINDS),
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="a JSON list of {ts, kind, game, detail} (with -f: one such object per line)",
    )
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing events as they are recorded (Ctrl-C ends)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    follow = bool(getattr(args, "follow", False))
    since = args.since or (None if follow else DEFAULT_SINCE)
    try:
        since_s = None if since is None else render.parse_duration(since)
    except render.UsageError as exc:
        return render.fail_usage(str(exc))
    kinds: list[str] = list(getattr(args, "kind", None) or [])
    events: list[dict[str, Any]] = []
    with readonly.open_db_readonly(cfg.db_path) as conn:
        try:
            known_games = {g.name for g in cfg.games} | reads.known_games(conn)
            known_kinds = set(readonly.EVENT_KINDS) | reads.known_event_kinds(conn)
            if args.game is not None and args.game not in known_games:
                return render.fail_usage(
                    f"unknown game {args.game!r}; known: {', '.join(sorted(known_games))}"
                )
            bad = [k for k in kinds if k not in known_kinds]
            if bad:
                return render.fail_usage(
                    f"unknown event kind {bad[0]!r}; known: {', '.join(readonly.EVENT_KINDS)}"
                )
            if conn is None and not follow:
                print(render.no_state_message(cfg), file=sys.stderr)
            elif conn is not None and since_s is not None and not follow:
                events = readonly.query_events(
                    conn, since=time.time() - since_s, game=args.game, kinds=kinds
                )
        except sqlite3.Error as exc:
            print(f"rlsup: cannot read {cfg.db_path}: {exc}", file=sys.stderr)
            return EXIT_FAIL
    if follow:
        since_ts = None if since_s is None else time.time() - since_s
        return follow_events(cfg, since_ts, args.game, kinds, _line_writer(args.json))
    if args.json:
        print(json.dumps(events, indent=1))
    else:
        print(render_events(events, since or DEFAULT_SINCE))
    return EXIT_OK


Write = Callable[[list[dict[str, Any]]], None]


def follow_events(
    cfg: Config,
    since_ts: float | None,
    game: str | None,
    kinds: list[str],
    write: Write,
    *,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print events as they are recorded until interrupted: first those since `since_ts` (none
    when None), then each new one once. A database that appears later is read from its first
    event (all of it is new)."""
    conn: sqlite3.Connection | None = None
    last_id: int | None = None  # the newest id already considered
    noted = False
    try:
        while True:
            if conn is None and (conn := readonly.connect_readonly(cfg.db_path)) is None:
                if not noted:
                    print(f"rlsup events: waiting for {cfg.db_path} (the supervisor has not "
                          "run yet)", file=sys.stderr)  # fmt: skip
                    noted = True
                last_id = 0
                sleep(poll_s)
                continue
            try:
                top = readonly.last_event_id(conn)
                if last_id is None:  # the first look: history only if asked for
                    last_id = 0 if since_ts is not None else top
                new = readonly.query_events_between(
                    conn, last_id, top, since=since_ts, game=game, kinds=kinds
                )
            except sqlite3.OperationalError:
                # Locked past the busy timeout, or a database being created (no table yet).
                sleep(poll_s)
                continue
            last_id = top
            if new:
                write(new)
            sleep(poll_s)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # `rlsup events -f | head`
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        if conn is not None:
            conn.close()


def _line_writer(as_json: bool) -> Write:
    def write(events: list[dict[str, Any]]) -> None:
        for e in events:
            print(json.dumps(e, separators=(",", ":")) if as_json else event_line(e))
        sys.stdout.flush()

    return write


def event_line(e: dict[str, Any]) -> str:
    """One event on one line, in the columns of the table (which a stream cannot align)."""
    return "  ".join(
        [
            render.fmt_time(e["ts"]),
            e["kind"].ljust(18),
            (e["game"] or "-").ljust(12),
            render.fmt_detail(e["detail"]),
        ]
    ).rstrip()


def render_events(events: list[dict[str, Any]], since: str) -> str:
    if not events:
        return f"no events in the last {since}"
    rows = [
        [render.fmt_time(e["ts"]), e["kind"], e["game"] or "-", render.fmt_detail(e["detail"])]
        for e in events
    ]
    return render.render_table(("TIME", "KIND", "GAME", "DETAIL"), rows)
