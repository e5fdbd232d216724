"""Results over seeds (`rlsup results`): per game and variant, the final evaluation and the
last-100 training return of its runs, with their spread, a human-normalised score for the
Atari-57 games, and the aggregate across games (median and IQM of normalised scores).

Read from the state dir alone (each run's eval.json, heartbeat.json and progress.csv, the
database read-only for the runs' states): it works while the supervisor is down and costs
the supervisor nothing. Stdlib only.

A run's figures:
- `eval`: its final evaluation (eval.json, written when the run reaches total_steps), else its
  newest periodic one (the heartbeat's `eval`, `eval_every_steps`); `eval_final` says which.
- `last_100`: the mean return of its last 100 training episodes (the heartbeat's, else the
  last row of progress.csv: a heartbeat is removed when a worker restarts).
- `params`: its effective hyper-parameters (observe/params.py); a group's are those its runs
  share.
A command game's ENV is the environment it declares (its `params`' `env_id` or `env`, else an
`--env-id` / `--env` argument of its command), else its program's name: never the run's name.
A group (a game, or one variant of it) is marked `training` while any of its runs is not done;
`configured` counts its runs in the file, so "2 of 3 runs evaluated" can be told (`eval.n`).
Its cost: the runs' hours (each run's life, ledger/accounting.py) and, with `cost_per_hour`,
their money and the part of it lost to instability.
The normalised score of a group is that of its mean evaluation when every run has one, else of
its mean last-100 return (`hns_of` says which); the aggregate takes the groups' scores: the
median across games (the field's classic figure) and the interquartile mean over every run's
score (rliable's IQM: Agarwal et al., NeurIPS 2021, recommend it over the median).
"""

from __future__ import annotations

import math
import sqlite3
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from supervisor.config import Config, GameSpec, split_run_name
from supervisor.ledger import accounting
from supervisor.observe import atari_scores, fields, readonly
from supervisor.observe.params import Param, common, run_params
from training.protocol import EVAL_FILE, HEARTBEAT_FILE, PROGRESS_FILE, read_json_file

SCHEMA = 1
DONE_STATES = ("done",)


@dataclass
class RunFigures:
    name: str
    group: str
    seed: int | None
    env_id: str
    algo: str
    state: str  # the supervisor's state of the run ("unknown": never started here)
    steps: int | None  # agent steps trained
    total_steps: int | None
    eval: float | None  # mean evaluation return
    eval_step: int | None
    eval_episodes: int | None
    eval_final: bool  # eval.json (the run's end) rather than a periodic evaluation
    last_100: float | None
    hns: float | None = None  # this run's normalised score (on its group's `hns_of`)
    hours: float | None = None  # its life's wall time (ledger/accounting.py), hours
    money: float | None = None  # with cost_per_hour: what it accrued
    money_lost: float | None = None  # of it, lost to instability
    params: dict[str, Param] = field(default_factory=dict)  # its effective hyper-parameters

    @property
    def training(self) -> bool:
        return self.state not in DONE_STATES


@dataclass
class Stats:
    n: int
    mean: float
    std: float | None  # sample std; None with one value
    min: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stats | None:
        xs = [v for v in values if v is not None and math.isfinite(v)]
        if not xs:
            return None
        std = statistics.stdev(xs) if len(xs) > 1 else None
        return cls(len(xs), statistics.fmean(xs), std, min(xs), max(xs))


@dataclass
class GroupRow:
    group: str
    env_id: str
    algo: str
    n: int  # runs
    seeds: list[int | None]
    steps_min: int | None
    steps_max: int | None
    training: int  # runs not done yet (their figures are their latest)
    eval: Stats | None
    last_100: Stats | None
    hns: float | None
    hns_of: str | None  # "eval" or "last_100"
    runs: list[str] = field(default_factory=list)
    hours: float | None = None  # the runs' wall time, summed (the worker-hours they took)
    money: float | None = None  # with cost_per_hour: what they accrued
    money_lost: float | None = None  # of it, lost to instability
    params: dict[str, Param] = field(default_factory=dict)  # those every run of it shares
    configured: int = 0  # its runs in the configuration (`n`: those with any figure yet)


