"""`rlsup status [--json] [--watch [SECONDS]]`: the host, the mode and every game at a glance.

The document is `supervisor.observe.status.collect`'s; this command only renders it. It works
whether or not the supervisor runs. With no state database yet it prints how to start and exits 0 (a
fresh install is not a failure); `--json` then still prints the document, with
`"supervisor": {"state": "absent"}` and every configured game `"not_started"`.
Exit codes, for monitoring scripts (the document is printed either way):
  0  the supervisor runs and no game is FATAL; or it stopped cleanly after every configured
     game finished (DONE): a finished run is nothing to alert on
  1  the state database could not be read
  2  bad configuration / usage
  3  the supervisor is not running (never started, stopped, or alive but not ticking), as
     `systemctl is-active` says 3 of an inactive unit; except the finished run above
  4  the supervisor runs, and a game is FATAL (its restart budget is spent)
With `--done` ("did every game finish?", whether or not the supervisor runs):
  0  every configured game is DONE
  4  a configured game is FATAL (it never will)
  5  not yet: some game is still running, waiting, stopped or never started

JSON schema (`--json`; schema 1): the records of `supervisor/observe/schema.py`, which produce
the document. Fields may be added; none is ever renamed or removed.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from supervisor.commands import _render as render
from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_FATAL_GAME,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    add_config_argument,
    load_config_or_exit,
)
from supervisor.observe.status import LIVE_STATES, collect

# Types only: a status line is a glance, and imports nothing it does not show
# (tests/cli/test_status_imports.py).
if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.observe.schema import (
        GameDoc,
        HostDoc,
        ModeDoc,
        NodeDoc,
        PreemptionDoc,
        SpareDoc,
        StatusDoc,
    )

DEFAULT_WATCH_S = 2.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "status",
        help="host, mode and per-game progress (works with or without the supervisor)",
        description="Show the host, the mode ladder and every game's progress.",
    )
    add_config_argument(p)
    p.add_argument("--json", action="store_true", help="one JSON document (see the schema)")
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=DEFAULT_WATCH_S,
        default=None,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {DEFAULT_WATCH_S:g}) until Ctrl-C",
    )
    p.add_argument(
        "--done",
        action="store_true",
        help="exit 0 when every game is done, 4 when one is FATAL, 5 when some are not done yet",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    watch = getattr(args, "watch", None)
    if watch is not None and watch <= 0:
        return render.fail_usage(f"--watch {watch:g}: expected seconds > 0")
    as_json = bool(getattr(args, "json", False))
    code = done_code if getattr(args, "done", False) else exit_code
    if watch is None:
        return _show(cfg, as_json, clear=False, code=code)
    try:
        while True:
            _show(cfg, as_json, clear=not as_json and sys.stdout.isatty())
            sys.stdout.flush()
            time.sleep(watch)
    except KeyboardInterrupt:
        return EXIT_OK


def _show(
    cfg: Config, as_json: bool, *, clear: bool, code: Callable[[StatusDoc], int] | None = None
) -> int:
    try:
        doc = collect(cfg, time.time(), fit=True)
    except sqlite3.Error as exc:
        print(f"rlsup: cannot read {cfg.db_path}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    text = json.dumps(doc, indent=2) if as_json else render_human(doc)
    if not as_json:
        text += "".join(f"\nwarning: {w}" for w in doc["preemption_fit"])
    if clear:
        text = "\033[H\033[2J" + text
    try:
        print(text)
    except BrokenPipeError:  # `rlsup status | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return (code or exit_code)(doc)


# `rlsup status --done`: some game has not finished yet.
EXIT_NOT_DONE = 5


def _configured(doc: StatusDoc) -> list[str]:
    return [g["state"] for g in doc["games"] if g["in_config"]]


def _finished(doc: StatusDoc) -> bool:
    states = _configured(doc)
    return bool(states) and all(s == "done" for s in states)


def exit_code(doc: StatusDoc) -> int:
    """3 when the supervisor is not running (0 when it stopped cleanly after every game
    finished), else 4 when a game is FATAL, else 0."""
    if doc["supervisor"]["state"] != "running":
        finished = doc["supervisor"]["state"] == "stopped" and doc["supervisor"]["clean_stop"]
        return EXIT_OK if finished and _finished(doc) else EXIT_NOT_RUNNING
    if "fatal" in _configured(doc):
        return EXIT_FATAL_GAME
    return EXIT_OK


def done_code(doc: StatusDoc) -> int:
    """`--done`: 0 when every configured game is DONE, 4 when one is FATAL, else 5."""
    if _finished(doc):
        return EXIT_OK
    return EXIT_FATAL_GAME if "fatal" in _configured(doc) else EXIT_NOT_DONE


# ---- collecting -----------------------------------------------------------------------------


# ---- games ----------------------------------------------------------------------------------


# ---- rendering ------------------------------------------------------------------------------


def render_human(doc: StatusDoc) -> str:
    now = doc["generated_at"]
    lines = [_supervisor_line(doc, now), _host_line(doc["host"], now)]
    if (pre := doc["preemption"]) is not None:
        lines.append(_preemption_line(pre, now))
    lines += _mode_lines(doc["mode"], now)
    lines += ["", _games_table(doc["games"], now)]
    mirrored = [
        f"{g['name']} {render.fmt_count(g['mirror_step'])} "
        f"({render.fmt_duration(g['mirror_age_s'])} old)"
        for g in doc["games"]
        if g["mirror_step"] is not None
    ]
    if mirrored:
        lines += ["", "mirrored: " + ", ".join(mirrored)]
    if doc["nodes"]:
        lines += ["", "hosts: " + "; ".join(_node_cell(n) for n in doc["nodes"])]
    if doc["spare"] is not None:
        lines += ["", _spare_line(doc["spare"], now)]
    notes = _notes(doc["games"], now)
    if notes:
        lines += ["", *notes]
    if doc["cost"]:
        c = doc["cost"]
        proj = (
            f", ~{c['projected_total']:.2f} projected to finish "
            f"(in {render.fmt_duration(c['remaining_s'])})"
            if c["projected_total"] is not None
            else ", projection unknown (nothing running)"
        )
        lines += [
            "",
            f"cost        {c['spent']:.2f} spent over "
            f"{render.fmt_duration(now - c['since'])} at {c['per_hour']:g}/h{proj}; "
            f"{c['lost']:.2f} lost to instability (rlsup report)",
        ]
    return "\n".join(lines)


def _supervisor_line(doc: StatusDoc, now: float) -> str:
    s = doc["supervisor"]
    start_hint = f"start it with `rlsup run --config {doc['config_path']}`"
    if s["state"] == "absent":
        if not doc["db_present"]:
            return (
                f"supervisor  NEVER RUN: no state database in {doc['state_dir']}; "
                f"{start_hint} (or create a configuration with `rlsup init`)"
            )
        return f"supervisor  NOT STARTED (no supervisor record); {start_hint}"
    tick = f"last tick {render.fmt_ago(s['last_tick'], now)}"
    if s["state"] == "running":
        return (
            f"supervisor  running  pid {s['pid']}, up "
            f"{render.fmt_duration(now - (s['started'] or now))}, {tick}"
        )
    if s["state"] == "stale":
        return f"supervisor  STALE  pid {s['pid']} alive but {tick} (stuck?)"
    if s["clean_stop"]:
        return (
            f"supervisor  stopped (clean stop {render.fmt_ago(s['last_tick'], now)}); {start_hint}"
        )
    return (
        f"supervisor  NOT RUNNING  (pid {s['pid']} gone without a clean stop, {tick}); {start_hint}"
    )


def _host_line(h: HostDoc, now: float) -> str:
    mtbf = (
        render.fmt_duration(h["mtbf_s"])
        if h["mtbf_s"]
        else (f"none in {render.fmt_duration(h['observed_s'])}" if h["observed_s"] else "-")
    )
    parts = [
        f"host        up {render.fmt_duration(h['uptime_s'])} "
        f"(boot {render.fmt_time(h['boot_time'])})",
        f"unexpected reboots 24h {h['unexpected_reboots_24h']} / "
        f"7d {h['unexpected_reboots_7d']}, MTBF {mtbf}",
        f"CPU {render.fmt_num(h['cpu_pct'], 0)}%  RAM free "
        f"{render.fmt_num(h['ram_available_pct'], 0)}%",
    ]
    for g in h.get("gpus") or []:
        used, total = g.get("mem_used_mb"), g.get("mem_total_mb")
        mem = f"{used / 1024:.1f}/{total / 1024:.1f}G" if used is not None and total else "mem -"
        parts.append(
            f"GPU{g.get('index', '?')} {mem} {render.fmt_num(g.get('util_pct'), 0)}% "
            f"{render.fmt_num(g.get('temp_c'), 0)}C"
        )
    return " | ".join(parts)


def _mode_lines(m: ModeDoc, now: float) -> list[str]:
    ladder = " < ".join(m["ladder"])
    if not m["scopes"]:
        lines = [f"mode        {m['initial_mode']} (initial; not applied yet)  ladder {ladder}"]
    else:
        scopes = []
        for s in m["scopes"]:
            scope = "all games" if s["scope"] == "*" else s["scope"]
            how = "PINNED" if s["pinned"] else "auto"
            scopes.append(f"{scope}: {s['mode']} ({how}, since {render.fmt_ago(s['since'], now)})")
        lines = [f"mode        {'; '.join(scopes)}  ladder {ladder}"]
    d = m["last_decision"]
    if d:
        detail = d["detail"] if isinstance(d["detail"], dict) else {}
        why = detail.get("reason") or detail.get("reasons") or render.fmt_detail(detail)
        if isinstance(why, list):
            why = "; ".join(str(x) for x in why)
        scope = d["game"] or "all games"
        lines.append(
            f"            last decision {render.fmt_ago(d['ts'], now)}: {d['kind']} ({scope}) {why}"
        )
    return lines


_HEADERS = (
    "GAME",
    "STATE",
    "PID",
    "DEVICE",
    "MODE",
    "ENVS",
    "BATCH",
    "STEPS",
    "%",
    "EPISODES",
    "EP/H",
    "SPS",
    "RETURN",
    "EVAL",
    "CHECKPOINT",
    "RESTARTS",
    "ETA",
    "LOST",
)


def _device_cell(g: GameDoc) -> str:
    if g["device"] is None:
        return "-"
    return g["device"] + (f" ({g['device_note']})" if g.get("device_note") else "")


def _games_table(games: list[GameDoc], now: float) -> str:
    rows = []
    for g in games:
        state = g["state"].upper() if g["state"] in ("fatal", "backoff") else g["state"]
        if g["heartbeat_stale"] or g["pid_alive"] is False:
            state += "!"
        ckpt = "-"
        if g["last_checkpoint_step"] is not None:
            ckpt = (
                f"{render.fmt_count(g['last_checkpoint_step'])} "
                f"{render.fmt_duration(g['last_checkpoint_age_s'])}"
            )
        rows.append(
            [
                g["name"] + ("" if g["in_config"] else "?"),
                state,
                _pid_cell(g),
                _device_cell(g),
                g["mode"] or "-",
                str(g["num_envs"] or "-"),
                str(g["batch_size"] or "-"),
                f"{render.fmt_count(g['global_step'])}/{render.fmt_count(g['total_steps'])}",
                f"{g['percent']:.1f}",
                render.fmt_count(g["episodes"]),
                render.fmt_num(g["episodes_per_hour"], 0),
                render.fmt_num(g["sps"], 0),
                render.fmt_num(g["mean_return"], 1),
                _eval_cell(g),
                ckpt,
                str(g["restarts"]),
                render.fmt_duration(g["eta_s"]),
                _lost_cell(g),
            ]
        )
    return render.render_table(_HEADERS, rows)


def _lost_cell(g: GameDoc) -> str:
    """`6%`: the share of its life lost to instability (redone work, restarts, backoff, the
    supervisor or host down): games[].time's lost_s / wall_s."""
    t = g["time"] or {}
    wall, lost = t.get("wall_s"), t.get("lost_s")
    if not isinstance(wall, int | float) or not isinstance(lost, int | float) or not wall > 0:
        return "-"  # no split (or, from a document of another writer, an incomplete one)
    return f"{100 * lost / wall:.0f}%"


