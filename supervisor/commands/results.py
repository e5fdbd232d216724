"""`rlsup results [--game NAME] [--runs] [--json | --csv | --markdown]`: the results table.
(`--sweep NAME`: a sweep's trials ranked, commands/sweep_results.py.)

One row per game and variant (a `[[games]]` table's runs over `seeds`, observe/results.py):
runs, steps, the evaluation and the last-100 training return over the seeds (mean +/- sample
std, min..max), the human-normalised score where the game is an Atari-57 one, the runs' hours
and (with `cost_per_hour`) their cost and the part lost to instability, and a mark for groups
still training (their figures are their latest). When only some of a group's runs have an
evaluation, EVAL says how many of how many (`n=2/3`). The runs' hyper-parameters
(observe/params.py): the text table shows those that differ between its rows (a column each;
the ones all rows share are left out), the Markdown table too with the shared ones below it,
the CSV every one (`param.NAME` columns) and the JSON every one (`params` of each run; a
group's are those its runs share). Below the table: the median and the interquartile mean
(IQM) of the normalised scores across games. `--runs`: one row per run instead (its state,
seed and evaluation step), runs with no figure yet included.

`--json`: {"schema", "groups", "runs", "aggregate": {"games", "median_hns", "iqm_hns"},
"normalisation"}; `--csv`: one row per group (per run with `--runs`); `--markdown`: a GitHub
table. With no evaluation or training return yet it says so (stderr) and prints an empty
table, exit 0. An unknown `--game` is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Any

from supervisor.commands import _render as render
from supervisor.commands._common import EXIT_OK, add_config_argument, load_config_or_exit
from supervisor.config import split_run_name
from supervisor.observe import atari_scores
from supervisor.observe.params import Param, common, differing
from supervisor.observe.results import GroupRow, Results, RunFigures, Stats, collect

COLUMNS = (
    "group", "env_id", "algo", "n", "training", "steps_min", "steps_max",
    "eval_mean", "eval_std", "eval_min", "eval_max", "eval_n",
    "last_100_mean", "last_100_std", "last_100_min", "last_100_max", "hns", "hns_of",
    "hours", "money", "money_lost", "configured",
)  # fmt: skip
RUN_COLUMNS = (
    "name", "group", "seed", "env_id", "algo", "state", "steps", "total_steps", "eval",
    "eval_step", "eval_episodes", "eval_final", "last_100", "hns", "hours", "money", "money_lost",
)  # fmt: skip
PARAM_PREFIX = "param."  # a CSV column per hyper-parameter
MAX_PARAM_COLUMNS = 8  # the text table's: past these, a note points at --json / --csv
SHOWN = frozenset({"game", "algo"})  # a built-in run's params the table has columns for


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "results",
        help="the results table: each game's score over its seeds, normalised, aggregated",
        description="Per game and variant: evaluation and last-100 return over seeds, "
        "human-normalised scores (Atari-57), median and IQM across games.",
    )
    add_config_argument(p)
    p.add_argument("--game", metavar="NAME", action="append", help="only this game (repeatable)")
    p.add_argument(
        "--runs", action="store_true", help="one row per run (seed) instead of per game and variant"
    )
    p.add_argument("--sweep", metavar="NAME", help="a sweep's trials, ranked (docs/sweeps.md)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="the figures as one JSON document")
    fmt.add_argument("--csv", action="store_true", help="one CSV row per game and variant")
    fmt.add_argument("--markdown", action="store_true", help="a Markdown table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    if args.sweep is not None:
        from supervisor.commands import sweep_results

        return sweep_results.run(cfg, args)
    only = args.game or []
    known = {n for g in cfg.games for n in (g.name, g.group, g.name.split("/")[0])}
    for name in only:
        if name not in known:
            return render.fail_usage(
                f"unknown game {name!r} (configured: {', '.join(sorted(known))})"
            )
    results = collect(cfg, only)
    if results.empty:
        print(
            f"rlsup results: no evaluation or training return yet under {cfg.state_dir}",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(results.as_json(), indent=2))
    elif args.csv:
        print(_runs_csv(results) if args.runs else _csv(results), end="")
    elif args.markdown:
        print(_markdown(results, args.runs))
    else:
        print(_text(results, args.runs))
    return EXIT_OK


def _flat(g: GroupRow) -> dict[str, Any]:
    def part(prefix: str, s: Stats | None, keys: tuple[str, ...]) -> dict[str, Any]:
        return {f"{prefix}_{k}": (None if s is None else getattr(s, k)) for k in keys}

    return {
        "group": g.group, "env_id": g.env_id, "algo": g.algo, "n": g.n,
        "training": g.training, "steps_min": g.steps_min, "steps_max": g.steps_max,
        **part("eval", g.eval, ("mean", "std", "min", "max", "n")),
        **part("last_100", g.last_100, ("mean", "std", "min", "max")),
        "hns": g.hns, "hns_of": g.hns_of,
        "hours": g.hours, "money": g.money, "money_lost": g.money_lost,
        "configured": g.configured,
    }  # fmt: skip


def _param_keys(rows: list[dict[str, Param]]) -> list[str]:
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return list(keys)


def _write_csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return out.getvalue()


def _with_params(row: dict[str, Any], params: dict[str, Param], keys: list[str]) -> dict[str, Any]:
    return {**row, **{PARAM_PREFIX + k: params.get(k) for k in keys}}


def _csv(results: Results) -> str:
    keys = _param_keys([g.params for g in results.groups])
    rows = [_with_params(_flat(g), g.params, keys) for g in results.groups]
    return _write_csv([*COLUMNS, *(PARAM_PREFIX + k for k in keys)], rows)


def _all_runs(results: Results) -> list[RunFigures]:
    """Every selected run, those with no figure yet too, grouped (a group's runs together, in
    the order the groups first appear)."""
    runs = [*results.runs, *results.unscored]
    first: dict[str, int] = {}
    for r in runs:
        first.setdefault(r.group, len(first))
    return sorted(runs, key=lambda r: (first[r.group], r.seed if r.seed is not None else -1))


def _runs_csv(results: Results) -> str:
    runs = _all_runs(results)
    keys = _param_keys([r.params for r in runs])
    rows = [_with_params({k: getattr(r, k) for k in RUN_COLUMNS}, r.params, keys) for r in runs]
    return _write_csv([*RUN_COLUMNS, *(PARAM_PREFIX + k for k in keys)], rows)


def _stat(s: Stats | None) -> str:
    if s is None:
        return "-"
    spread = "" if s.std is None else f" ± {s.std:.1f}"
    return f"{s.mean:.1f}{spread}"


def _range(s: Stats | None) -> str:
    return "-" if s is None or s.n < 2 else f"{s.min:.1f}..{s.max:.1f}"


def _cells(g: GroupRow) -> list[str]:
    steps = render.fmt_count(g.steps_max)
    if g.steps_min is not None and g.steps_min != g.steps_max:
        steps = f"{render.fmt_count(g.steps_min)}-{steps}"
    hns = "-" if g.hns is None else f"{100 * g.hns:.0f}%" + ("" if g.hns_of == "eval" else "*")
    mark = f" (training {g.training}/{g.n})" if g.training else ""
    seeds = split_run_name(g.runs[0])[1] is not None
    total = max(g.configured, g.n)
    runs = f"{g.n}" if total == g.n else f"{g.n}/{total}"
    evaluated = _stat(g.eval)
    if g.eval is not None and g.eval.n < total:
        evaluated += f" (n={g.eval.n}/{total})"  # only some of its runs evaluated yet
    return [
        g.group + mark, g.env_id, g.algo, runs + (" seeds" if seeds else ""), steps,
        evaluated, _range(g.eval), _stat(g.last_100), _range(g.last_100), hns,
        *_money(g.hours, g.money, g.money_lost),
    ]  # fmt: skip


def _money(hours: float | None, money: float | None, lost: float | None) -> tuple[str, str]:
    return (
        "-" if hours is None else f"{hours:.2f}",
        "-" if money is None else f"{money:.2f} ({lost or 0.0:.2f} lost)",
    )


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _run_cells(r: RunFigures) -> list[str]:
    steps = render.fmt_count(r.steps)
    if r.total_steps:
        steps = f"{steps}/{render.fmt_count(r.total_steps)}"
    at = "-" if r.eval is None or r.eval_step is None else render.fmt_count(r.eval_step)
    hns = "-" if r.hns is None else f"{100 * r.hns:.0f}%"
    return [
        r.name, r.env_id, r.algo, r.state, steps, _num(r.eval), at, _num(r.last_100), hns,
        *_money(r.hours, r.money, r.money_lost),
    ]  # fmt: skip


HEADERS = ("GAME", "ENV", "ALGO", "RUNS", "STEPS", "EVAL", "EVAL RANGE", "LAST-100",
           "LAST-100 RANGE", "HNS", "HOURS", "COST")  # fmt: skip
RUN_HEADERS = ("RUN", "ENV", "ALGO", "STATE", "STEPS", "EVAL", "EVAL STEP", "LAST-100", "HNS",
               "HOURS", "COST")  # fmt: skip


def _show(value: Param) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _table(results: Results, per_run: bool) -> tuple[list[str], list[list[str]], list[str], str]:
    """Headers, rows, the hyper-parameters every row shares as `k = v`, and a note on the
    differing ones left out of the table (too many)."""
    if per_run:
        runs = _all_runs(results)
        headers, rows = list(RUN_HEADERS), [_run_cells(r) for r in runs]
        params = [r.params for r in runs]
    else:
        headers, rows = list(HEADERS), [_cells(g) for g in results.groups]
        params = [g.params for g in results.groups]
    # The env id and the algorithm have their columns already.
    varying = [k for k in differing(params) if k not in SHOWN] if len(params) > 1 else []
    shown, hidden = varying[:MAX_PARAM_COLUMNS], varying[MAX_PARAM_COLUMNS:]
    headers += shown
    for row, p in zip(rows, params, strict=True):
        row += [_show(p.get(k)) for k in shown]
    shared = [f"{k} = {_show(v)}" for k, v in common(params).items() if k not in SHOWN]
    note = ""
    if hidden:
        note = (
            f"{len(hidden)} more differing parameter(s) ({', '.join(hidden)}): see --csv or --json"
        )
    return headers, rows, shared, note


def _footer(results: Results) -> list[str]:
    lines = []
    if results.hns_games:
        med = "-" if results.median_hns is None else f"{100 * results.median_hns:.1f}%"
        iqm = "-" if results.iqm_hns is None else f"{100 * results.iqm_hns:.1f}%"
        lines.append(
            f"human-normalised, {results.hns_games} Atari game(s): median {med}, IQM {iqm} "
            "(over every run)"
        )
        lines.append(f"  {atari_scores.CITATION}")
        if any(g.hns_of == "last_100" for g in results.groups):
            lines.append("  * of the last-100 training return: not every run has an evaluation")
    return lines


def _text(results: Results, per_run: bool = False) -> str:
    headers, rows, _, note = _table(results, per_run)
    lines = [render.render_table(headers, rows), *([note] if note else [])]
    footer = _footer(results)
    return "\n".join(lines + (["", *footer] if footer else []))


def _markdown(results: Results, per_run: bool = False) -> str:
    headers, rows, shared, note = _table(results, per_run)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    if note:
        lines += ["", note]
    if shared:
        lines += ["", "<details><summary>Hyper-parameters every row shares</summary>", ""]
        lines += [f"- `{item}`" for item in shared] + ["", "</details>"]
    footer = _footer(results)
    return "\n".join(lines + (["", *footer] if footer else []))
