"""`rlsup plot [--out FILE.png] [--game NAME] [--metric NAME] [--x step|time] [--seeds]`:
learning curves of any metric, with the incidents marked.

One row of panels per game (a `[[games]]` table: `pong` for `pong`, `pong/s2`, `pong/lr3/s1`),
one column per `--metric` (repeatable; default `mean_return`): any numeric column of the runs'
`<state_dir>/runs/<run>/progress.csv` (the built-in diagnostics and every SDK metric; see
`supervisor/observe/curves.py`, which drops the points a resume superseded and the cells that are
no finite number). On each panel the game's variants are overlaid, one colour each with a
legend: a variant run over several seeds is drawn as each seed thin, their mean and their
min..max band. The x-axis is agent steps, or with `--x time` the wall time since each run's
first point (ticks in minutes, hours, days). Vertical lines mark host reboots, crashes / OOMs,
hangs and mode changes from the event log.

Default output: `<state_dir>/plot.png` (`plot-seeds.png` with `--seeds`, kept from when seeds
had panels of their own). matplotlib (which imports numpy) is imported when drawing only, so the
rest of the CLI stays light. Exit 0 with the PNG written (a game without progress yet gets an
empty panel saying so), 2 for an unknown game or metric or a bad configuration, 1 when the file
cannot be written.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.commands import _render as render
from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    add_config_argument,
    load_config_or_exit,
)
from supervisor.observe import curves as C
from supervisor.observe import readonly

MAX_POINTS = 4000  # per curve; a week of 2 s progress rows is thinned to this
BAND_POINTS = 200

# event kind -> (colour, legend label): the incident markers, shared with the dashboard
MARKERS = readonly.MARKERS
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:gray", "tab:olive", "tab:cyan")  # fmt: skip
LABELS = {"mean_return": "mean return (last 100)", "sps": "agent steps/s"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plot",
        help="learning curves of any metric per game (PNG): seeds' mean and band, variants "
        "overlaid, reboots/crashes/mode changes marked",
        description="Plot metrics of progress.csv per game against agent steps (or wall time): "
        "each variant's seeds with their mean and min..max band, variants overlaid.",
    )
    add_config_argument(p)
    p.add_argument("--out", metavar="FILE.png", help="output file (default <state_dir>/plot.png)")
    p.add_argument(
        "--game",
        metavar="NAME",
        action="append",
        help="only this game: a [[games]] name, a variant (pong/lr3) or a run (pong/lr3/s2) "
        "(repeatable; default: every configured game)",
    )
    p.add_argument(
        "--metric",
        metavar="NAME",
        action="append",
        help="a numeric column of progress.csv to plot, e.g. mean_return, sps, policy_loss or "
        "an SDK metric (repeatable: one column of panels each; default mean_return)",
    )
    p.add_argument(
        "--x",
        choices=("step", "time"),
        default="step",
        help="x-axis: agent steps (default) or wall time since each run's first point",
    )
    p.add_argument(
        "--seeds",
        action="store_true",
        help="as the default (each variant's seeds with their mean and min..max band), "
        "written to <state_dir>/plot-seeds.png unless --out",
    )
    p.set_defaults(func=run)


@dataclass
class Line:
    """One drawn curve: a run's (`role` "run"), or a variant's mean with its band ("mean")."""

    label: str
    colour: str
    role: str
    x: list[float]
    y: list[float]
    lo: list[float] | None = None
    hi: list[float] | None = None


@dataclass
class Panel:
    """One axis: a game's variants for one metric."""

    game: str
    metric: str
    x: str  # "step" or "time"
    lines: list[Line] = field(default_factory=list)
    markers: list[tuple[float, str]] = field(default_factory=list)  # (x, colour)
    note: str = ""  # why it is empty


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    seeds = bool(getattr(args, "seeds", False))
    only = list(getattr(args, "game", None) or [])
    runs = [(g.name, g.group) for g in cfg.games]
    known = {r for r, _ in runs} | {grp for _, grp in runs} | {C.game_of(r) for r, _ in runs}
    unknown = [n for n in only if n not in known]
    if unknown:
        names = sorted(known) if seeds else [r for r, _ in runs]
        return render.fail_usage(f"unknown game {unknown[0]!r}; known: {', '.join(names)}")
    if only:
        runs = [(r, grp) for r, grp in runs if any(o in (r, grp, C.game_of(r)) for o in only)]
    metrics = list(dict.fromkeys(getattr(args, "metric", None) or [C.DEFAULT_METRIC]))
    x = getattr(args, "x", None) or "step"
    default = "plot-seeds.png" if seeds else "plot.png"
    out = Path(args.out) if getattr(args, "out", None) else cfg.state_dir / default

    read = {r: C.read_curve(cfg.run_dir(r), metrics, MAX_POINTS) for r, _ in runs}
    headers = [c.columns for c in read.values() if c.columns]
    missing = [m for m in metrics if headers and not any(m in h for h in headers)]
    if missing:
        cols: dict[str, None] = {}
        for r, _ in runs:
            cols.update(dict.fromkeys(C.numeric_columns(cfg.run_dir(r))))
        return render.fail_usage(
            f"unknown metric {missing[0]!r}: no progress.csv of "
            f"{', '.join(sorted({C.game_of(r) for r, _ in runs}))} has it; its numeric "
            f"columns: {', '.join(cols) or '(none yet)'}"
        )
    for r, c in read.items():
        bad = {m: n for m, n in c.dropped.items() if n}
        if bad or c.bad_rows:
            what = [f"{m}: {n} cell(s)" for m, n in bad.items()]
            what += [f"{c.bad_rows} row(s) without a usable time or step"] if c.bad_rows else []
            print(f"rlsup: warning: {cfg.run_dir(r) / 'progress.csv'}: no finite number, left "
                  f"out: {'; '.join(what)}", file=sys.stderr)  # fmt: skip
    try:
        events = _events(cfg.db_path)
    except sqlite3.Error as exc:
        print(f"rlsup: cannot read the event log: {exc}; plotting without it", file=sys.stderr)
        events = []
    built = panels(C.group_runs(runs), read, metrics, x, events)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        draw_panels(built, out)
    except OSError as exc:
        print(f"rlsup: cannot write {out}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    empty = [r for r, c in read.items() if not c.step]
    print(f"wrote {out}" + (f" (no progress yet: {', '.join(empty)})" if empty else ""))
    return EXIT_OK


def panels(
    games: dict[str, dict[str, list[str]]],
    read: dict[str, C.Curve],
    metrics: list[str],
    x: str,
    events: list[dict[str, Any]],
) -> list[Panel]:
    """The panels to draw, one per game and metric, row by row (no matplotlib: testable)."""
    out = []
    for game, groups in games.items():
        for metric in metrics:
            p = Panel(game, metric, x)
            for k, (group, members) in enumerate(groups.items()):
                colour = COLOURS[k % len(COLOURS)]
                name = group if group != game else game
                pts = {r: _xy(read[r], metric, x) for r in members}
                pts = {r: v for r, v in pts.items() if v}
                if not pts:
                    continue
                b = C.band(list(pts.values()), BAND_POINTS) if len(pts) > 1 else None
                for r, v in pts.items():
                    solo = len(pts) == 1
                    label = (
                        (f"{name} ({r.rsplit('/', 1)[-1]})" if r != group else name) if solo else ""
                    )
                    p.lines.append(Line(label, colour, "run", [a for a, _ in v],
                                        [c for _, c in v]))  # fmt: skip
                if b is not None:
                    p.lines.append(Line(f"{name}: mean of {b.runs} seeds, min..max",
                                        colour, "mean", b.x, b.mean, b.lo, b.hi))  # fmt: skip
                elif len(pts) > 1:
                    p.lines[-1].label = f"{name} ({len(pts)} seeds, no common range yet)"
                for r in pts:
                    p.markers += _markers(read[r], r, x, events)
            if not p.lines:
                has_rows = any(read[r].step for g in groups.values() for r in g)
                p.note = (
                    f"{game}: no {metric} values yet" if has_rows else f"{game}: no progress yet"
                )
            out.append(p)
    return out


def _xy(c: C.Curve, metric: str, x: str) -> list[tuple[float, float]]:
    pts = c.points(metric, "step" if x == "step" else "time")
    if x == "time" and c.time:
        t0 = c.time[0]
        pts = [(t - t0, v) for t, v in pts]
    return pts


def _markers(c: C.Curve, run: str, x: str, events: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """The run's incidents (its own events and the host's) within its curve, on the x-axis."""
    out = []
    for e in events:
        if e["game"] in (None, run) and e["kind"] in MARKERS:
            pos = C.x_of_time(c, float(e["ts"]), x)
            if pos is not None:
                out.append((pos, MARKERS[e["kind"]][0]))
    return out


def draw_panels(built: list[Panel], out: Path) -> None:
    fig = figure(built)
    import matplotlib.pyplot as plt

    fig.savefig(out, dpi=90)
    plt.close(fig)


def figure(built: list[Panel]) -> Any:
    """The matplotlib figure of the panels (not saved: the tests read it)."""
    import matplotlib  # lazily: matplotlib imports numpy, which the CLI must not load

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter

    metrics = list(dict.fromkeys(p.metric for p in built)) or [C.DEFAULT_METRIC]
    cols = len(metrics)
    rows = max(1, -(-len(built) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(max(11.0, 7.0 * cols), 1.0 + 3.6 * rows),
                             squeeze=False)  # fmt: skip
    for k, p in enumerate(built):
        ax = axes[k // cols][k % cols]
        if not p.lines:
            ax.text(0.5, 0.5, p.note, ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        for ln in p.lines:
            if ln.role == "mean":
                ax.fill_between(
                    ln.x, ln.lo or ln.y, ln.hi or ln.y, color=ln.colour, alpha=0.18, lw=0
                )
                ax.plot(ln.x, ln.y, color=ln.colour, lw=1.9, label=ln.label)
            else:
                thin = any(o.role == "mean" and o.colour == ln.colour for o in p.lines)
                ax.plot(ln.x, ln.y, color=ln.colour, lw=0.7 if thin else 1.3,
                        alpha=0.4 if thin else 1.0, label=ln.label or None)  # fmt: skip
        for pos, colour in dict.fromkeys(p.markers):
            ax.axvline(pos, color=colour, lw=0.9, ls="--", alpha=0.7)
        if p.x == "time":
            lo, hi = ax.get_xlim()
            ax.xaxis.set_major_locator(FixedLocator(C.duration_ticks(max(0.0, lo), hi)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: C.format_duration(v)))
            ax.set_xlim(lo, hi)
            ax.set_xlabel("wall time since the run's first point")
        else:
            ax.set_xlabel("agent steps")
        ax.set_ylabel(LABELS.get(p.metric, p.metric))
        ax.set_title(f"{p.game}: {p.metric}", fontsize=10)
        ax.grid(alpha=0.3)
        if any(ln.label for ln in p.lines):
            ax.legend(fontsize=8, loc="best")
    for k in range(len(built), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    handles = []
    seen: set[str] = set()
    for colour, label in MARKERS.values():
        if label not in seen:
            seen.add(label)
            handles.append(Line2D([], [], color=colour, ls="--", label=label))
    height_in = fig.get_figheight()
    fig.suptitle(f"rlsup learning curves — {time.strftime('%Y-%m-%d %H:%M')}",
                 y=1 - 0.12 / height_in, va="top")  # fmt: skip
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.42 / height_in))  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.8 / height_in))
    return fig


def seed_band(
    runs: dict[str, dict[str, list[float | None]]], points: int = 200
) -> tuple[list[float], list[float], list[float], list[float], int] | None:
    """The runs' mean return on a common grid of agent steps, up to the step every run has
    reached (so each point is over all of them): (steps, mean, min, max, runs). Kept for
    callers of `_series`; the panels use `curves.band` directly."""
    pts = [
        [
            (x, y)
            for x, y in zip(s["step"], s["ret"], strict=False)
            if x is not None and y is not None
        ]
        for s in runs.values()
    ]
    b = C.band(pts, points)
    return None if b is None else (b.x, b.mean, b.lo, b.hi, b.runs)


def _series(rows: list[dict[str, str]]) -> dict[str, list[float | None]]:
    """Columns of progress.csv as floats (time, step, ret, sps), thinned to at most MAX_POINTS
    rows: the shape of earlier versions, for scripts that import it."""
    stride = max(1, len(rows) // MAX_POINTS)
    keep = rows[::stride]
    if rows and keep[-1] is not rows[-1]:
        keep.append(rows[-1])
    cols: dict[str, list[float | None]] = {"time": [], "step": [], "ret": [], "sps": []}
    for r in keep:
        t, step = readonly.to_time(r.get("time")), readonly.to_float(r.get("global_step"))
        if t is None or step is None:
            continue
        cols["time"].append(t)
        cols["step"].append(step)
        cols["ret"].append(readonly.to_float(r.get("mean_return")))
        cols["sps"].append(readonly.to_float(r.get("sps")))
    return cols


def _events(path: Path) -> list[dict[str, Any]]:
    with readonly.open_db_readonly(path) as conn:
        if conn is None:
            return []
        return readonly.query_events(conn, kinds=tuple(MARKERS))