@dataclass
class Results:
    groups: list[GroupRow]
    runs: list[RunFigures]
    median_hns: float | None
    iqm_hns: float | None
    hns_games: int
    # The selected runs with no figure yet (not started, no heartbeat): `--runs` lists them.
    unscored: list[RunFigures] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "groups": [asdict(g) for g in self.groups],
            "runs": [{**asdict(r), "training": r.training} for r in self.runs],
            "aggregate": {
                "games": self.hns_games,
                "median_hns": self.median_hns,
                "iqm_hns": self.iqm_hns,
            },
            "normalisation": atari_scores.CITATION,
        }

    @property
    def empty(self) -> bool:
        return not self.groups


def iqm(values: Sequence[float]) -> float | None:
    """The interquartile mean as rliable computes it (scipy.stats.trim_mean(x, 0.25)): the
    mean after int(n / 4) values are cut from each end."""
    xs = sorted(values)
    if not xs:
        return None
    cut = len(xs) // 4
    return statistics.fmean(xs[cut : len(xs) - cut])


def _run_state(conn: sqlite3.Connection | None) -> dict[str, str]:
    if conn is None:
        return {}
    try:
        return {r["game"]: r["state"] for r in conn.execute("SELECT game, state FROM workers")}
    except sqlite3.Error:
        return {}


def run_figures(
    name: str, run_dir: Path, state: str, env_id: str = "", algo: str = ""
) -> RunFigures:
    """A run's figures from its run dir, each value checked where it is read (`fields`): an
    unusable one is None (`-`), reported once."""
    hb_path, eval_path = run_dir / HEARTBEAT_FILE, run_dir / EVAL_FILE
    hb = fields.heartbeat(read_json_file(hb_path), hb_path)
    raw_final = read_json_file(eval_path)
    final = None if raw_final is None else fields.evaluation(raw_final, eval_path)
    ev = final if final is not None and final.get("mean") is not None else None
    periodic = hb.get("eval") if isinstance(hb.get("eval"), dict) else None
    if ev is None and periodic is not None and periodic.get("mean") is not None:
        ev = periodic
    tail = readonly.read_progress_tail(run_dir, max_bytes=8 * 1024)
    last, progress = (tail[-1] if tail else {}), run_dir / PROGRESS_FILE
    steps = hb.get("global_step")
    last_100 = hb.get("mean_return")
    csv_step = fields.count(last, "global_step", progress)
    if csv_step is not None and (steps is None or csv_step > steps or last_100 is None):
        steps = max(steps or 0, csv_step)
        if last_100 is None:
            last_100 = fields.number(last, "mean_return", progress)
    group, seed = split_run_name(name)
    return RunFigures(
        name=name,
        group=group,
        seed=seed,
        env_id=env_id or str(hb.get("game") or ""),
        algo=algo or str(hb.get("algo") or ""),
        state=state,
        steps=steps,
        total_steps=hb.get("total_steps"),
        eval=None if ev is None else ev.get("mean"),
        eval_step=None if ev is None else ev.get("step"),
        eval_episodes=None if ev is None else ev.get("episodes"),
        eval_final=ev is not None and ev is final,
        last_100=last_100,
    )


def _sum(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) if xs else None


