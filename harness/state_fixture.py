"""Build a realistic state directory for the CLI tests and the status latency benchmark.

The database is written with the schema of the contract (ARCHITECTURE.md section 5) by plain
SQL, not by `supervisor.ledger.db`, so that the read side is tested against the contract itself.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE boots(boot_id TEXT PRIMARY KEY, boot_time REAL, first_seen REAL NOT NULL,
                   last_seen REAL NOT NULL, clean_stop INTEGER NOT NULL DEFAULT 0);
CREATE TABLE events(id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL, game TEXT,
                    detail TEXT NOT NULL DEFAULT '{}');
CREATE TABLE workers(game TEXT PRIMARY KEY, state TEXT NOT NULL, pid INTEGER,
                     pid_create_time REAL, mode TEXT, num_envs INTEGER, batch_size INTEGER,
                     restarts INTEGER NOT NULL DEFAULT 0, state_since REAL, reason TEXT,
                     heartbeat TEXT, updated REAL);
CREATE TABLE samples(ts REAL NOT NULL, data TEXT NOT NULL);
CREATE TABLE desired(scope TEXT PRIMARY KEY, mode TEXT NOT NULL, pinned INTEGER NOT NULL,
                     updated REAL NOT NULL);
CREATE TABLE modes(scope TEXT PRIMARY KEY, mode TEXT NOT NULL, since REAL NOT NULL, reason TEXT);
CREATE TABLE supervisor(id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER,
                        pid_create_time REAL, boot_id TEXT, started REAL, last_tick REAL,
                        config_path TEXT, state TEXT);
"""

ENV_IDS = (
    "Pong-v5",
    "Breakout-v5",
    "MsPacman-v5",
    "Seaquest-v5",
    "SpaceInvaders-v5",
    "Enduro-v5",
    "Freeway-v5",
    "Asteroids-v5",
)
BOOT_ID = "fixture-boot-3"
DAY = 86400.0

CONFIG = """\
state_dir = "state"
initial_mode = "light"
cost_per_hour = {cost}

[modes.light]
num_envs = 8
batch_size = 256
n_steps = 128
max_concurrent = 2
[modes.medium]
num_envs = 32
batch_size = 1024
n_steps = 128
max_concurrent = 4
[modes.heavy]
num_envs = 64
batch_size = 2048
n_steps = 256
max_concurrent = 8
{games}
"""
GAME = """
[[games]]
name = "{name}"
env_id = "{env_id}"
algo = "ppo"
total_steps = {total}
"""


@dataclass
class GameFixture:
    name: str
    state: str
    global_step: int
    total_steps: int
    pid: int | None = None
    pid_create_time: float | None = None
    restarts: int = 0
    reason: str | None = None
    sps: float = 500.0
    heartbeat_age_s: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StateFixture:
    root: Path
    config: Path
    state_dir: Path
    now: float
    games: list[GameFixture]
    boot_id_path: Path

    @property
    def db(self) -> Path:
        return self.state_dir / "rlsup.db"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["RLSUP_BOOT_ID_PATH"] = str(self.boot_id_path)
        env.pop("RLSUP_CONFIG", None)
        return env


def heartbeat(g: GameFixture, now: float) -> dict[str, Any]:
    return {
        "schema": 1,
        "seq": 1234,
        "pid": g.pid or 0,
        "phase": "training",
        "phase_deadline_s": 60.0,
        "global_step": g.global_step,
        "total_steps": g.total_steps,
        "episodes": g.global_step // 1000,
        "sps": g.sps,
        "mean_return": 12.5,
        "last_checkpoint_step": max(0, g.global_step - 20_000),
        "resumed_from_step": None,
        "num_envs": 32,
        "batch_size": 1024,
        "device": "cpu",
        "gpu_mem_mb": None,
        "game": g.name,
        "algo": "ppo",
        "time": now - g.heartbeat_age_s,
        "last_checkpoint_time": now - 240.0,
        "resume_count": g.restarts,
    }


def write_progress(run_dir: Path, g: GameFixture, now: float, rows: int, every_s: float) -> None:
    lines = ["time,wall_s,global_step,episodes,sps,mean_return,num_envs,batch_size,resume_count"]
    start = now - rows * every_s
    for i in range(rows):
        frac = (i + 1) / rows
        step = int(g.global_step * frac)
        ret = -21.0 + 33.5 * frac**0.7 + 1.5 * ((i * 7919) % 13 - 6) / 6.0 * (1 - frac)
        lines.append(
            f"{start + i * every_s:.3f},{i * every_s:.1f},{step},{step // 1000},"
            f"{g.sps * (0.9 + 0.1 * frac + 0.02 * ((i * 31) % 5)):.1f},{ret:.3f},32,1024,0"
        )
    (run_dir / "progress.csv").write_text("\n".join(lines) + "\n")


