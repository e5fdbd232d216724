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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from checkpoints.names import ckpt_name, newest_step
from supervisor.config import Config, GameSpec
from supervisor.ledger import accounting, db
from supervisor.lifecycle.states import ALIVE
from supervisor.mirror.state import MirrorState
from supervisor.observe import readonly
from supervisor.observe.preemption_fit import fit_warnings
from supervisor.observe.schema import (
    SCHEMA,
    CostDoc,
    ErrorDoc,
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
from training import torchbuild
from training.protocol import (
    CHECKPOINT_DIR,
    ERROR_FILE,
    EVAL_FILE,
    HEARTBEAT_FILE,
    read_json_file,
)

STALE_TICK_S = 30.0  # a supervisor silent this long is shown as stale


HEARTBEAT_STALE_S = 30.0  # a live worker's heartbeat older than this is flagged


LIVE_STATES = frozenset(str(state) for state in ALIVE)  # a worker process exists


EPH_WINDOW_S = 3600.0


def collect(cfg: Config, now: float, *, fit: bool = False) -> StatusDoc:
    """The whole status document (the JSON schema above). `fit`: also read each game's log
    tail for `preemption_fit` (`rlsup status` asks; the metrics thread and the dashboard,
    which recompute every few seconds, do not, and get [])."""
    with readonly.open_db_readonly(cfg.db_path) as conn:
        supervisor = _supervisor(conn, now)
        host = _host(conn, now)
        mode = _mode(conn, cfg)
        games = _games(conn, cfg, now)
        nodes = _nodes(conn, games, running=supervisor["state"] == "running")
        spare = _spare(conn, supervisor)
        preemption = _preemption(conn, supervisor, now)
        first_seen = db.first_boot_seen(conn)
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
        notice = db.boot_event(conn, "preemption_notice", boot)
        cleared = db.boot_event(conn, "preemption_cleared", boot)
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
    at most SNAPSHOT_EVERY_S old while it runs) with each game's current part carried on to
    now ("down" while the supervisor is not running); else a replay of the ledger."""
    rate, share = float(cfg.cost_per_hour or 0.0), cfg.gpu_cost_share
    snap = accounting.read_snapshot(cfg.state_dir)
    usable = (
        snap is not None
        and (not running or now - snap["upto"] <= accounting.SNAPSHOT_STALE_S)
        and snap.get("per_hour") == rate
        and snap.get("gpu_share") == share
    )
    if snap is not None and usable:
        dt = now - float(snap["upto"])
        for g in games:
            entry = snap["games"].get(g["name"])
            if entry is None:
                g["time"] = None
                continue
            part = entry.get("open")
            g["time"] = accounting.carried(entry, dt, part if running or part is None else "down")
        return sum(float((g["time"] or {}).get("money_lost") or 0.0) for g in games)
    names = [g["name"] for g in games]
    steps = {g["name"]: g["global_step"] for g in games}
    times = accounting.account_db(conn, names, now, rate, share, steps)
    for g in games:
        t = times.get(g["name"])
        g["time"] = t.as_json(rate > 0) if t is not None and t.first is not None else None
    return sum(t.money[c] for t in times.values() for c in accounting.LOST)


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
            ledger = db.events(conn, kind=[*NODE_EVENTS, *SPARE_STATE])
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
        row = db.spare(conn)
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


def pid_alive(pid: int | None, ticks: int | None, create_time: float | None = None) -> bool:
    """Is this pid alive and the same process as recorded (procid.same_process)?"""
    if not pid:
        return False
    from supervisor.launch.process import same_process  # only when a pid is recorded

    return same_process(pid, ticks, create_time)


def _supervisor(conn: sqlite3.Connection | None, now: float) -> SupervisorDoc:
    row = db.supervisor_record(conn)
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
        return db.read_boot_id() or None
    except OSError:
        return None


def _host_boot_time() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def reboot_summary(conn: sqlite3.Connection | None, now: float) -> dict[str, Any]:
    """Unexpected reboots (host_reboot events) in 24 h / 7 d, from db's helpers, and MTBF:
    mean time between failures: unexpected host reboots and supervisor crashes (db.mtbf_s)."""
    out: dict[str, Any] = {
        "unexpected_reboots_24h": 0,
        "unexpected_reboots_7d": 0,
        "unexpected_reboots_total": 0,
        "uptime_fraction_7d": None,
        "observed_s": None,
        "mtbf_s": None,
    }
    first = db.first_boot_seen(conn)
    if conn is None or first is None:
        return out
    day, week = db.boots_summary(conn, now, 86400.0), db.boots_summary(conn, now, 7 * 86400.0)
    out.update(
        unexpected_reboots_24h=day.unexpected_reboots,
        unexpected_reboots_7d=week.unexpected_reboots,
        unexpected_reboots_total=len(db.events(conn, kind="host_reboot")),
        uptime_fraction_7d=round(week.uptime_fraction, 4),
        observed_s=max(0.0, now - first),
        mtbf_s=db.mtbf_s(conn, now),
    )
    return out


def _host(conn: sqlite3.Connection | None, now: float) -> HostDoc:
    boot_id = current_boot_id()
    boot_time = db.boot_time_of(conn, boot_id) or _host_boot_time()
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
    sample = db.latest_sample(conn)
    if sample is not None and now - sample[0] <= 5 * 60:
        data = readonly.parse_json(sample[1])
        return {
            "cpu_pct": data.get("cpu_pct"),
            "ram_available_pct": data.get("ram_available_pct"),
            "vitals_age_s": max(0.0, now - sample[0]),
            "gpus": data.get("gpus") or [],
        }
    import psutil  # type: ignore[import-untyped, unused-ignore]

    vm = psutil.virtual_memory()
    load1 = os.getloadavg()[0]
    return {
        "cpu_pct": round(min(100.0, 100.0 * load1 / (os.cpu_count() or 1)), 1),
        "ram_available_pct": round(100.0 * vm.available / vm.total, 1),
        "vitals_age_s": None,
        "gpus": [],
    }


def _mode(conn: sqlite3.Connection | None, cfg: Config) -> ModeDoc:
    desired = db.desired_rows(conn)
    scopes: list[ScopeDoc] = []
    for r in db.mode_rows(conn):
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


def _fresher(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return a or b
    return a if (a.get("time") or 0) >= (b.get("time") or 0) else b


def episodes_per_hour(rows: Sequence[dict[str, str]], now: float) -> float | None:
    """Episodes per hour over the last hour of progress rows (one resume segment), walking
    back from the newest row only as far as it needs to."""
    newest: tuple[float, float] | None = None
    t0 = e0 = 0.0
    pairs = (
        rows.column_pairs("time", "episodes")
        if isinstance(rows, readonly.ProgressRows)
        else ((r.get("time"), r.get("episodes")) for r in reversed(rows))
    )
    for tt, ee in pairs:
        t, e = readonly.to_float(tt), readonly.to_float(ee)
        if t is None or e is None:
            continue
        if newest is None:
            newest = t0, e0 = t, e
            continue
        if t < newest[0] - EPH_WINDOW_S or e > e0:  # out of the window, or a counter reset
            break
        t0, e0 = t, e
    if newest is None or newest[0] - t0 < 10.0:
        return None
    return round((newest[1] - e0) / (newest[0] - t0) * 3600.0, 1)


def _checkpoint_age(run_dir: Path, hb: dict[str, Any], now: float) -> float | None:
    t = hb.get("last_checkpoint_time")
    if t:
        return max(0.0, now - float(t))
    step = hb.get("last_checkpoint_step")
    if step is None:
        return None
    try:
        ckpt = run_dir / CHECKPOINT_DIR / ckpt_name(int(step))
        return max(0.0, now - ckpt.stat().st_mtime)
    except (OSError, ValueError):
        return None


def _last_error(run_dir: Path) -> ErrorDoc | None:
    err = read_json_file(run_dir / ERROR_FILE)
    if not err:
        return None
    return {"kind": err.get("kind"), "message": err.get("message"), "step": err.get("step")}


def _games(conn: sqlite3.Connection | None, cfg: Config, now: float) -> list[GameDoc]:
    workers = {r["game"]: r for r in (db.workers(conn) if conn is not None else [])}
    modes = {r["scope"]: r["mode"] for r in db.mode_rows(conn)}
    out = [
        _game(cfg, g.name, g.env_id, g.algo, g.total_steps, workers.get(g.name), modes, now)
        for g in cfg.games
    ]
    for doc, spec in zip(out, cfg.games, strict=True):
        _kind(cfg, spec, doc)
    configured = {g.name for g in cfg.games}
    for name in sorted(set(workers) - configured):
        out.append(_game(cfg, name, None, None, 0, workers[name], modes, now, in_config=False))
    mirror = MirrorState.read(cfg.state_dir) if cfg.mirror is not None else None
    for g in out:
        if mirror is not None:
            g["mirror_step"], g["mirror_age_s"] = mirror.game_view(g["name"], now)
    return out


def _game(
    cfg: Config,
    name: str,
    env_id: str | None,
    algo: str | None,
    total_steps: int,
    w: dict[str, Any] | None,
    modes: dict[str, str],
    now: float,
    in_config: bool = True,
) -> GameDoc:
    run_dir = cfg.run_dir(name)
    w = w or {}
    db_hb = w.get("heartbeat") if isinstance(w.get("heartbeat"), dict) else None
    hb = _fresher(read_json_file(run_dir / HEARTBEAT_FILE), db_hb) or {}
    tail = readonly.read_progress_tail(run_dir)
    last_row = tail[-1] if tail else {}
    state = w.get("state") or "not_started"
    pid = w.get("pid") or hb.get("pid")
    # Several hosts: a worker on another host (its heartbeat relayed, naming the host) is no
    # process of this one: its liveness is the heartbeat's to tell.
    host = hb.get("host") if isinstance(hb.get("host"), str) else None
    alive = (
        pid_alive(pid, w.get("pid_start_ticks"), w.get("pid_create_time"))
        if state in LIVE_STATES and host is None
        else None
    )

    step = hb.get("global_step")
    if step is None:
        step = readonly.to_float(last_row.get("global_step"))
    step = int(step or 0)
    total = int(hb.get("total_steps") or total_steps or 0)
    if in_config and total_steps:
        total = total_steps
    sps = hb.get("sps", readonly.to_float(last_row.get("sps")))
    episodes = hb.get("episodes", readonly.to_float(last_row.get("episodes")))
    mean_return = hb.get("mean_return") if hb else readonly.to_float(last_row.get("mean_return"))
    hb_age = max(0.0, now - hb["time"]) if hb.get("time") else None
    stale = state == "running" and (hb_age is None or hb_age > HEARTBEAT_STALE_S)
    eta = None
    eval_return, eval_step = _last_eval(run_dir, hb)
    if not (state in LIVE_STATES and (alive or (host is not None and not stale))):
        sps = None  # the last speed of a worker that is not running is no current speed
    if state == "running" and sps and sps > 0 and total > step and not stale:
        eta = (total - step) / sps
    return {
        "name": name,
        "env_id": env_id,
        "algo": algo,
        "in_config": in_config,
        "state": state,
        "reason": w.get("reason"),
        "state_since": w.get("state_since"),
        "pid": pid,
        "pid_alive": alive,
        "host": host,
        "phase": hb.get("phase"),
        "mode": w.get("mode") or modes.get(name) or modes.get("*"),
        "num_envs": w.get("num_envs") or hb.get("num_envs") or None,
        "batch_size": w.get("batch_size") or hb.get("batch_size") or None,
        "global_step": step,
        "total_steps": total,
        "percent": round(100.0 * step / total, 2) if total else 0.0,
        "episodes": None if episodes is None else int(episodes),
        "episodes_per_hour": episodes_per_hour(tail, now),
        "sps": None if sps is None else float(sps),
        "mean_return": mean_return,
        "last_checkpoint_step": hb.get("last_checkpoint_step"),
        "last_checkpoint_age_s": _checkpoint_age(run_dir, hb, now),
        "mirror_step": None,
        "mirror_age_s": None,
        "restarts": int(w.get("restarts") or 0),
        "eta_s": eta,
        "heartbeat_age_s": hb_age,
        "heartbeat_stale": stale,
        "last_error": _last_error(run_dir) if state in ("fatal", "backoff", "exited") else None,
        "start": w.get("last_start") if isinstance(w.get("last_start"), dict) else None,
        "device": hb.get("device") if isinstance(hb.get("device"), str) else None,
        "gpu": w.get("gpu") if isinstance(w.get("gpu"), dict) else None,
        "device_note": _device_note(cfg, name, hb),
        "precision": hb.get("precision") if isinstance(hb.get("precision"), str) else None,
        "eval_return": eval_return,
        "eval_step": eval_step,
        "kind": None,  # set from the configuration by `_kind`
        "command": None,
        "contract_level": None,
        "hang_detection": True,
        "time": None,
    }


def _kind(cfg: Config, spec: GameSpec, doc: GameDoc) -> None:
    """What kind of game (rlsup's worker or the user's command), and for a command game the
    contract level it reached (docs/own-trainer.md): L0 no heartbeat seen, L1 heartbeats, L2 a
    committed checkpoint. A command game that promised no heartbeat and sent none has no hang
    detection: its missing heartbeat is no stale one."""
    doc["kind"] = spec.kind
    if spec.command is None:
        return
    beats = doc["heartbeat_age_s"] is not None
    level = "L1" if beats else "L0"
    if newest_step(cfg.run_dir(spec.name) / CHECKPOINT_DIR) is not None:
        level = "L2"
    doc["command"] = list(spec.command)
    doc["contract_level"] = level
    doc["hang_detection"] = spec.heartbeat or beats
    if not doc["hang_detection"]:
        doc["heartbeat_stale"] = False


def _device_note(cfg: Config, name: str, hb: dict[str, Any]) -> str | None:
    """Why a `device = "auto"` game trains on the CPU of a host with an NVIDIA driver ("no CUDA
    torch", "CUDA unavailable"), from what its worker reported (`torch_build`); else None."""
    build = hb.get("torch_build")
    requested = next((g.device for g in cfg.games if g.name == name), "auto")
    if requested != "auto" or hb.get("device") != "cpu" or not isinstance(build, dict):
        return None
    return torchbuild.cpu_fallback_reason(
        build.get("driver"), build.get("cuda") is not None, build.get("cuda_available")
    )


def _last_eval(run_dir: Path, hb: dict[str, Any]) -> tuple[float | None, int | None]:
    """eval_return / eval_step: the heartbeat's newest evaluation, else eval.json's (the one a
    finished run, or an earlier worker, left)."""
    ev = hb.get("eval") if isinstance(hb.get("eval"), dict) else None
    if ev is None or ev.get("mean") is None:
        ev = read_json_file(run_dir / EVAL_FILE) or ev or {}
    mean, step = readonly.to_float(ev.get("mean")), ev.get("step")
    return mean, int(step) if isinstance(step, int | float) and mean is not None else None


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
    spent = rate * (now - since) / 3600.0
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