def collect(cfg: Config, only: Sequence[str] = ()) -> Results:
    """The figures of every configured run (`only`: runs whose name, group or game is one of
    these), grouped."""
    with readonly.open_db_readonly(cfg.db_path) as conn:
        states = _run_state(conn)
        names = [g.name for g in cfg.games]
        rate = float(cfg.cost_per_hour or 0.0)
        times = accounting.account_db(conn, names, time.time(), rate, cfg.gpu_cost_share)
    runs = []
    for spec in cfg.games:
        if only and not _selected(spec.name, only):
            continue
        fig = run_figures(
            spec.name,
            cfg.run_dir(spec.name),
            states.get(spec.name, "unknown"),
            spec.env_id or command_env_label(spec),
            spec.algo if spec.command is None else "command",
        )
        fig.seed = spec.seed
        fig.params = run_params(cfg, spec.name)
        t = times.get(spec.name)
        if t is not None and t.first is not None:
            fig.hours = t.wall_s / 3600.0
            if rate > 0:
                fig.money = sum(t.money.values())
                fig.money_lost = sum(t.money[c] for c in accounting.LOST)
        runs.append(fig)
    return summarize(runs)


_ENV_FLAGS = ("--env-id", "--env_id", "--env")
_INTERPRETERS = ("python", "python3", "uv", "poetry", "conda", "torchrun", "accelerate", "sh",
                 "bash")  # fmt: skip


def command_env_label(spec: GameSpec) -> str:
    """What a command game trains on, for the ENV column: its params' `env_id` or `env`, else
    the value of an `--env-id` / `--env` argument of its command, else its program (the script
    an interpreter runs, else the command's first word): never the run's name."""
    params = dict(spec.params)
    for key in ("env_id", "env"):
        if isinstance(params.get(key), str) and params[key]:
            return str(params[key])
    argv = list(spec.command or ())
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in _ENV_FLAGS:
            if eq and value:
                return value
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                return argv[i + 1]
    words = [Path(a).name for a in argv if a and not a.startswith("-")]
    for word in words:
        if not any(word == p or word.startswith(p + "3.") for p in _INTERPRETERS):
            return word[:40]
    return words[0][:40] if words else "command"


def _selected(name: str, only: Sequence[str]) -> bool:
    group = split_run_name(name)[0]
    return any(o in (name, group, name.split("/")[0]) for o in only)


def summarize(runs: list[RunFigures]) -> Results:
    """Group the runs that have any figure; normalise; aggregate."""
    by: dict[str, list[RunFigures]] = {}
    members: dict[str, list[RunFigures]] = {}  # every run of a group, with figures or not
    unscored = []
    for r in runs:
        members.setdefault(r.group, []).append(r)
        if r.eval is not None or r.last_100 is not None:
            by.setdefault(r.group, []).append(r)
        else:
            unscored.append(r)
    groups = []
    for group, rs in by.items():
        ev, l100 = Stats.of(r.eval for r in rs), Stats.of(r.last_100 for r in rs)
        env_id = rs[0].env_id
        hns_of = "eval" if all(r.eval is not None for r in rs) else "last_100"
        for r in rs:
            score = r.eval if hns_of == "eval" else r.last_100
            r.hns = None if score is None else atari_scores.normalised(env_id, score)
        run_hns = [r.hns for r in rs if r.hns is not None]
        steps = [r.steps for r in rs if r.steps is not None]
        groups.append(
            GroupRow(
                group=group,
                env_id=env_id,
                algo=rs[0].algo,
                n=len(rs),
                seeds=[r.seed for r in rs],
                steps_min=min(steps) if steps else None,
                steps_max=max(steps) if steps else None,
                training=sum(r.training for r in rs),
                eval=ev,
                last_100=l100,
                hns=statistics.fmean(run_hns) if run_hns else None,
                hns_of=hns_of if run_hns else None,
                runs=[r.name for r in rs],
                hours=_sum(r.hours for r in rs),
                money=_sum(r.money for r in rs),
                money_lost=_sum(r.money_lost for r in rs),
                params=common([r.params for r in members[group]]),
                configured=len(members[group]),
            )
        )
    scored = [g.hns for g in groups if g.hns is not None]
    pooled = [r.hns for r in runs if r.hns is not None]
    return Results(
        groups=groups,
        runs=[r for rs in by.values() for r in rs],
        median_hns=statistics.median(scored) if scored else None,
        iqm_hns=iqm(pooled),
        hns_games=len(scored),
        unscored=unscored,
    )