def default_games(n: int, now: float) -> list[GameFixture]:
    me = os.getpid()
    import psutil

    ctime = psutil.Process(me).create_time()
    states = ["running", "running", "backoff", "done", "waiting", "fatal", "running", "stopped"]
    games = []
    for i in range(n):
        name = ENV_IDS[i % len(ENV_IDS)].split("-")[0].lower() + ("" if i < 8 else str(i))
        state = states[i % len(states)]
        total = 10_000_000
        step = total if state == "done" else 1_000_000 * (i + 1)
        running = state == "running"
        games.append(
            GameFixture(
                name=name,
                state=state,
                global_step=step,
                total_steps=total,
                pid=me if running else None,
                pid_create_time=ctime if running else None,
                restarts=i % 3,
                reason="restart budget spent: 5 crashes in 1h" if state == "fatal" else None,
            )
        )
    return games


def build_state(
    root: Path,
    *,
    games: list[GameFixture] | None = None,
    n_games: int = 5,
    n_events: int = 2_000,
    progress_rows: int = 500,
    progress_every_s: float = 30.0,
    cost_per_hour: float = 0.0,
    supervisor_alive: bool = True,
    with_db: bool = True,
    seed: int = 0,
) -> StateFixture:
    """A config file, a state database covering a week, run dirs with heartbeats and progress."""
    rng = random.Random(seed)
    now = time.time()
    games = games if games is not None else default_games(n_games, now)
    root.mkdir(parents=True, exist_ok=True)
    boot_id_path = root / "boot_id"
    boot_id_path.write_text(BOOT_ID + "\n")
    config = root / "rlsup.toml"
    config.write_text(
        CONFIG.format(
            cost=cost_per_hour,
            games="".join(
                GAME.format(name=g.name, env_id=ENV_IDS[i % len(ENV_IDS)], total=g.total_steps)
                for i, g in enumerate(games)
            ),
        )
    )
    state_dir = root / "state"
    for g in games:
        run_dir = state_dir / "runs" / g.name
        run_dir.mkdir(parents=True, exist_ok=True)
        if g.state != "waiting":
            (run_dir / "heartbeat.json").write_text(json.dumps(heartbeat(g, now)))
            write_progress(run_dir, g, now, progress_rows, progress_every_s)
        if g.state == "fatal":
            (run_dir / "error.json").write_text(
                json.dumps(
                    {"kind": "crash", "message": "RuntimeError: boom", "step": g.global_step}
                )
            )
    fx = StateFixture(root, config, state_dir, now, games, boot_id_path)
    if with_db:
        _write_db(fx, n_events, rng, supervisor_alive)
        if supervisor_alive:
            # What a running supervisor keeps beside the database: each game's time split
            # (its TimeLedger writes it every 30 s), as status reads it.
            from supervisor.config import load_config
            from supervisor.participants import TimeLedger

            TimeLedger(load_config(config)).write()
    return fx


