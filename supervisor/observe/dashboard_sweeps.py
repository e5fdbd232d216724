"""The dashboard's sweeps: their JSON (`/api/sweeps`, `/api/sweep?name=NAME`) and the page's
sweep section (each sweep's ranked trials; the boxes dashboard.js draws its charts in: the best
value so far over trials, the value against each parameter).

The figures are `observe/sweeps.py`'s (`rlsup results --sweep`), read-only: the study store is
never created or changed. A name from a request is looked up among the configured sweeps, never
joined into a path; a store that cannot be read is said (`SweepError`, naming the file), in the
section and in the API's answer, never a traceback. Numbers that JSON cannot carry (an infinite
value told to a study) go out as null.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

from supervisor.config import Config
from supervisor.config.sweep import ParamSpace, SweepSpec
from supervisor.observe.dashboard_page import _e
from supervisor.observe.sweeps import SweepError, SweepResults, TrialFigures, collect_sweep

STATES = ("complete", "pruned", "running", "fail", "waiting")


def specs(cfg: Config) -> list[SweepSpec]:
    """The configured sweeps, in the file's order (a sweep's runs all carry its spec)."""
    seen: dict[str, SweepSpec] = {}
    for g in cfg.games:
        if g.sweep is not None:
            seen.setdefault(g.sweep.name, g.sweep)
    return list(seen.values())


def known(cfg: Config) -> str:
    names = [s.name for s in specs(cfg)]
    return ", ".join(names) if names else "none: no [[games]] table has [games.sweep]"


def space_json(p: ParamSpace) -> dict[str, Any]:
    """A parameter's search space for the charts: `kind` (int, float, choice), `log`, the
    range's ends or the list's values."""
    return {"name": p.name, "kind": p.kind, **p.as_json(), "log": p.log}


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no Infinity or NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def sweep_doc(cfg: Config, spec: SweepSpec) -> dict[str, Any]:
    """`/api/sweep`: `rlsup results --sweep NAME --json`, with the configured `trials_configured`
    and `space` (each parameter's, for the charts). SweepError: the store cannot be read."""
    res = collect_sweep(cfg, spec.name)
    doc = res.as_json()
    doc["trials_configured"] = spec.trials
    doc["space"] = [space_json(p) for p in spec.space]
    clean: dict[str, Any] = finite(doc)
    return clean


def _best(res: SweepResults) -> TrialFigures | None:
    return next((t for t in res.trials if t.trial == res.best), None)


def summary(cfg: Config, spec: SweepSpec) -> dict[str, Any]:
    """One sweep's line of `/api/sweeps`: its definition, its trials' counts by state and its
    best trial; `error` (and no counts) when its store cannot be read."""
    out: dict[str, Any] = {
        "name": spec.name, "metric": spec.metric, "direction": spec.direction,
        "sampler": spec.sampler, "pruner": spec.pruner, "trials_configured": spec.trials,
        "params": [p.name for p in spec.space], "counts": None, "best": None, "error": None,
    }  # fmt: skip
    try:
        res = collect_sweep(cfg, spec.name)
    except SweepError as exc:
        out["error"] = str(exc)
        return out
    best = _best(res)
    out["counts"] = res.counts
    if best is not None:
        out["best"] = finite({"trial": best.trial, "name": best.name, "value": best.value,
                              "std": best.std, "params": best.params})  # fmt: skip
    return out


# ---- the page --------------------------------------------------------------------------------


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:,.{digits}f}"


def param_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def trial_cells(t: TrialFigures, keys: list[str]) -> list[str]:
    """A trial's row (dashboard.js's sweepCells formats a polled one alike): rank, trial, state,
    value ± std, each parameter, steps, hours, cost, why it was pruned or failed."""
    value = _num(t.value)
    if t.value is not None and t.std is not None:
        value += f" ± {_num(t.std)}"
    return [
        "-" if t.rank is None else str(t.rank), t.name, t.state, value,
        *(param_text(t.params.get(k)) for k in keys),
        "-" if t.steps is None else f"{t.steps:,}", _num(t.hours), _num(t.money),
        t.message or "",
    ]  # fmt: skip


