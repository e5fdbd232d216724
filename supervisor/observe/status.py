"""The status document (`rlsup status --json`, schema 1): one owner for every number that
`rlsup status`, the metrics exporter and monitoring scripts show.

Reads the state database read-only (`file:...?mode=ro`) and each game's live
`<state_dir>/runs/<game>/heartbeat.json` (fresher than the database row), so it works whether
or not the supervisor runs. The records of `schema.py` produce the document; fields may be
added, none is ever renamed or removed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from checkpoints.boot import read_boot_id
from supervisor.ledger import reads, time_split
from supervisor.observe import fields, readonly
from supervisor.observe.games import (  # re-exported: the status document's names
    EPH_WINDOW_S,
    HEARTBEAT_STALE_S,
    LIVE_STATES,
    episodes_per_hour,
    pid_alive,
)
from supervisor.observe.games import games as games_of
from supervisor.observe.preemption_fit import fit_warnings
from training.run_files import MAX_UNIX_TIME

# The records are types only: building them (TypedDicts) is no part of a status line.
if TYPE_CHECKING:
    from supervisor.config import Config
    from supervisor.observe.schema import (
        CostDoc,
        GameDoc,
        HostDoc,
        ModeDoc,
        NodeDoc,
        PreemptionDoc,
        ScopeDoc,
        SpareDoc,
        StatusDoc,
        SupervisorDoc,
    )

__all__ = [
    "EPH_WINDOW_S", "HEARTBEAT_STALE_S", "LIVE_STATES", "STALE_TICK_S", "collect",
    "episodes_per_hour", "pid_alive",
]  # fmt: skip

# The document's version ("schema" in --json). Its records are schema.py's; the number lives
# here, with the document's one producer, so that a status line never builds them.
SCHEMA = 1
STALE_TICK_S = 30.0  # a supervisor silent this long is shown as stale


def collect(cfg: Config, now: float, *, fit: bool = False) -> StatusDoc:
    """The whole status document (the JSON schema above). `fit`: also read each game's log
    tail for `preemption_fit` (`rlsup status` asks; the metrics thread and the dashboard,
    which recompute every few seconds, do not, and get [])."""
    with readonly.open_db_readonly(cfg.db_path) as conn:
        supervisor = _supervisor(conn, now)
        host = _host(conn, now)
        mode = _mode(conn, cfg)
        games = games_of(conn, cfg, now)
        nodes = _nodes(conn, games, running=supervisor["state"] == "running")
        spare = _spare(conn, supervisor)
        preemption = _preemption(conn, supervisor, now)
        first_seen = reads.first_boot_seen(conn)
        lost = _times(conn, cfg, games, now, supervisor["state"] == "running")
    return {
        "schema": SCHEMA,
        "generated_at": now,
        "config_path": str(cfg.path),
        "state_dir": str(cfg.state_dir),
        "db_present": supervisor["state"] != "absent" or cfg.db_path.exists(),
        "supervisor": supervisor,
        "host": host,
        "mode": mode,
        "games": games,
        "nodes": nodes,
        "spare": spare,
        "cost": _cost(cfg, games, first_seen, supervisor, now, lost),
        "preemption": preemption,
        "preemption_fit": (
            fit_warnings(cfg, preemption["provider"] if preemption else None) if fit else []
        ),
    }


def _preemption(
    conn: sqlite3.Connection | None, supervisor: SupervisorDoc, now: float
) -> PreemptionDoc | None:
    """The notice standing on the supervisor's boot: the newest `preemption_notice` naming it
    and no later `preemption_cleared`; None once the host booted again."""
    boot = supervisor["boot_id"]
    if conn is None or not boot or (current_boot_id() or boot) != boot:
        return None
    try:
        notice = reads.boot_event(conn, "preemption_notice", boot)
        cleared = reads.boot_event(conn, "preemption_cleared", boot)
    except sqlite3.Error:  # a database from before (read-only, no json1): no notice known
        return None
    if notice is None or (cleared is not None and cleared.id > notice.id):
        return None
    d = notice.detail
    deadline = d.get("deadline")
    return {
        "provider": str(d.get("provider")),
        "action": d.get("action"),
        "deadline": deadline,
        "notice_at": d.get("notice_at"),
        "remaining_s": round(deadline - now, 1) if isinstance(deadline, int | float) else None,
    }


def _times(
    conn: sqlite3.Connection | None,
    cfg: Config,
    games: list[GameDoc],
    now: float,
    running: bool = True,
) -> float:
    """Each game's time split (and money, with a price) into `games[].time`; returns the
    money lost to instability (`cost.lost`). From the supervisor's snapshot (`accounting.json`,
    at most SNAPSHOT_STALE_S old while it runs) with each game's current part carried on to
    now ("paused" or "down" while the supervisor is not running); else the fold persisted there
    brought up to date with the events after it, never a replay of the whole ledger. A game
    whose snapshot entry is unusable shows no split (`-`), reported once."""
    rate, share = float(cfg.cost_per_hour or 0.0), cfg.gpu_cost_share
    source = cfg.state_dir / time_split.SNAPSHOT_FILE
    snap = time_split.read_snapshot(cfg.state_dir, lambda *bad: fields.report(source, *bad))
    upto = None if snap is None else fields.number(snap, "upto", source, 0.0, MAX_UNIX_TIME)
    usable = (
        snap is not None
        and upto is not None
        and (not running or now - upto <= time_split.SNAPSHOT_STALE_S)
        and snap.get("per_hour") == rate
        and snap.get("gpu_share") == share
    )
    if snap is not None and upto is not None and usable:
        dt = now - upto
        for g in games:
            entry = _snapshot_entry(snap["games"], g["name"], source)
            if entry is None:
                g["time"] = None
                continue
            part = time_split.carry_part(entry.get("open"), running)
            g["time"] = time_split.carried(entry, dt, part)
        return sum(float((g["time"] or {}).get("money_lost") or 0.0) for g in games)
    return _folded(conn, cfg, games, now, running, snap)


def _folded(
    conn: sqlite3.Connection | None,
    cfg: Config,
    games: list[GameDoc],
    now: float,
    running: bool,
    snap: Mapping[str, Any] | None,
) -> float:
    """The split from the fold in accounting.json brought up to date with the events after it
    (a fold that does not validate: folded from the ledger's start, reported once); with the
    supervisor not running, each open part is carried on from the last event as paused or
    down."""
    from supervisor.ledger import accounting  # the fold: only when the snapshot is unusable

    rate, share = float(cfg.cost_per_hour or 0.0), cfg.gpu_cost_share
    names = [g["name"] for g in games]
    source = cfg.state_dir / time_split.SNAPSHOT_FILE
    fold = accounting.current_fold(conn, snap, names, lambda *bad: fields.report(source, *bad))
    steps = {g["name"]: g["global_step"] for g in games}
    upto = now if running or fold.ts is None else min(now, fold.ts)
    times = fold.result(upto, rate, share, steps)
    rates = fold.money_rates(rate, share)
    for g in games:
        t = times.get(g["name"])
        if t is None or t.first is None:
            g["time"] = None
            continue
        entry = {"time": t.as_json(rate > 0), "rate": rates.get(g["name"], 0.0)}
        g["time"] = time_split.carried(entry, now - upto, time_split.carry_part(t.open, False))
    return sum(float((g["time"] or {}).get("money_lost") or 0.0) for g in games)


# A snapshot's time split: these are seconds (>= 0), each required; money only with a price.
SPLIT_SECONDS = ("wall_s", "downtime_s", "lost_s", *(f"{c}_s" for c in time_split.CATEGORIES))
SPLIT_MONEY = ("money", "money_lost")


def _snapshot_entry(entries: Mapping[str, Any], name: str, source: Path) -> dict[str, Any] | None:
    """A game's entry of accounting.json, checked: {"time": its split, "open": the part it is
    in (or None), "rate": money per second}; None when it has none or any figure is unusable
    (a split with a hole would show shares that do not add up)."""
    entry = entries.get(name)
    if entry is None:
        return None
    where = f"games.{name}"
    if not isinstance(entry, dict) or not isinstance(entry.get("time"), dict):
        fields.report(source, where, entry, "an object with a time split")
        return None
    split: dict[str, Any] = dict(entry["time"])
    priced = split.get("money") is not None
    for key in (*SPLIT_SECONDS, *(SPLIT_MONEY if priced else ())):
        label = f"{where}.time.{key}"
        value = fields.number(split, key, source, 0.0, label=label)
        if value is None:
            if split.get(key) in (None, ""):  # absent: `number` reports only what is there
                fields.report(source, label, None, "a number >= 0")
            return None
        split[key] = value
    part = entry.get("open")
    rate = fields.number(entry, "rate", source, 0.0, label=f"{where}.rate")
    return {"time": split, "open": part if isinstance(part, str) else None, "rate": rate or 0.0}


NODE_EVENTS = ["node_joined", "node_lost", "node_reboot"]
# A host's spare (several hosts: these events carry a `host`; this host's own carry none).
SPARE_STATE = {"spare_spawned": "warming", "spare_ready": "ready", "spare_lost": None,
               "spare_stopped": None}  # fmt: skip


def _nodes(
    conn: sqlite3.Connection | None, games: list[GameDoc], running: bool = True
) -> list[NodeDoc]:
    """Several hosts: each host in the ledger (node_* events), with the games on it now and,
    while the supervisor runs, its spare (spare_* events that name a host)."""
    out: dict[str, NodeDoc] = {}

    def node(host: str) -> NodeDoc:
        return out.setdefault(host, {"host": host, "games": [], "alive": False, "joined": None,
                                     "lost": 0, "reboots": 0, "boot_id": None,
                                     "spare": None})  # fmt: skip

    if conn is not None:
        try:
            ledger = reads.events(conn, kind=[*NODE_EVENTS, *SPARE_STATE])
        except sqlite3.Error:
            ledger = []
        spares: dict[str, str | None] = {}
        for e in ledger:
            host = e.detail.get("host")
            if not isinstance(host, str):
                continue
            if e.kind in SPARE_STATE:
                spares[host] = SPARE_STATE[e.kind]
                continue
            n = node(host)
            if e.kind == "node_lost":
                n["lost"] += 1
                n["alive"] = False
                spares[host] = None
                continue
            n["reboots"] += e.kind == "node_reboot"
            n["alive"], n["joined"], n["boot_id"] = True, e.ts, e.detail.get("boot_id")
        for host, spare in spares.items():
            if host in out and out[host]["alive"] and running:
                out[host]["spare"] = spare
    for g in games:
        if g["host"] and g["state"] in LIVE_STATES:
            node(g["host"])["games"].append(g["name"])
    return sorted(out.values(), key=lambda n: n["host"])


def _spare(conn: sqlite3.Connection | None, supervisor: SupervisorDoc) -> SpareDoc | None:
    """The spare worker's row, checked against the live process (its RSS and PSS now)."""
    if conn is None:
        return None
    try:
        row = reads.spare(conn)
    except sqlite3.Error:  # a database from before the spare (schema 2) read read-only
        return None
    if row is None:
        return None
    pid, state = row.get("pid"), str(row.get("state") or "off")
    alive = pid_alive(pid, row.get("pid_start_ticks"))
    rss, pss = row.get("rss_mb"), None
    if alive and pid:
        rss, pss = _memory_mib(int(pid), rss)
    if supervisor["state"] != "running" and state != "off":
        state = "stale"
    return {
        "state": state,
        "pid": pid,
        "alive": alive,
        "device": row.get("device"),
        "since": row.get("since"),
        "ready_since": row.get("ready_since"),
        "rss_mib": None if rss is None else round(float(rss), 1),
        "pss_mib": None if pss is None else round(pss, 1),
        "reason": row.get("reason"),
    }