def _write_db(fx: StateFixture, n_events: int, rng: random.Random, alive: bool) -> None:
    now = fx.now
    conn = sqlite3.connect(fx.db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    # Three boots in a week: the first ended cleanly, the second crashed (unexpected reboot
    # 30 h ago), the third is this one.
    boots = [
        ("fixture-boot-1", now - 7 * DAY, now - 7 * DAY, now - 3 * DAY, 1),
        ("fixture-boot-2", now - 3 * DAY + 60, now - 3 * DAY + 90, now - 30 * 3600 - 120, 0),
        (BOOT_ID, now - 30 * 3600, now - 30 * 3600 + 40, now - 1, 0),
    ]
    conn.executemany("INSERT INTO boots VALUES (?,?,?,?,?)", boots)
    kinds = [
        "worker_start",
        "restart",
        "worker_exit",
        "backoff",
        "checkpoint_failed",
        "gpu_wait",
        "worker_crash",
        "worker_hang",
        "worker_oom",
        "scale_up",
        "scale_down",
    ]
    names = [g.name for g in fx.games]
    rows = []
    for i in range(n_events):
        ts = now - 7 * DAY + (i + 1) * (7 * DAY - 3600) / (n_events + 1)
        kind = rng.choice(kinds)
        game = None if kind in ("scale_up", "scale_down") else rng.choice(names)
        rows.append((ts, kind, game, json.dumps({"i": i, "reason": f"synthetic {kind}"})))
    rows.append(
        (
            now - 30 * 3600 + 40,
            "host_reboot",
            None,
            json.dumps({"previous_boot_id": "fixture-boot-2", "downtime_s": 120}),
        )
    )
    rows.append(
        (
            now - 1800,
            "scale_down",
            None,
            json.dumps({"from": "medium", "to": "light", "reason": "2 worker_oom in 1h"}),
        )
    )
    rows.append((now - 600, "worker_crash", names[0], json.dumps({"returncode": -9})))
    rows.sort()
    conn.executemany("INSERT INTO events(ts, kind, game, detail) VALUES (?,?,?,?)", rows)
    for g in fx.games:
        hb = None if g.state == "waiting" else json.dumps(heartbeat(g, now - 5))
        conn.execute(
            "INSERT INTO workers VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                g.name,
                g.state,
                g.pid,
                g.pid_create_time,
                "light",
                32,
                1024,
                g.restarts,
                now - 3600,
                g.reason,
                hb,
                now - 1,
            ),
        )
    sample = {
        "ram_available_pct": 61.5,
        "cpu_pct": 87.0,
        "gpus": [
            {
                "index": 0,
                "mem_used_mb": 9100,
                "mem_total_mb": 24576,
                "util_pct": 93,
                "temp_c": 71,
                "power_w": 230,
            }
        ],
    }
    conn.executemany(
        "INSERT INTO samples VALUES (?, ?)",
        [(now - 60 * k, json.dumps(sample)) for k in range(2000, -1, -1)],
    )
    conn.execute("INSERT INTO modes VALUES ('*', 'light', ?, '2 worker_oom in 1h')", (now - 1800,))
    conn.execute("INSERT INTO desired VALUES ('*', 'light', 0, ?)", (now - 1800,))
    import psutil

    me = psutil.Process(os.getpid())
    pid, ctime = (me.pid, me.create_time()) if alive else (2**22 + 17, 1.0)
    conn.execute(
        "INSERT INTO supervisor VALUES (1, ?, ?, ?, ?, ?, ?, 'running')",
        (pid, ctime, BOOT_ID, now - 30 * 3600 + 40, now - 1, str(fx.config)),
    )
    conn.commit()
    conn.close()


# ---- a matrix: one [[games]] table over seeds x variants, with metrics and a resume -----------

MATRIX_GAME = """
[[games]]
name = "{name}"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = {total}
seeds = [{seeds}]
[games.variants]
{variants}
"""
MATRIX_METRICS = ("policy_loss", "value_loss", "my_metric")
SUPERSEDED = -999.0  # the value of every row a resume superseded: no curve may show it


def matrix_return(variant: int, seed: int, frac: float) -> float:
    """The mean return written at `frac` of the run: each variant its own level, seeds apart."""
    return 100.0 * (variant + 1) * frac + 3.0 * seed


def write_matrix_progress(
    run_dir: Path,
    *,
    variant: int,
    seed: int,
    total: int,
    start: float,
    rows: int,
    every_s: float,
    resume: tuple[float, float] | None = None,
    bad_cells: int = 0,
) -> None:
    """progress.csv with the built-in columns, PPO's diagnostics and an SDK-style metric.
    `resume` = (at, back): the worker died at fraction `at` of the rows and resumed from the
    checkpoint at fraction `back`: the rows it wrote past `back` carry SUPERSEDED, the next
    life (resume_count 1) writes them again. `bad_cells`: that many `my_metric` cells `nan`."""
    head = ("time,wall_s,global_step,episodes,sps,mean_return,num_envs,batch_size,resume_count,"
            + ",".join(MATRIX_METRICS))  # fmt: skip
    lines = [head]
    t = start

    def row(i: int, life: int, superseded: bool) -> str:
        frac = (i + 1) / rows
        step = int(total * frac)
        ret = SUPERSEDED if superseded else matrix_return(variant, seed, frac)
        loss = SUPERSEDED if superseded else 1.0 / (1.0 + 10 * frac) + 0.01 * seed
        mine = "nan" if i < bad_cells else f"{SUPERSEDED if superseded else seed * frac:.4f}"
        return (f"{t:.3f},{t - start:.1f},{step},{step // 200},500.0,{ret:.3f},8,256,{life},"
                f"{loss:.5f},{2 * loss:.5f},{mine}")  # fmt: skip

    life = 0
    if resume is None:
        plan = [(i, 0, False) for i in range(rows)]
    else:
        at, back = int(resume[0] * rows), int(resume[1] * rows)
        plan = [(i, 0, i >= back) for i in range(at)]
        plan += [(i, 1, False) for i in range(back, rows)]
    for i, life, superseded in plan:
        lines.append(row(i, life, superseded))
        t += every_s
    (run_dir / "progress.csv").write_text("\n".join(lines) + "\n")