def _eval_cell(g: GameDoc) -> str:
    """`21.0@500k`: the last evaluation's mean return and the step it was taken at."""
    if g["eval_return"] is None:
        return "-"
    at = f"@{render.fmt_count(g['eval_step'])}" if g["eval_step"] is not None else ""
    return f"{render.fmt_num(g['eval_return'], 1)}{at}"


def _preemption_line(pre: PreemptionDoc, now: float) -> str:
    """`PREEMPTION  aws terminate in 1m 32s: every game asked to checkpoint, no new start`."""
    left = pre["deadline"] - now if pre["deadline"] is not None else None
    when = (
        "deadline unknown"
        if left is None
        else f"in {render.fmt_duration(left)}"
        if left > 0
        else f"{render.fmt_duration(-left)} past"
    )
    return (
        f"PREEMPTION  {pre['provider']} {pre['action'] or ''} {when}: every game asked to "
        "checkpoint, no new start"
    )


def _spare_line(sp: SpareDoc, now: float) -> str:
    """`spare       ready, pid 123 (cpu), 312 MiB RSS / 120 MiB PSS, ready for 4m` or why not."""
    if sp["state"] in ("off", "starting") or not sp["pid"]:
        return f"spare       {sp['state']}: {sp['reason'] or '-'}"
    mem = f"{render.fmt_num(sp['rss_mib'], 0)} MiB RSS"
    if sp["pss_mib"] is not None:
        mem += f" / {render.fmt_num(sp['pss_mib'], 0)} MiB PSS"
    since = (
        f", ready for {render.fmt_duration(now - sp['ready_since'])}"
        if sp["state"] == "ready" and sp["ready_since"]
        else ""
    )
    dead = "" if sp["alive"] else " (not running)"
    return f"spare       {sp['state']}, pid {sp['pid']}{dead} ({sp['device']}), {mem}{since}"