def _row(t: TrialFigures, keys: list[str], best: int | None) -> str:
    cells = trial_cells(t, keys)
    n = len(cells)
    tds = []
    for i, c in enumerate(cells):
        cls = ""
        if i == 2:
            cls = f' class="state state-{_e(c)}"'
        elif i == n - 1:
            cls = ' class="detail"'
        tds.append(f"<td{cls}>{_e(c)}</td>")
    mark = ' class="best"' if t.trial == best else ""
    return f'<tr data-trial="{t.trial}"{mark}>{"".join(tds)}</tr>'


def waiting_row(res: SweepResults, width: int) -> str:
    """The trials not asked yet, folded into one row (a 64-trial sweep is mostly them at first)."""
    waiting = [t for t in res.trials if t.state == "waiting"]
    if not waiting:
        return ""
    first, last = waiting[0].name, waiting[-1].name
    span = first if len(waiting) == 1 else f"{first} .. {last}"
    return (f'<tr class="waiting-rest"><td colspan="{width}">{len(waiting)} trial(s) not '
            f"started yet: {_e(span)}</td></tr>")  # fmt: skip


def _headers(spec: SweepSpec) -> list[str]:
    keys = [p.name for p in spec.space]
    return ["rank", "trial", "state", spec.metric, *keys, "steps", "hours", "cost", "why"]


def _line(spec: SweepSpec, res: SweepResults) -> str:
    counts = ", ".join(f"{res.counts[s]} {s}" for s in STATES if res.counts.get(s))
    best = _best(res)
    said = "none complete yet"
    if best is not None:
        spread = "" if best.std is None else f" ± {_num(best.std)}"
        said = f"{best.name}, {spec.metric} {_num(best.value)}{spread}"
    return (f"{spec.direction} {spec.metric} over {spec.trials} trial(s), sampler "
            f"{spec.sampler}, pruner {spec.pruner}: {counts}; best: {said}")  # fmt: skip


def _charts(spec: SweepSpec) -> str:
    name = _e(spec.name)
    boxes = [
        '<div class="chart-box sweep-box"><h4>best so far over trials</h4>'
        f'<div class="sweep-chart" data-sweep="{name}" data-kind="best"></div></div>'
    ]
    for p in spec.space:
        scale = " (log)" if p.log else ""
        boxes.append(
            f'<div class="chart-box sweep-box small"><h4>{_e(spec.metric)} against '
            f"{_e(p.name)}{scale}</h4>"
            f'<div class="sweep-chart" data-sweep="{name}" data-kind="param" '
            f'data-param="{_e(p.name)}"></div></div>'
        )
    return f'<div class="charts sweep-charts">{"".join(boxes)}</div>'


def sweep_block(cfg: Config, spec: SweepSpec) -> str:
    """One sweep: its line, its ranked trials, its charts' boxes."""
    head = f'<div class="sweep" data-sweep="{_e(spec.name)}"><h3>{_e(spec.name)}</h3>'
    try:
        res = collect_sweep(cfg, spec.name)
    except SweepError as exc:
        return f'{head}<p class="error sweep-error">{_e(exc)}</p></div>'
    except (sqlite3.Error, OSError) as exc:
        return f'{head}<p class="error sweep-error">cannot read the state: {_e(exc)}</p></div>'
    keys = [p.name for p in spec.space]
    heads = "".join(f"<th>{_e(h)}</th>" for h in _headers(spec)[:-1])
    heads += '<th class="detail">why</th>'
    rows = "".join(_row(t, keys, res.best) for t in res.trials if t.state != "waiting")
    rows += waiting_row(res, len(_headers(spec)))
    table = (
        f'<table class="sweep-trials" data-sweep="{_e(spec.name)}"><thead><tr>{heads}</tr>'
        f"</thead><tbody>{rows}</tbody></table>"
    )
    legend = (
        '<p class="legend sweep-legend"><span class="dot dot-complete">complete</span> '
        '<span class="dot dot-pruned">pruned (its last value)</span> '
        '<span class="line-best">best complete so far</span></p>'
    )
    line = f'<p class="sweep-summary">{_e(_line(spec, res))}</p>'
    return f"{head}{line}{table}{legend}{_charts(spec)}</div>"


def sweeps_section(cfg: Config) -> str:
    """The page's sweep section ("" when the config has no sweep)."""
    found = specs(cfg)
    if not found:
        return ""
    blocks = "".join(sweep_block(cfg, s) for s in found)
    return f'<section id="sweeps-section"><h2>Sweeps</h2>{blocks}</section>'


__all__ = ["SweepError", "known", "specs", "summary", "sweep_doc", "sweeps_section"]
