"""`rlsup results --sweep NAME [--json | --csv | --markdown]`: a sweep's trials, ranked.

One row per trial (observe/sweeps.py): its rank among the complete ones, its state in the study
(complete, pruned, running, fail, waiting), its value with the spread over its seeds (mean ±
sample std of their evaluations), its parameters, its steps and cost; the failed and pruned say
why below the table. `--json`: {"schema", "name", "metric", "direction", "sampler", "pruner",
"trials", "best", "best_so_far", "counts"}; `--csv`: one row per trial with a `param.NAME`
column per parameter. An unknown sweep is a usage error (exit 2); a study store that cannot be
read is an error naming it (exit 1); a sweep not started yet prints its trials as waiting.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Any

from supervisor.commands import _render as render
from supervisor.commands._common import EXIT_OK
from supervisor.config import Config
from supervisor.observe.sweeps import SweepError, SweepResults, TrialFigures, collect_sweep

EXIT_ERROR = 1
COLUMNS = ("rank", "trial", "name", "state", "value", "std", "steps", "hours", "money", "message")


def run(cfg: Config, args: argparse.Namespace) -> int:
    try:
        res = collect_sweep(cfg, args.sweep)
    except KeyError:
        names = sorted({g.sweep.name for g in cfg.games if g.sweep is not None})
        known = ", ".join(names) if names else "none: no [[games]] table has [games.sweep]"
        return render.fail_usage(f"unknown sweep {args.sweep!r} (configured: {known})")
    except SweepError as exc:
        print(f"rlsup results: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(res.as_json(), indent=2))
    elif args.csv:
        print(_csv(res), end="")
    else:
        print(_table(res, markdown=bool(args.markdown)))
    return EXIT_OK


def _keys(res: SweepResults) -> list[str]:
    keys: dict[str, None] = {}
    for t in res.trials:
        keys.update(dict.fromkeys(t.params))
    return list(keys)


def _csv(res: SweepResults) -> str:
    keys = _keys(res)
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=[*COLUMNS, *(f"param.{k}" for k in keys)],
                       lineterminator="\n")  # fmt: skip
    w.writeheader()
    for t in res.trials:
        row = {c: getattr(t, c) for c in COLUMNS} | {f"param.{k}": t.params.get(k) for k in keys}
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return out.getvalue()


def _param(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def _cells(t: TrialFigures, keys: list[str]) -> list[str]:
    value = "-" if t.value is None else f"{t.value:.2f}"
    if t.value is not None and t.std is not None:
        value += f" ± {t.std:.2f}"
    money = "-" if t.money is None else f"{t.money:.2f}"
    return [
        ("-" if t.rank is None else str(t.rank)).rjust(4), t.name, t.state, value,
        *(_param(t.params.get(k)) for k in keys), render.fmt_count(t.steps),
        "-" if t.hours is None else f"{t.hours:.2f}", money,
    ]  # fmt: skip


def _table(res: SweepResults, markdown: bool) -> str:
    keys = _keys(res)
    headers = ["RANK", "TRIAL", "STATE", res.metric.upper(), *keys, "STEPS", "HOURS", "COST"]
    rows = [_cells(t, keys) for t in res.trials]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    else:
        lines = [render.render_table(headers, rows)]
    counts = ", ".join(f"{n} {state}" for state, n in sorted(res.counts.items()))
    best = "none complete yet" if res.best is None else f"trial {res.best}"
    lines += ["", f"sweep {res.name}: {res.direction} {res.metric} ({res.sampler}, pruner "
              f"{res.pruner}); {counts}; best: {best}"]  # fmt: skip
    why = [f"  {t.name} ({t.state}): {t.message}" for t in res.trials if t.message]
    return "\n".join(lines + (["", *why] if why else []))