def _memory_mib(pid: int, fallback: float | None) -> tuple[float | None, float | None]:
    """RSS and PSS of `pid` in MiB from /proc/<pid>/smaps_rollup (PSS: None if unreadable)."""
    rss: float | None = fallback
    pss: float | None = None
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                value = int(rest.split()[0]) / 1024
                rss, pss = (value, pss) if key == "Rss" else (rss, value)
    except (OSError, ValueError, IndexError):
        pass
    return rss, pss


def _supervisor(conn: sqlite3.Connection | None, now: float) -> SupervisorDoc:
    row = reads.supervisor_record(conn)
    if row is None:
        return {
            "state": "absent",
            "pid": None,
            "alive": False,
            "started": None,
            "clean_stop": False,
            "last_tick": None,
            "last_tick_age_s": None,
            "boot_id": None,
            "db_state": None,
        }
    alive = pid_alive(row.get("pid"), row.get("pid_start_ticks"), row.get("pid_create_time"))
    last_tick = row.get("last_tick")
    age = None if last_tick is None else max(0.0, now - last_tick)
    state: Literal["running", "stale", "stopped"] = "running"
    if not alive:
        state = "stopped"
    elif age is None or age > STALE_TICK_S:
        state = "stale"
    return {
        "state": state,
        "pid": row.get("pid"),
        "alive": alive,
        "started": row.get("started"),
        "clean_stop": not alive and row.get("state") == "stopped",
        "last_tick": last_tick,
        "last_tick_age_s": age,
        "boot_id": row.get("boot_id"),
        "db_state": row.get("state"),
    }


