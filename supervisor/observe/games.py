"""Each game's row of the status document (`games[]`): its database row and its run dir.

The run dir's files (heartbeat.json, eval.json, error.json, progress.csv) are another
process's: every value is checked where it is read here (`fields`), so that an unusable one is
shown as `-` (null in JSON) and reported once, never a traceback in `rlsup status`, the
dashboard or the metrics thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.ledger import reads
from supervisor.observe import fields, readonly
from training.run_files import (
    CHECKPOINT_DIR,
    ERROR_FILE,
    EVAL_FILE,
    HEARTBEAT_FILE,
    PROGRESS_FILE,
    read_json_file,
)

# `rlsup status` is a glance: what only a rarer row needs (a mirror, a command game, a heartbeat
# without a checkpoint time, a CPU fallback's reason) is imported where it is read, and the
# records are types only (tests/cli/test_status_imports.py keeps it so).
if TYPE_CHECKING:
    from supervisor.config import Config, GameSpec
    from supervisor.observe.schema import ErrorDoc, GameDoc

HEARTBEAT_STALE_S = 30.0  # a live worker's heartbeat older than this is flagged


# A worker process exists: the lifecycle's ALIVE states (`supervisor.lifecycle.states`), as
# the workers table spells them. Named here, not imported: its state machine (an enum, the
# edges, a dataclass) is no part of a status line; test_status_imports.py checks they agree.
LIVE_STATES = frozenset({"starting", "running", "stopping"})


EPH_WINDOW_S = 3600.0


def pid_alive(pid: int | None, ticks: int | None, create_time: float | None = None) -> bool:
    """Is this pid alive and the same process as recorded (procid.same_process)?"""
    if not pid:
        return False
    from supervisor.launch.process import same_process  # only when a pid is recorded

    return same_process(pid, ticks, create_time)


def games(conn: sqlite3.Connection | None, cfg: Config, now: float) -> list[GameDoc]:
    workers = {r["game"]: r for r in (reads.workers(conn) if conn is not None else [])}
    modes = {r["scope"]: r["mode"] for r in reads.mode_rows(conn)}
    out = [
        _game(cfg, g.name, g.env_id, g.algo, g.total_steps, workers.get(g.name), modes, now)
        for g in cfg.games
    ]
    for doc, spec in zip(out, cfg.games, strict=True):
        _kind(cfg, spec, doc)
    configured = {g.name for g in cfg.games}
    for name in sorted(set(workers) - configured):
        out.append(_game(cfg, name, None, None, 0, workers[name], modes, now, in_config=False))
    if cfg.mirror is None:
        return out
    from supervisor.mirror.state import MirrorState

    mirror = MirrorState.read(cfg.state_dir)
    for g in out:
        if mirror is not None:
            g["mirror_step"], g["mirror_age_s"] = mirror.game_view(g["name"], now)
    return out


def _fresher(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    if not a or not b:
        return a or b
    return a if (a.get("time") or 0) >= (b.get("time") or 0) else b


def _heartbeat(cfg: Config, name: str, run_dir: Path, w: dict[str, Any]) -> dict[str, Any]:
    """The fresher of the run dir's heartbeat and the one the supervisor recorded, each field
    checked (one the supervisor parsed can still hold what an older release let through)."""
    path = run_dir / HEARTBEAT_FILE
    live = fields.heartbeat(read_json_file(path), path)
    row = w.get("heartbeat")
    recorded = fields.heartbeat(
        row if isinstance(row, dict) else None, f"{cfg.db_path} (workers.heartbeat of {name})"
    )
    return _fresher(live, recorded)


def episodes_per_hour(rows: Sequence[dict[str, str]], now: float) -> float | None:
    """Episodes per hour over the last hour of progress rows (one resume segment), walking
    back from the newest row only as far as it needs to. A row whose time or count is no
    usable number is passed over."""
    newest: tuple[float, float] | None = None
    t0 = e0 = 0.0
    pairs = (
        rows.column_pairs("time", "episodes")
        if isinstance(rows, readonly.ProgressRows)
        else ((r.get("time"), r.get("episodes")) for r in reversed(rows))
    )
    for tt, ee in pairs:
        t, e = readonly.to_time(tt), readonly.to_float(ee)
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


def _resumed_step(run_dir: Path, hb: dict[str, Any]) -> int:
    """The step a (re)started worker that has not stepped yet stands at: the checkpoint it
    resumed from (its heartbeat's `resumed_from_step`), else its newest committed checkpoint
    (the one it is loading, or a predecessor left), else 0 (a first start). Never the 0 of a
    heartbeat whose loop has not begun."""
    for key in ("resumed_from_step", "last_checkpoint_step"):
        if hb.get(key):
            return int(hb[key])
    if not hb:
        return 0  # no worker yet (a game waiting for its first start): nothing to scan
    from checkpoints.names import newest_step  # only for a worker yet to step

    return newest_step(run_dir / CHECKPOINT_DIR) or 0


def _checkpoint_age(run_dir: Path, hb: dict[str, Any], now: float) -> float | None:
    t = hb.get("last_checkpoint_time")
    if t:
        return max(0.0, now - float(t))
    step = hb.get("last_checkpoint_step")
    if step is None:
        return None
    from checkpoints.names import ckpt_name

    try:
        ckpt = run_dir / CHECKPOINT_DIR / ckpt_name(int(step))
        return max(0.0, now - ckpt.stat().st_mtime)
    except (OSError, ValueError):
        return None


def _last_error(run_dir: Path) -> ErrorDoc | None:
    path = run_dir / ERROR_FILE
    err = read_json_file(path)
    if not err:
        return None
    return {
        "kind": fields.text(err, "kind", path),
        "message": fields.text(err, "message", path),
        "step": fields.count(err, "step", path),
    }


class _Progress:
    """The newest progress.csv row, each cell checked when first asked for (a cell status
    does not show is never reported)."""

    def __init__(self, run_dir: Path, tail: Sequence[dict[str, str]]) -> None:
        self.path = run_dir / PROGRESS_FILE
        self.row = tail[-1] if tail else {}

    def count(self, key: str) -> int | None:
        return fields.count(self.row, key, self.path)

    def number(self, key: str, lo: float = float("-inf")) -> float | None:
        return fields.number(self.row, key, self.path, lo)


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
    hb = _heartbeat(cfg, name, run_dir, w)
    tail = readonly.read_progress_tail(run_dir)
    last = _Progress(run_dir, tail)
    state = w.get("state") or "not_started"
    pid = w.get("pid") or hb.get("pid")
    # Several hosts: a worker on another host (its heartbeat relayed, naming the host) is no
    # process of this one: its liveness is the heartbeat's to tell.
    host = hb.get("host")
    alive = (
        pid_alive(pid, w.get("pid_start_ticks"), w.get("pid_create_time"))
        if state in LIVE_STATES and host is None
        else None
    )

    step = hb["global_step"] if "global_step" in hb else last.count("global_step")
    step = int(step or 0) or _resumed_step(run_dir, hb)
    total = int(hb.get("total_steps") or total_steps or 0)
    if in_config and total_steps:
        total = total_steps
    # The heartbeat's figures, else the newest progress row's (a heartbeat is removed when a
    # worker restarts); a cell is read only when the heartbeat has no usable value.
    sps = hb["sps"] if "sps" in hb else last.number("sps", 0.0)
    episodes = hb["episodes"] if "episodes" in hb else last.count("episodes")
    mean_return = hb.get("mean_return") if hb else last.number("mean_return")
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
        "episodes": episodes,
        "episodes_per_hour": episodes_per_hour(tail, now),
        "sps": sps,
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
        "device": hb.get("device"),
        "gpu": w.get("gpu") if isinstance(w.get("gpu"), dict) else None,
        "device_note": _device_note(cfg, name, hb),
        "precision": hb.get("precision"),
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
    from checkpoints.names import newest_step

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
    from training import torchbuild

    driver = build.get("driver")
    return torchbuild.cpu_fallback_reason(
        driver if isinstance(driver, str) else None,
        build.get("cuda") is not None,
        build.get("cuda_available") if isinstance(build.get("cuda_available"), bool) else None,
    )


def _last_eval(run_dir: Path, hb: dict[str, Any]) -> tuple[float | None, int | None]:
    """eval_return / eval_step: the heartbeat's newest evaluation, else eval.json's (the one a
    finished run, or an earlier worker, left); both already checked field by field."""
    ev = hb.get("eval") if isinstance(hb.get("eval"), dict) else None
    if ev is None or ev.get("mean") is None:
        path = run_dir / EVAL_FILE
        ev = fields.evaluation(read_json_file(path), path) or ev or {}
    mean, step = ev.get("mean"), ev.get("step")
    return mean, step if mean is not None else None
