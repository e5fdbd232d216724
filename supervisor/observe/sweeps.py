"""A sweep's trials ranked (`rlsup results --sweep NAME`, the dashboard's sweep view).

The study's word on each trial (its state, its value, its parameters, why it failed or was
pruned: supervisor/sweep/study.py) joined with its runs' figures from the state dir (each
seed's evaluation, steps, hours and cost: observe/results.py). Read-only: the study store is
opened for reading and never created; a store that cannot be read is said, naming it.

Ranked: the complete trials by value (best first, by the sweep's direction), then the pruned
ones by their last value, then the running, the failed and those not started yet. `best_so_far`
is the best complete value after each trial, in trial order (the search's progress curve).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from supervisor.config import Config
from supervisor.config.sweep import SweepSpec
from supervisor.observe.results import RunFigures, collect
from supervisor.sweep.study import SweepError, TrialRow, read_rows

SCHEMA = 1
ORDER = {"complete": 0, "pruned": 1, "running": 2, "fail": 3, "waiting": 4}


@dataclass
class TrialFigures:
    trial: int
    name: str  # GAME/tNNN: the group of its runs
    state: str  # the study's: complete | pruned | running | fail | waiting
    value: float | None  # complete: its value; pruned: its last reported one
    std: float | None  # the sample std of its runs' evaluations (None under two)
    seeds: dict[str, float | None]  # run -> its evaluation (final, else newest periodic)
    params: dict[str, Any]
    steps: int | None  # its runs' steps, summed
    hours: float | None
    money: float | None
    message: str | None  # why it failed or was pruned
    rank: int | None = None  # 1 = best among the complete ones
    runs: list[str] = field(default_factory=list)


@dataclass
class SweepResults:
    name: str
    metric: str
    direction: str
    sampler: str
    pruner: str
    trials: list[TrialFigures]
    best: int | None  # the best complete trial's number
    best_so_far: list[tuple[int, float | None]]
    counts: dict[str, int]

    def as_json(self) -> dict[str, Any]:
        """Every field; a value that is no finite number (Optuna takes an infinite one) is
        null, so that the document is JSON any parser reads."""
        doc: dict[str, Any] = _finite({"schema": SCHEMA, **asdict(self)})
        return doc


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def sweep_spec(cfg: Config, name: str) -> SweepSpec:
    """The configured sweep `name` (KeyError: none of that name)."""
    for g in cfg.games:
        if g.sweep is not None and g.sweep.name == name:
            return g.sweep
    raise KeyError(name)


def collect_sweep(cfg: Config, name: str) -> SweepResults:
    """Sweep `name`'s trials, ranked (KeyError: no such sweep; SweepError: unreadable store)."""
    spec = sweep_spec(cfg, name)
    rows = {r.number: r for r in read_rows(cfg.state_dir, spec) or []}
    results = collect(cfg, [name])
    by_run = {r.name: r for r in [*results.runs, *results.unscored]}
    trials = [_trial(spec, n, rows.get(n), by_run) for n in range(spec.trials)]
    sign = -1.0 if spec.direction == "maximize" else 1.0

    def key(t: TrialFigures) -> tuple[int, float, int]:
        value = sign * t.value if t.value is not None else float("inf")
        return ORDER.get(t.state, 5), value, t.trial

    ranked = sorted(trials, key=key)
    for rank, t in enumerate((t for t in ranked if t.state == "complete"), 1):
        t.rank = rank
    best = next((t.trial for t in ranked if t.state == "complete"), None)
    so_far: list[tuple[int, float | None]] = []
    current: float | None = None
    for t in trials:
        if t.state == "complete" and t.value is not None:
            better = current is None or sign * t.value < sign * current
            current = t.value if better else current
        so_far.append((t.trial, current))
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    return SweepResults(
        name, spec.metric, spec.direction, spec.sampler, spec.pruner, ranked, best, so_far, counts
    )


def _trial(
    spec: SweepSpec, n: int, row: TrialRow | None, by_run: dict[str, RunFigures]
) -> TrialFigures:
    runs = spec.runs_of(n)
    figs = [by_run[r] for r in runs if r in by_run]
    seeds = {r: (by_run[r].eval if r in by_run else None) for r in runs}
    values = [v for v in seeds.values() if v is not None]
    steps = [f.steps for f in figs if f.steps is not None]
    hours = [f.hours for f in figs if f.hours is not None]
    money = [f.money for f in figs if f.money is not None]
    return TrialFigures(
        trial=n,
        name=spec.trial_name(n),
        state="waiting" if row is None else row.state,
        value=None if row is None else row.value,
        std=statistics.stdev(values) if len(values) > 1 else None,
        seeds=seeds,
        params={} if row is None else row.params,
        steps=sum(steps) if steps else None,
        hours=sum(hours) if hours else None,
        money=sum(money) if money else None,
        message=None if row is None else row.message,
        runs=runs,
    )


__all__ = ["SweepError", "SweepResults", "TrialFigures", "collect_sweep", "sweep_spec"]
