"""A state dir with a sweep part-way through: a real Optuna study (the lead's `Study`, the
supervisor's own writer) and its trials' run dirs, for the results and dashboard tests.

The config: one [[games]] table `cart` (CartPole, seeds 1 and 2) with a [games.sweep] of
`trials` trials over `learning_rate` (a log range), `n_steps` (a list of ints), `clip_coef`
(a linear range) and `lr_scheduler` (a list of words); a median pruner on the periodic
evaluations. The study, in the order the
supervisor writes it: each trial asked (`params`), its evaluations reported, then told:

- trials 0-3 complete, each with a final evaluation per seed (eval.json) whose mean is the
  value the study was told;
- trial 4 pruned at its second evaluation, its runs' heartbeats carry its last periodic one;
- trial 5 failed, with the message a script's exit 78 leaves;
- trial 6 running (one evaluation reported), trials 7.. not asked yet (waiting).

The values are known in advance (`VALUES`): trial 2 is the best, so the ranking and the best
so far can be checked exactly. A state database as `build_state`'s (plain SQL, read-only side
tested against the contract), with the runs as workers and a start/exit pair per run so their
time and money show.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from harness.state_fixture import BOOT_ID, CONFIG, SCHEMA

SWEEP_GAME = """
[[games]]
name = "{name}"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = 4096
seeds = [1, 2]
args = {{ eval_every_steps = 1024, eval_episodes = 2 }}
[games.sweep]
trials = {trials}
direction = "maximize"
sampler = "random"
pruner = "median"
min_trials = 2
seed = 7
[games.sweep.params]
learning_rate = {{ low = 1e-5, high = 1e-2, log = true }}
n_steps = [64, 128, 256]
clip_coef = {{ low = 0.1, high = 0.4 }}
lr_scheduler = ["none", "cosine", "linear"]
"""
# trial -> (state, value told, per-seed evaluations (s1, s2))
VALUES: dict[int, tuple[str, float | None, tuple[float, float] | None]] = {
    0: ("complete", 120.0, (110.0, 130.0)),
    1: ("complete", 80.0, (78.0, 82.0)),
    2: ("complete", 410.5, (400.0, 421.0)),
    3: ("complete", 300.0, (290.0, 310.0)),
    4: ("pruned", 35.0, (30.0, 40.0)),
    5: ("fail", None, None),
    6: ("running", None, None),
}
PRUNED_MESSAGE = "pruned by the median pruner at evaluation 2 (35.00 < median 120.00)"
FAIL_MESSAGE = "exit 78: the script refused its parameters: n_steps=256 too large for <this>"


@dataclass
class SweepFixture:
    root: Path
    config: Path
    state_dir: Path
    name: str
    trials: int

    @property
    def store(self) -> Path:
        return self.state_dir / "sweeps" / f"{self.name}.db"


def build_sweep_state(root: Path, *, name: str = "cart", trials: int = 10) -> SweepFixture:
    """The config, the study (trials 0-6 as `VALUES` says), the trials' run dirs, a database."""
    from supervisor.config import load_config
    from supervisor.observe.sweeps import sweep_spec
    from supervisor.sweep.study import Study

    now = time.time()
    root.mkdir(parents=True, exist_ok=True)
    (root / "boot_id").write_text(BOOT_ID + "\n")
    config = root / "rlsup.toml"
    config.write_text(CONFIG.format(cost=3.6, games=SWEEP_GAME.format(name=name, trials=trials)))
    cfg = load_config(config)
    spec = sweep_spec(cfg, name)
    study = Study(spec, cfg.state_dir)
    runs: list[tuple[str, float, float]] = []  # (run, started, ended)
    t0 = now - 3600.0
    for n, (state, value, seeds) in VALUES.items():
        study.params(n)
        start = t0 + 300.0 * n
        if state in ("complete", "pruned", "running"):
            reported = [value * 0.5, value] if value is not None else [10.0 + n]
            for k, v in enumerate(reported[:2] if state != "running" else reported[:1]):
                study.report(n, k, v)
        if state == "complete":
            study.tell(n, "complete", value)
        elif state == "pruned":
            study.tell(n, "pruned", None, PRUNED_MESSAGE)
        elif state == "fail":
            study.tell(n, "fail", None, FAIL_MESSAGE)
        for k, run in enumerate(spec.runs_of(n)):
            run_dir = cfg.run_dir(run)
            run_dir.mkdir(parents=True, exist_ok=True)
            steps = 4096 if state == "complete" else 2048
            ev = None if seeds is None else seeds[k]
            heartbeat = {
                "schema": 1, "seq": 10, "pid": 0, "phase": "training", "global_step": steps,
                "total_steps": 4096, "sps": 900.0, "mean_return": 50.0 + n, "game": "CartPole-v1",
                "algo": "ppo", "time": start + 250.0,
            }  # fmt: skip
            if ev is not None and state != "complete":
                heartbeat["eval"] = {"mean": ev, "step": steps, "episodes": 2}
            (run_dir / "heartbeat.json").write_text(json.dumps(heartbeat))
            if ev is not None and state == "complete":
                final = {"mean": ev, "step": 4096, "episodes": 2}
                (run_dir / "eval.json").write_text(json.dumps(final))
            (run_dir / "progress.csv").write_text(
                "time,wall_s,global_step,episodes,sps,mean_return\n"
                f"{start + 100:.3f},100.0,{steps // 2},5,900.0,20.0\n"
                f"{start + 200:.3f},200.0,{steps},10,900.0,{50.0 + n}\n"
            )
            runs.append((run, start, start + 240.0 if state != "running" else now))
    _write_db(cfg.db_path, runs, now)
    return SweepFixture(root, config, cfg.state_dir, name, trials)


def _write_db(db: Path, runs: list[tuple[str, float, float]], now: float) -> None:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    conn.execute("INSERT INTO boots VALUES (?,?,?,?,0)", (BOOT_ID, now - 7200, now - 7200, now - 1))
    events: list[tuple[float, str, str | None, str]] = [
        (now - 7200, "supervisor_start", None, json.dumps({"pid": 1}))
    ]
    for run, start, end in runs:
        events.append((start, "worker_start", run, json.dumps({"pid": 1, "mode": "light"})))
        if end < now:
            done = {"returncode": 0, "exit": "done", "global_step": 4096}
            events.append((end, "worker_exit", run, json.dumps(done)))
            events.append((end + 0.01, "game_done", run, "{}"))
    events.sort(key=lambda e: e[0])  # the ledger's order: by time
    conn.executemany("INSERT INTO events(ts, kind, game, detail) VALUES (?,?,?,?)", events)
    for run, start, end in runs:
        state = "running" if end >= now else "done"
        conn.execute(
            "INSERT INTO workers(game, state, restarts, state_since, updated) VALUES (?,?,0,?,?)",
            (run, state, start, now - 1),
        )
    conn.execute(
        "INSERT INTO supervisor VALUES (1, ?, 1.0, ?, ?, ?, '', 'stopped')",
        (2**22 + 17, BOOT_ID, now - 7200, now - 1),
    )
    conn.commit()
    conn.close()
