"""The supervisor's side of its sweeps: a trial's parameters drawn when its first run starts,
its evaluations reported to the pruner, its end told to the study, its runs ended with it.

Once a tick (`step`), from durable facts only, so that a supervisor that died at any point
and its successor decide the same:
- a trial's `index`-th intermediate value is the mean of its runs' `index`-th evaluation (the
  ledger's `evaluation` events: every distinct step a run evaluated at, in order, its first
  value kept: an evaluation redone after a crash is the same point), reported when every run
  of the trial has it; the pruner's "stop" ends the trial PRUNED (its last value is its value);
- a trial whose runs are all DONE is COMPLETE with the mean of their final evaluations
  (eval.json, as `rlsup results` reads it); one whose run ended FATAL (an exit 78, a spent
  restart budget) is FAIL with that run's reason, and the sweep goes on;
- a trial the study holds as ended whose runs are not (a supervisor that died between its
  `tell` and the stops) has its runs ended again: stopped with a checkpoint (exit 75) when
  alive, DONE at once when not.
"""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from checkpoints import write_json_atomic
from supervisor.config import Config
from supervisor.config.model import GameSpec
from supervisor.config.sweep import SweepSpec
from supervisor.sweep.study import Study, SweepError
from training.run_files import EVAL_FILE, TRIAL_FILE, read_json_file

Event = tuple[str, str | None, dict[str, Any]]
# What the keeper reads of a run: its state ("done", "fatal", "running", ...) and its reason.
RunState = tuple[str, str]


ENDED = ("done", "fatal")


@dataclass(frozen=True)
class EndRun:
    """A run whose trial has ended: stop it with a checkpoint (alive) or settle it DONE."""

    game: str
    why: str


class TrialWaits(OSError):
    """A trial run cannot start now: its study store failed (a full disk, a lock held too
    long). The run waits, no failure against its restart budget; said once (`event`)."""

    event = "sweep_failed"


@dataclass
class _Trial:
    state: str  # the study's: waiting, running, complete, pruned, fail
    reported: int = 0  # intermediate values reported (indexes 0..reported-1)


@dataclass
class Step:
    events: list[Event] = field(default_factory=list)
    ends: list[EndRun] = field(default_factory=list)


def sweeps_of(cfg: Config) -> dict[str, SweepSpec]:
    out: dict[str, SweepSpec] = {}
    for g in cfg.games:
        if g.sweep is not None:
            out.setdefault(g.sweep.name, g.sweep)
    return out


def trial_spec(spec: GameSpec, params: Mapping[str, Any]) -> GameSpec:
    """A trial run's spec with its drawn values: a built-in learner's args, a command game's
    params (RLSUP_PARAMS)."""
    if spec.command is None:
        return replace(spec, args=tuple(sorted({**spec.args_dict, **params}.items())))
    return replace(spec, params=tuple(sorted({**dict(spec.params), **params}.items())))


