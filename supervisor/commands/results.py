"""`rlsup results [--game NAME] [--json | --csv | --markdown]`: the results table.

One row per game and variant (a `[[games]]` table's runs over `seeds`, observe/results.py):
runs, steps, the evaluation and the last-100 training return over the seeds (mean +/- sample
std, min..max), the human-normalised score where the game is an Atari-57 one, the runs' hours
and (with `cost_per_hour`) their cost and the part lost to instability, and a mark for groups
still training (their figures are their latest). Below the table: the median and the
interquartile mean (IQM) of the normalised scores across games.

`--json`: {"schema", "groups", "runs", "aggregate": {"games", "median_hns", "iqm_hns"},
"normalisation"}; `--csv`: one row per group; `--markdown`: a GitHub table. With no evaluation
or training return yet it says so (stderr) and prints an empty table, exit 0. An unknown
`--game` is a usage error (exit 2).
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
from supervisor.observe.results import GroupRow, Results, Stats, collect

COLUMNS = (
    "group", "env_id", "algo", "n", "training", "steps_min", "steps_max",
    "eval_mean", "eval_std", "eval_min", "eval_max", "eval_n",
    "last_100_mean", "last_100_std", "last_100_min", "last_100_max", "hns", "hns_of",
    "hours", "money", "money_lost",
)  # fmt: skip


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "results",
        help="the results table: each game's score over its seeds, normalised, aggregated",
        description="Per game and variant: evaluation and last-100 return over seeds, "
        "human-normalised scores (Atari-57), median and IQM across games.",
    )
    add_config_argument(p)
    p.add_argument("--game", metavar="NAME", action="append", help="only this game (repeatable)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="the figures as one JSON document")
    fmt.add_argument("--csv", action="store_true", help="one CSV row per game and variant")
    fmt.add_argument("--markdown", action="store_true", help="a Markdown table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
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
        print(_csv(results), end="")
    elif args.markdown:
        print(_markdown(results))
    else:
        print(_text(results))
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
    }  # fmt: skip


def _csv(results: Results) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for g in results.groups:
        w.writerow({k: ("" if v is None else v) for k, v in _flat(g).items()})
    return out.getvalue()


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
    return [
        g.group + mark, g.env_id, g.algo, f"{g.n}" + (" seeds" if seeds else ""), steps,
        _stat(g.eval), _range(g.eval), _stat(g.last_100), _range(g.last_100), hns,
        "-" if g.hours is None else f"{g.hours:.2f}",
        "-" if g.money is None else f"{g.money:.2f} ({g.money_lost or 0.0:.2f} lost)",
    ]  # fmt: skip


HEADERS = ("GAME", "ENV", "ALGO", "RUNS", "STEPS", "EVAL", "EVAL RANGE", "LAST-100",
           "LAST-100 RANGE", "HNS", "HOURS", "COST")  # fmt: skip


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


def _text(results: Results) -> str:
    rows = [_cells(g) for g in results.groups]
    return "\n".join([render.render_table(HEADERS, rows), *(["", *_footer(results)] if
                     results.hns_games else [])])  # fmt: skip


def _markdown(results: Results) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(g)) + " |"
              for g in results.groups]  # fmt: skip
    footer = _footer(results)
    return "\n".join(lines + (["", *footer] if footer else []))
