"""`rlsup report [--days N] [--json]`: what instability cost, as the seeds computed by hand.

From the ledger alone (read-only; works while the supervisor is down): the host's uptime, its
unexpected reboots and MTBF over the whole ledger; the games' time split (training,
evaluation, redone work, first setup, restarts, waiting, backoff, supervisor or host down:
ledger/accounting.py) and, with `cost_per_hour`, the money spent and lost to instability; then
one row per day of the last N days (local midnight to midnight): uptime, unexpected reboots,
worker crashes, hangs and OOM kills, and the time and money lost; then one row per game.

`--json`: {"schema", "generated_at", "since", "observed_s", "host": {uptime_fraction,
unexpected_reboots, supervisor_crashes, mtbf_s}, "totals": {wall_s, <category>_s, lost_s,
money, money_lost, money_lost_per_day}, "days": [{day, start, uptime_fraction,
unexpected_reboots, crashes, hangs, ooms, lost_s, money_lost}], "games": [{name, ...
status --json's games[].time}]}. With no state database yet it says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sqlite3
import sys
import time
from typing import Any

from supervisor.commands import _render as render
from supervisor.commands._common import EXIT_OK, add_config_argument, load_config_or_exit
from supervisor.config import Config
from supervisor.ledger import accounting, reads
from supervisor.observe import readonly

SCHEMA = 1
INCIDENTS = {"crashes": ("worker_crash",), "hangs": ("worker_hang",), "ooms": ("worker_oom",)}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="uptime, reboots, MTBF and what instability cost, per day and per game",
        description="What the host's instability cost: uptime, reboots, MTBF, the games' "
        "time split and the money lost, per day and per game.",
    )
    add_config_argument(p)
    p.add_argument("--days", type=int, default=7, metavar="N", help="days to list (default 7)")
    p.add_argument("--json", action="store_true", help="the report as one JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    if args.days < 0:
        return render.fail_usage(f"--days {args.days}: expected a number of days >= 0")
    now = time.time()
    with readonly.open_db_readonly(cfg.db_path) as conn:
        if conn is None:
            print(render.no_state_message(cfg), file=sys.stderr)
            doc = None
        else:
            doc = build(conn, cfg, now, args.days)
    if doc is None:
        if args.json:
            print(json.dumps({"schema": SCHEMA, "generated_at": now, "since": None}))
        return EXIT_OK
    print(json.dumps(doc, indent=2) if args.json else render_text(doc))
    return EXIT_OK


def _days(now: float, n: int) -> list[accounting.Bucket]:
    """The last n local days, oldest first (today's up to now)."""
    today = dt.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    out = []
    for k in range(n - 1, -1, -1):
        day = today - dt.timedelta(days=k)
        start, end = day.timestamp(), (day + dt.timedelta(days=1)).timestamp()
        out.append(accounting.Bucket(day.date().isoformat(), start, min(end, now)))
    return out


def _uptime(boots: list[reads.BootSpan], a: float, b: float, first: float) -> float | None:
    span = b - max(a, first)
    if span <= 0:
        return None
    up = sum(max(0.0, min(r.last_seen, b) - max(r.first_seen, a)) for r in boots)
    return min(1.0, float(up) / span)


def build(conn: sqlite3.Connection, cfg: Config, now: float, days: int) -> dict[str, Any]:
    first = reads.first_boot_seen(conn) or now
    boots = reads.boot_spans(conn)
    names = [g.name for g in cfg.games]
    names += sorted({r["game"] for r in reads.workers(conn)} - set(names))
    rate = float(cfg.cost_per_hour or 0.0)
    buckets = _days(now, days)
    times = accounting.account_db(conn, names, now, rate, cfg.gpu_cost_share, buckets=buckets)
    crashes_total = sum(
        1
        for e in reads.events(conn, kind="supervisor_start")
        if e.detail.get("after") == "supervisor_crash"
    )
    observed = max(0.0, now - first)
    totals: dict[str, Any] = dict.fromkeys((f"{c}_s" for c in accounting.CATEGORIES), 0.0)
    money = lost_money = 0.0
    for t in times.values():
        for c in accounting.CATEGORIES:
            totals[f"{c}_s"] += t.seconds[c]
        money += sum(t.money.values())
        lost_money += sum(t.money[c] for c in accounting.LOST)
    totals["wall_s"] = sum(t.wall_s for t in times.values())
    totals["lost_s"] = sum(totals[f"{c}_s"] for c in accounting.LOST)
    totals = {k: round(v, 3) for k, v in totals.items()}
    day_s = 86400.0
    totals.update(
        money=round(money, 2) if rate > 0 else None,
        money_lost=round(lost_money, 2) if rate > 0 else None,
        money_lost_per_day=(
            round(lost_money / (observed / day_s), 2) if rate > 0 and observed > 0 else None
        ),
    )
    day_rows = []
    for b in buckets:
        counts = {
            key: len(reads.events(conn, kind=list(kinds), since=b.start))
            for key, kinds in INCIDENTS.items()
        }
        later = {
            key: len(reads.events(conn, kind=list(kinds), since=b.end))
            for key, kinds in INCIDENTS.items()
        }
        reboots = reads.count_events_between(conn, "host_reboot", b.start, b.end)
        up = _uptime(boots, b.start, b.end, first)
        day_rows.append(
            {
                "day": b.label,
                "start": b.start,
                "uptime_fraction": None if up is None else round(up, 4),
                "unexpected_reboots": reboots,
                **{k: counts[k] - later[k] for k in INCIDENTS},
                "lost_s": round(sum(b.seconds[c] for c in accounting.LOST), 1),
                "money_lost": round(sum(b.money[c] for c in accounting.LOST), 2)
                if rate > 0
                else None,
            }
        )
    return {
        "schema": SCHEMA,
        "generated_at": now,
        "since": first,
        "observed_s": observed,
        "per_hour": rate or None,
        "host": {
            "uptime_fraction": round(_uptime(boots, first, now, first) or 0.0, 4),
            "unexpected_reboots": len(reads.events(conn, kind="host_reboot")),
            "supervisor_crashes": crashes_total,
            "mtbf_s": reads.mtbf_s(conn, now),
        },
        "totals": totals,
        "days": day_rows,
        "games": [
            {"name": n, **times[n].as_json(rate > 0)} for n in names if times[n].first is not None
        ],
    }


def _pct(part: float, whole: float) -> str:
    return "-" if whole <= 0 else f"{100 * part / whole:.1f}%"


def render_text(doc: dict[str, Any]) -> str:
    h, t = doc["host"], doc["totals"]
    since = render.fmt_time(doc["since"])
    per_day = doc["observed_s"] / 86400.0
    rate = f"{h['unexpected_reboots'] / per_day:.1f}/day" if per_day > 0 else "-"
    lines = [
        f"since       {since} ({render.fmt_duration(doc['observed_s'])} observed)",
        f"host        uptime {_pct(h['uptime_fraction'], 1.0)} | unexpected reboots "
        f"{h['unexpected_reboots']} ({rate}) | MTBF {render.fmt_duration(h['mtbf_s'])} | "
        f"supervisor crashes {h['supervisor_crashes']}",
    ]
    wall = t["wall_s"]
    parts = ", ".join(
        f"{c} {_pct(t[f'{c}_s'], wall)}" for c in accounting.CATEGORIES if t[f"{c}_s"] > 0
    )
    lines.append(
        f"games       {render.fmt_duration(wall)} of game time: {parts or 'none yet'}; "
        f"lost to instability {render.fmt_duration(t['lost_s'])} ({_pct(t['lost_s'], wall)})"
    )
    if doc["per_hour"]:
        lines.append(
            f"cost        {t['money']:.2f} spent at {doc['per_hour']:g}/h; {t['money_lost']:.2f} "
            f"lost to instability ({t['money_lost_per_day']:.2f}/day)"
        )
    if doc["days"]:
        rows = [
            [
                d["day"], "-" if (up := d["uptime_fraction"]) is None else _pct(up, 1.0),
                str(d["unexpected_reboots"]), str(d["crashes"]), str(d["hangs"]), str(d["ooms"]),
                render.fmt_duration(d["lost_s"]),
                "-" if d["money_lost"] is None else f"{d['money_lost']:.2f}",
            ]
            for d in doc["days"]
        ]  # fmt: skip
        heads = ("DAY", "UPTIME", "REBOOTS", "CRASHES", "HANGS", "OOMS", "LOST TIME", "LOST $")
        lines += ["", render.render_table(heads, rows)]
    if doc["games"]:
        rows = []
        for g in doc["games"]:
            w = g["wall_s"]
            rows.append(
                [g["name"], render.fmt_duration(w), _pct(g["training_s"], w),
                 _pct(g["evaluation_s"], w), _pct(g["redone_s"], w),
                 _pct(g["setup_s"] + g["starting_s"], w), _pct(g["waiting_s"], w),
                 _pct(g["backoff_s"], w), _pct(g["down_s"], w), _pct(g["paused_s"], w),
                 _pct(g["lost_s"], w),
                 "-" if g.get("money") is None else f"{g['money']:.2f}",
                 "-" if g.get("money_lost") is None else f"{g['money_lost']:.2f}"]
            )  # fmt: skip
        heads_g = ("GAME", "WALL", "TRAIN", "EVAL", "REDONE", "STARTS", "WAIT", "BACKOFF",
                 "DOWN", "PAUSED", "LOST", "$", "LOST $")  # fmt: skip
        lines += ["", render.render_table(heads_g, rows)]
    return "\n".join(lines)