def _node_cell(n: NodeDoc) -> str:
    games = ", ".join(n["games"]) or "no game"
    extra = [f"lost {n['lost']}x"] if n["lost"] else []
    extra += [f"rebooted {n['reboots']}x"] if n["reboots"] else []
    extra += [f"spare {n['spare']}"] if n.get("spare") else []
    state = "" if n["alive"] else " DOWN"
    return f"{n['host']}{state} ({games}{''.join(', ' + x for x in extra)})"


def _pid_cell(g: GameDoc) -> str:
    if not (g["pid"] and g["state"] in LIVE_STATES):
        return "-"
    return f"{g['pid']}@{g['host']}" if g.get("host") else str(g["pid"])


def _notes(games: list[GameDoc], now: float) -> list[str]:
    notes = []
    for g in games:
        if g["heartbeat_stale"]:
            age = render.fmt_duration(g["heartbeat_age_s"]) if g["heartbeat_age_s"] else "none"
            notes.append(f"! {g['name']}: heartbeat stale (last {age} ago)")
        if g["pid_alive"] is False:
            notes.append(f"! {g['name']}: recorded pid {g['pid']} is not alive")
        if g["state"] in ("fatal", "backoff") and g["reason"]:
            notes.append(_indented(f"! {g['name']}: {g['state']}: {g['reason']}"))
        if g["last_error"] and g["last_error"].get("message"):
            e = g["last_error"]
            line = f"  {g['name']}: last error {e.get('kind')}: {e.get('message')}"
            notes.append(_indented(line))
        if not g["in_config"]:
            notes.append(f"? {g['name']}: in the database but not in the configuration")
        if g.get("kind") == "command":
            hang = "" if g["hang_detection"] else "; no hang detection (no heartbeat)"
            command = " ".join(g["command"] or [])
            notes.append(f"  {g['name']}: command game, {g['contract_level']}: {command}{hang}")
    return notes


def _indented(note: str) -> str:
    """A note whose text has several lines (a command game's log tail) keeps them under it."""
    return note.rstrip("\n").replace("\n", "\n      ")