def build_matrix_state(
    root: Path,
    *,
    game: str = "cart",
    variants: tuple[tuple[str, str], ...] = (("base", "{}"), ("lr3", "{ learning_rate = 3e-4 }")),
    seeds: tuple[int, ...] = (1, 2, 3),
    rows: int = 120,
    every_s: float = 10.0,
    total: int = 120_000,
    resumed: str | None = "lr3/s2",
    bad_cells: int = 0,
) -> StateFixture:
    """One [[games]] table over `seeds` x `variants` (runs GAME/VARIANT/sSEED), each run done
    with a progress.csv of the built-in columns, PPO's diagnostics and `my_metric`; the run
    GAME/`resumed` crashed at 80 % and resumed from its checkpoint at 50 % (its events:
    worker_exit, worker_crash, backoff, restart). A state database as `build_state`'s."""
    now = time.time()
    root.mkdir(parents=True, exist_ok=True)
    boot_id_path = root / "boot_id"
    boot_id_path.write_text(BOOT_ID + "\n")
    config = root / "rlsup.toml"
    body = MATRIX_GAME.format(
        name=game, total=total, seeds=", ".join(map(str, seeds)),
        variants="\n".join(f"{v} = {args}" for v, args in variants),
    )  # fmt: skip
    config.write_text(CONFIG.format(cost=0.0, games=body))
    state_dir = root / "state"
    start = now - 1.4 * rows * every_s - 60  # the resumed run's 1.3 lives in the past too
    games = []
    crash_ts = start + 0.8 * rows * every_s
    for seed in seeds:
        for k, (variant, _) in enumerate(variants):
            name = f"{game}/{variant}/s{seed}"
            run_dir = state_dir / "runs" / name
            run_dir.mkdir(parents=True, exist_ok=True)
            is_resumed = resumed is not None and name == f"{game}/{resumed}"
            g = GameFixture(name=name, state="done", global_step=total, total_steps=total,
                            restarts=1 if is_resumed else 0)  # fmt: skip
            games.append(g)
            (run_dir / "heartbeat.json").write_text(json.dumps(heartbeat(g, now)))
            write_matrix_progress(
                run_dir, variant=k, seed=seed, total=total, start=start, rows=rows,
                every_s=every_s, resume=(0.8, 0.5) if is_resumed else None, bad_cells=bad_cells,
            )  # fmt: skip
    fx = StateFixture(root, config, state_dir, now, games, boot_id_path)
    _write_db(fx, 40, random.Random(0), alive=False)
    if resumed is not None:
        name = f"{game}/{resumed}"
        step, ckpt = int(total * 0.8), int(total * 0.5)
        crash = [
            ("worker_exit", {"returncode": -9, "exit": "killed_by_signal", "uptime_s": 960.0,
                             "global_step": step, "last_checkpoint_step": ckpt}),
            ("worker_crash", {"returncode": -9, "description": "killed by SIGKILL",
                              "error_kind": None, "message": None, "uptime_s": 960.0}),
            ("backoff", {"from": "exited", "to": "backoff", "reason": "killed_by_signal: "
                         "killed by SIGKILL", "delay_s": 0.0, "failures": 1, "budget": 5}),
            ("restart", {"from": "backoff", "to": "starting", "reason": "restart after backoff",
                         "restarts": 1, "mode": "light", "served": "cold"}),
        ]  # fmt: skip
        conn = sqlite3.connect(fx.db)
        with conn:  # the events table in time order, as a supervisor writes it
            rows = conn.execute("SELECT ts, kind, game, detail FROM events").fetchall()
            rows += [(crash_ts + 0.01 * k, kind, name, json.dumps(d))
                     for k, (kind, d) in enumerate(crash)]  # fmt: skip
            conn.execute("DELETE FROM events")
            conn.executemany(
                "INSERT INTO events(ts, kind, game, detail) VALUES (?,?,?,?)",
                sorted(rows, key=lambda r: r[0]),
            )
        conn.close()
    return fx