def current_boot_id() -> str | None:
    try:
        return read_boot_id() or None
    except OSError:
        return None


def _host_boot_time() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def reboot_summary(conn: sqlite3.Connection | None, now: float) -> dict[str, Any]:
    """Unexpected reboots (host_reboot events) in 24 h / 7 d, from the ledger's reads, and MTBF:
    mean time between failures: unexpected host reboots and supervisor crashes (reads.mtbf_s)."""
    out: dict[str, Any] = {
        "unexpected_reboots_24h": 0,
        "unexpected_reboots_7d": 0,
        "unexpected_reboots_total": 0,
        "uptime_fraction_7d": None,
        "observed_s": None,
        "mtbf_s": None,
    }
    first = reads.first_boot_seen(conn)
    if conn is None or first is None:
        return out
    seen = reads.failures(conn)  # one read of the ledger's failures for every figure below
    day = reads.boots_summary(conn, now, 86400.0, seen)
    week = reads.boots_summary(conn, now, 7 * 86400.0, seen)
    out.update(
        unexpected_reboots_24h=day.unexpected_reboots,
        unexpected_reboots_7d=week.unexpected_reboots,
        unexpected_reboots_total=len(seen.reboots),
        uptime_fraction_7d=round(week.uptime_fraction, 4),
        observed_s=max(0.0, now - first),
        mtbf_s=reads.mtbf_s(conn, now, seen),
    )
    return out