class SweepKeeper:
    def __init__(self, cfg: Config, conn: sqlite3.Connection) -> None:
        self.cfg, self.conn = cfg, conn
        self.studies: dict[str, Study] = {}
        self.trials: dict[tuple[str, int], _Trial] = {}
        self.evals: dict[str, dict[int, float]] = {}  # run -> step -> its first mean
        self.last_event = 0
        self.failing = False
        self.pending: list[Event] = []  # said at the next step (a reload's)

    @property
    def active(self) -> bool:
        return bool(self.studies)

    def start(self) -> None:
        """Open every sweep's study (SweepError: one that cannot be used, named)."""
        for name, spec in sweeps_of(self.cfg).items():
            self._open(name, spec)

    def _open(self, name: str, spec: SweepSpec) -> None:
        study = Study(spec, self.cfg.state_dir)
        self.studies[name] = study
        for n in range(spec.trials):
            self.trials[(name, n)] = _Trial(study.state(n))
        for row in study.rows():
            if (name, row.number) in self.trials:
                self.trials[(name, row.number)].reported = len(row.intermediate)
            elif row.state == "running":
                # Asked before `trials` was lowered: no run of it will start again, and a
                # trial must never stay RUNNING for ever.
                why = f"the sweep's trials were lowered to {spec.trials}: never finished"
                study.tell(row.number, "fail", None, why)

    def reconfigure(self, cfg: Config) -> None:
        """A reload: a sweep added is opened (one that cannot be, said at the next step: its
        runs wait), one removed is let go; a changed one is refused before this."""
        self.cfg = cfg
        wanted = sweeps_of(cfg)
        for name in [n for n in self.studies if n not in wanted]:
            del self.studies[name]
            self.trials = {k: t for k, t in self.trials.items() if k[0] != name}
        for name, spec in wanted.items():
            if name not in self.studies:
                try:
                    self._open(name, spec)
                except Exception as exc:  # SweepError, the store's own: its runs wait
                    self.pending.append(("sweep_failed", None, {"sweep": name,
                                                                "message": str(exc)}))  # fmt: skip

    # ---- a trial's parameters ---------------------------------------------------------------

    def assign(self, spec: GameSpec) -> GameSpec:
        """The spec a trial run starts with: the trial's values (drawn now for its first run,
        the stored ones after), also written to its run dir's trial.json for the readers."""
        if spec.sweep is None or spec.trial is None:
            return spec
        study = self.studies.get(spec.sweep.name)
        if study is None:
            raise TrialWaits(f"sweep {spec.sweep.name}: its study could not be opened")
        try:
            params = study.params(spec.trial)
        except Exception as exc:  # sqlalchemy's and Optuna's own: the store failed
            raise TrialWaits(f"sweep {spec.sweep.name}: its study store failed: {exc}") from exc
        t = self.trials[(spec.sweep.name, spec.trial)]
        t.state = "running" if t.state == "waiting" else t.state
        run_dir = self.cfg.run_dir(spec.name)
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        doc = {"sweep": spec.sweep.name, "trial": spec.trial, "params": params}
        write_json_atomic(run_dir / TRIAL_FILE, doc)
        return trial_spec(spec, params)

    def trial_over(self, spec: GameSpec) -> str | None:
        """Why a trial run must not start (its trial has ended), else None."""
        if spec.sweep is None or spec.trial is None:
            return None
        state = self.trials[(spec.sweep.name, spec.trial)].state
        return None if state in ("waiting", "running") else f"its trial ended {state}"

    # ---- once a tick --------------------------------------------------------------------------

    def step(self, games: Mapping[str, RunState]) -> Step:
        """The tick's decisions. A study store that fails (a full disk, a lock held too long)
        is said once (`sweep_failed`) and tried again next tick; the trials' runs go on."""
        out = Step(events=self.pending)
        self.pending = []
        if not self.studies:
            return out
        try:
            self._step(games, out)
        except Exception as exc:  # sqlalchemy's and Optuna's own errors: the store failed
            self.failed(out.events, exc)
            return out
        if self.failing:
            self.failing = False
            out.events.append(("sweep_ok", None, {"message": "the sweeps' study stores work"}))
        return out

    def failed(self, events: list[Event], exc: BaseException) -> None:
        """A study store failed: said once per outage."""
        if not self.failing:
            self.failing = True
            events.append(("sweep_failed", None, {"message": f"{type(exc).__name__}: {exc}"}))

    def _step(self, games: Mapping[str, RunState], out: Step) -> None:
        self._read_evaluations()
        for name, study in self.studies.items():
            spec = study.spec
            for n in range(spec.trials):
                t = self.trials[(name, n)]
                runs = [(r, *games[r]) for r in spec.runs_of(n) if r in games]
                if t.state == "waiting" or not runs:
                    continue
                if t.state == "running":
                    self._follow(study, n, t, runs, out)
                if t.state not in ("waiting", "running"):
                    why = f"sweep {name}: trial {n} ended {t.state}"
                    out.ends.extend(EndRun(r, why) for r, state, _ in runs if state not in ENDED)

    def _follow(
        self, study: Study, n: int, t: _Trial, runs: list[tuple[str, str, str]], out: Step
    ) -> None:
        fatal = next(((r, why) for r, state, why in runs if state == "fatal"), None)
        if fatal is not None:
            self._tell(study, n, t, "fail", None, f"{fatal[0]}: {fatal[1]}", out)
            return
        done = all(state == "done" for _, state, _ in runs)
        points = [sorted(self.evals.get(r, {}).items()) for r, _, _ in runs]
        ready = min(len(p) for p in points)
        while t.reported < ready:
            # Reported even when its runs are done (a fast trial ends between two ticks): the
            # pruner compares later trials with these.
            k = t.reported
            value = statistics.fmean(p[k][1] for p in points)
            prune = study.report(n, k, value)
            t.reported += 1
            if prune and not done:
                message = f"pruned at evaluation {k} (mean {value:.4g})"
                self._tell(study, n, t, "pruned", None, message, out)
                return
        if done:
            finals = {r: self._final(r) for r, _, _ in runs}
            values = [v for v in finals.values() if v is not None]
            if len(values) < len(finals):
                missing = [r for r, v in finals.items() if v is None]
                message = f"no evaluation recorded by {', '.join(missing)} (eval.json)"
                self._tell(study, n, t, "fail", None, message, out)
                return
            self._tell(study, n, t, "complete", statistics.fmean(values), "", out)

    def _tell(
        self, study: Study, n: int, t: _Trial, state: str, value: float | None, message: str,
        out: Step,
    ) -> None:  # fmt: skip
        t.state = study.tell(n, state, value, message)
        row = next((r for r in study.rows() if r.number == n), None)
        detail = {
            "sweep": study.spec.name,
            "trial": n,
            "state": t.state,
            "value": None if row is None else row.value,
            "params": {} if row is None else row.params,
            "runs": study.spec.runs_of(n),
        }
        if message:
            detail["message"] = message
        out.events.append(("sweep_trial", None, detail))

    def _final(self, run: str) -> float | None:
        """A finished run's value: its final evaluation (eval.json, as `rlsup results` reads
        it), else its newest periodic one."""
        doc = read_json_file(self.cfg.run_dir(run) / EVAL_FILE)
        mean = doc.get("mean") if isinstance(doc, dict) else None
        if isinstance(mean, int | float) and not isinstance(mean, bool) and math.isfinite(mean):
            return float(mean)
        points = self.evals.get(run)
        return points[max(points)] if points else None

    def _read_evaluations(self) -> None:
        try:
            rows = self.conn.execute(
                "SELECT id, game, detail FROM events WHERE kind = 'evaluation' AND id > ? "
                "ORDER BY id",
                (self.last_event,),
            ).fetchall()
        except sqlite3.Error:
            return  # the next tick reads them
        for event_id, game, detail in rows:
            self.last_event = max(self.last_event, int(event_id))
            try:
                d = json.loads(detail)
                step, mean = int(d["step"]), float(d["mean"])
            except (ValueError, KeyError, TypeError):
                continue
            self.evals.setdefault(str(game), {}).setdefault(step, mean)

    def close(self) -> None:
        self.studies.clear()


def read_trial_file(run_dir: Path) -> dict[str, Any] | None:
    """A trial run's trial.json ({"sweep", "trial", "params"}), or None."""
    doc = read_json_file(run_dir / TRIAL_FILE)
    return doc if isinstance(doc, dict) and isinstance(doc.get("params"), dict) else None


__all__ = [
    "EndRun",
    "Step",
    "SweepError",
    "SweepKeeper",
    "TrialWaits",
    "read_trial_file",
    "sweeps_of",
]