def _host(conn: sqlite3.Connection | None, now: float) -> HostDoc:
    boot_id = current_boot_id()
    boot_time = reads.boot_time_of(conn, boot_id) or _host_boot_time()
    reboots, vitals = reboot_summary(conn, now), _vitals(conn, now)
    return {
        "boot_id": boot_id,
        "boot_time": boot_time,
        "uptime_s": None if boot_time is None else max(0.0, now - boot_time),
        "unexpected_reboots_24h": reboots["unexpected_reboots_24h"],
        "unexpected_reboots_7d": reboots["unexpected_reboots_7d"],
        "unexpected_reboots_total": reboots["unexpected_reboots_total"],
        "uptime_fraction_7d": reboots["uptime_fraction_7d"],
        "observed_s": reboots["observed_s"],
        "mtbf_s": reboots["mtbf_s"],
        "cpu_pct": vitals["cpu_pct"],
        "ram_available_pct": vitals["ram_available_pct"],
        "vitals_age_s": vitals["vitals_age_s"],
        "gpus": vitals["gpus"],
    }


def _vitals(conn: sqlite3.Connection | None, now: float) -> dict[str, Any]:
    """The supervisor's latest host sample when recent, else a cheap live reading (no GPUs)."""
    sample = reads.latest_sample(conn)
    if sample is not None and now - sample[0] <= 5 * 60:
        data = readonly.parse_json(sample[1])
        return {
            "cpu_pct": data.get("cpu_pct"),
            "ram_available_pct": data.get("ram_available_pct"),
            "vitals_age_s": max(0.0, now - sample[0]),
            "gpus": data.get("gpus") or [],
        }
    load1 = os.getloadavg()[0]
    return {
        "cpu_pct": round(min(100.0, 100.0 * load1 / (os.cpu_count() or 1)), 1),
        "ram_available_pct": _ram_available_pct(),
        "vitals_age_s": None,
        "gpus": [],
    }


def _ram_available_pct() -> float:
    """psutil.virtual_memory()'s available share of RAM in percent, read from /proc/meminfo as
    psutil reads it on Linux (MemAvailable; MemFree where that exceeds the total, in a
    container) without importing psutil (~11 ms of a status line); psutil's own estimate where
    the kernel gives no MemAvailable."""
    mem: dict[bytes, int] = {}
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                fields = line.split()
                mem[fields[0]] = int(fields[1]) * 1024
        total, avail = mem[b"MemTotal:"], mem.get(b"MemAvailable:", 0)
        if avail > total:
            avail = mem[b"MemFree:"]
    except (OSError, ValueError, IndexError, KeyError):
        total = avail = 0
    if total > 0 and avail > 0:
        return round(100.0 * avail / total, 1)
    import psutil  # type: ignore[import-untyped, unused-ignore]

    vm = psutil.virtual_memory()
    return round(100.0 * float(vm.available) / float(vm.total), 1)


def _mode(conn: sqlite3.Connection | None, cfg: Config) -> ModeDoc:
    desired = reads.desired_rows(conn)
    scopes: list[ScopeDoc] = []
    for r in reads.mode_rows(conn):
        pin = desired.get(r["scope"])
        scopes.append(
            {
                "scope": r["scope"],
                "mode": r["mode"],
                "since": r["since"],
                "reason": r.get("reason"),
                "pinned": bool(pin and pin["pinned"]),
            }
        )
    last = None
    if conn is not None:
        with contextlib.suppress(sqlite3.OperationalError):
            found = readonly.query_events(conn, kinds=readonly.MODE_EVENT_KINDS, limit=1)
            last = found[-1] if found else None
    return {
        "ladder": list(cfg.mode_names),
        "initial_mode": cfg.initial_mode,
        "scopes": scopes,
        "last_decision": last,
    }


def _cost(
    cfg: Config,
    games: list[GameDoc],
    first_seen: float | None,
    supervisor: SupervisorDoc,
    now: float,
    lost: float = 0.0,
) -> CostDoc | None:
    rate = float(cfg.cost_per_hour or 0.0)
    if rate <= 0:
        return None
    since = first_seen or supervisor.get("started") or now
    # The games' money: each instant's price while some game's life spans it. Once every game
    # has ended the host's time is nobody's cost (it was `rate * (now - since)`: growing for
    # ever after the last game was done).
    spent = sum(float((g.get("time") or {}).get("money") or 0.0) for g in games)
    todo = sum(
        max(0, g["total_steps"] - g["global_step"])
        for g in games
        if g["state"] not in ("done", "fatal") and g["in_config"]
    )
    speed = sum(
        g["sps"] or 0.0 for g in games if g["state"] == "running" and not g["heartbeat_stale"]
    )
    remaining = 0.0 if todo == 0 else (todo / speed if speed > 0 else None)
    projected = None if remaining is None else spent + rate * remaining / 3600.0
    return {
        "per_hour": rate,
        "spent": round(spent, 2),
        "since": since,
        "remaining_s": remaining,
        "projected_total": None if projected is None else round(projected, 2),
        # What the games' time lost to instability (redone work, restarts, backoff, the
        # supervisor or host down) cost: each instant's price shared among the games alive.
        "lost": round(lost, 2),
    }
