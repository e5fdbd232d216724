"""`rlsup plot [--out FILE.png] [--game NAME]`: learning curves with the incidents marked.

One row per game: mean return and agent steps/s against agent steps (left) and against wall
time (right), from `<state_dir>/runs/<game>/progress.csv`; on the time axis, vertical lines
mark host reboots, crashes / OOMs, hangs and mode changes from the event log.
Default output: `<state_dir>/plot.png`. matplotlib (which imports numpy) is imported inside
`run` only, so the rest of the CLI stays light. Exit 0 with the PNG written (a game without
progress yet gets an empty panel saying so), 2 for an unknown game or a bad configuration,
1 when the file cannot be written.
"""

from __future__ import annotations

import argparse
import bisect
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from supervisor.commands import _render as render
from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    add_config_argument,
    load_config_or_exit,
)
from supervisor.config import Config
from supervisor.observe import readonly

MAX_POINTS = 4000  # per curve; a week of 2 s progress rows is thinned to this

# event kind -> (colour, legend label): the incident markers, shared with the dashboard
MARKERS = readonly.MARKERS


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plot",
        help="learning curves per game (PNG), with reboots/crashes/mode changes marked",
        description="Plot mean return and steps/s per game against steps and wall time.",
    )
    add_config_argument(p)
    p.add_argument("--out", metavar="FILE.png", help="output file (default <state_dir>/plot.png)")
    p.add_argument(
        "--game",
        metavar="NAME",
        action="append",
        help="only this game (repeatable; default: every configured game)",
    )
    p.add_argument(
        "--seeds",
        action="store_true",
        help="one panel per game and variant: the mean over its seeds' runs against agent "
        "steps, their min..max band and each seed thin (--game then also takes a game's name)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    names = [g.name for g in cfg.games]
    if getattr(args, "seeds", False):
        return _run_seeds(args, cfg)
    wanted: list[str] = list(getattr(args, "game", None) or names)
    unknown = [n for n in wanted if n not in names]
    if unknown:
        return render.fail_usage(f"unknown game {unknown[0]!r}; known: {', '.join(names)}")
    out = Path(args.out) if getattr(args, "out", None) else cfg.state_dir / "plot.png"

    series = {name: _series(readonly.read_progress(cfg.run_dir(name))) for name in wanted}
    try:
        events = _events(cfg.db_path)
    except sqlite3.Error as exc:
        print(f"rlsup: cannot read the event log: {exc}; plotting without it", file=sys.stderr)
        events = []
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        draw(series, events, out)
    except OSError as exc:
        print(f"rlsup: cannot write {out}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    empty = [n for n, s in series.items() if not s["step"]]
    print(f"wrote {out}" + (f" (no progress yet: {', '.join(empty)})" if empty else ""))
    return EXIT_OK


def _run_seeds(args: argparse.Namespace, cfg: Config) -> int:
    """`--seeds`: one panel per group (a game, or one of its variants) over its runs."""
    groups: dict[str, list[str]] = {}
    for g in cfg.games:
        groups.setdefault(g.group, []).append(g.name)
    only = list(getattr(args, "game", None) or [])
    known = set(groups) | {n.split("/")[0] for n in groups} | {g.name for g in cfg.games}
    unknown = [n for n in only if n not in known]
    if unknown:
        return render.fail_usage(f"unknown game {unknown[0]!r}; known: {', '.join(sorted(known))}")
    if only:
        groups = {k: [r for r in v if any(o in (r, k, k.split("/")[0]) for o in only)]
                  for k, v in groups.items()}  # fmt: skip
        groups = {k: v for k, v in groups.items() if v}
    out = Path(args.out) if getattr(args, "out", None) else cfg.state_dir / "plot-seeds.png"
    series = {
        group: {run: _series(readonly.read_progress(cfg.run_dir(run))) for run in runs}
        for group, runs in groups.items()
    }
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        draw_seeds(series, out)
    except OSError as exc:
        print(f"rlsup: cannot write {out}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    print(f"wrote {out}")
    return EXIT_OK


def seed_band(
    runs: dict[str, dict[str, list[float | None]]], points: int = 200
) -> tuple[list[float], list[float], list[float], list[float], int] | None:
    """The runs' mean return on a common grid of agent steps, up to the step every run has
    reached (so each point is over all of them): (steps, mean, min, max, runs)."""
    curves = []
    for s in runs.values():
        pts = [(x, y) for x, y in zip(s["step"], s["ret"], strict=False)
               if x is not None and y is not None]  # fmt: skip
        if len(pts) >= 2:
            curves.append(sorted(pts))  # a resume steps back: keep x ordered
    if not curves:
        return None
    lo = max(c[0][0] for c in curves)
    hi = min(c[-1][0] for c in curves)
    if hi <= lo:
        return None
    grid = [lo + (hi - lo) * k / (points - 1) for k in range(points)]
    ys = [[_interp(x, c) for x in grid] for c in curves]
    cols = list(zip(*ys, strict=True))
    return (
        grid, [sum(c) / len(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols],
        len(curves),
    )  # fmt: skip


def _interp(x: float, pts: list[tuple[float, float]]) -> float:
    """Linear interpolation of the curve `pts` (sorted by x) at x (no numpy in the CLI)."""
    i = bisect.bisect_left(pts, (x, float("-inf")))
    if i <= 0:
        return pts[0][1]
    if i >= len(pts):
        return pts[-1][1]
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def draw_seeds(groups: dict[str, dict[str, dict[str, list[float | None]]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(groups))
    cols = min(2, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.8 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (group, runs) in zip(flat, groups.items(), strict=False):
        band = seed_band(runs)
        for s in runs.values():
            pts = [(x, y) for x, y in zip(s["step"], s["ret"], strict=False)
                   if x is not None and y is not None]  # fmt: skip
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color="tab:blue", lw=0.6,
                        alpha=0.35)  # fmt: skip
        if band is None:
            ax.set_title(f"{group}: not enough progress yet", fontsize=10)
        else:
            grid, mean, lo, hi, k = band
            ax.fill_between(grid, lo, hi, color="tab:blue", alpha=0.18, lw=0)
            ax.plot(grid, mean, color="tab:blue", lw=1.8)
            ax.set_title(f"{group}: mean of {k} run(s), min..max band", fontsize=10)
        ax.set_xlabel("agent steps")
        ax.set_ylabel("mean return (last 100)")
        ax.grid(alpha=0.3)
    for ax in flat[len(groups) :]:
        ax.set_visible(False)
    fig.suptitle(f"rlsup over seeds — {time.strftime('%Y-%m-%d %H:%M')}")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _series(rows: list[dict[str, str]]) -> dict[str, list[float | None]]:
    """Columns of progress.csv as floats, thinned to at most MAX_POINTS rows."""
    stride = max(1, len(rows) // MAX_POINTS)
    keep = rows[::stride]
    if rows and keep[-1] is not rows[-1]:
        keep.append(rows[-1])
    cols: dict[str, list[float | None]] = {"time": [], "step": [], "ret": [], "sps": []}
    for r in keep:
        # A row whose time or step is no usable number has no place on either axis (a time
        # past datetime's range would stop the whole plot).
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


def draw(
    series: dict[str, dict[str, list[float | None]]], events: list[dict[str, Any]], out: Path
) -> None:
    import matplotlib  # lazily: matplotlib imports numpy, which the CLI must not load

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    n = max(1, len(series))
    fig, axes = plt.subplots(n, 2, figsize=(14, 3.6 * n), squeeze=False)
    for row, (name, s) in enumerate(series.items()):
        ax_step, ax_time = axes[row]
        if not s["step"]:
            for ax in (ax_step, ax_time):
                ax.text(
                    0.5,
                    0.5,
                    f"{name}: no progress yet",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
                ax.set_xticks([])
                ax.set_yticks([])
            continue
        times = [
            mdates.date2num(  # type: ignore[no-untyped-call, unused-ignore]
                _as_datetime(t)
            )
            for t in s["time"]
            if t is not None
        ]
        _curves(ax_step, s["step"], s, f"{name}: against agent steps", "agent steps")
        _curves(ax_time, times, s, f"{name}: against wall time", "wall time")
        fmt = mdates.DateFormatter("%m-%d\n%H:%M")  # type: ignore[no-untyped-call, unused-ignore]
        ax_time.xaxis.set_major_formatter(fmt)
        lo, hi = min(times), max(times)
        for e in events:
            if e["game"] not in (None, name):
                continue
            x = mdates.date2num(  # type: ignore[no-untyped-call, unused-ignore]
                _as_datetime(e["ts"])
            )
            if lo <= x <= hi:
                ax_time.axvline(x, color=MARKERS[e["kind"]][0], lw=1.0, ls="--", alpha=0.8)
    handles = [
        Line2D([], [], color="tab:blue", label="mean return"),
        Line2D([], [], color="tab:green", label="steps/s"),
    ]
    seen: set[str] = set()
    for colour, label in MARKERS.values():
        if label not in seen:
            seen.add(label)
            handles.append(Line2D([], [], color=colour, ls="--", label=label))
    height_in = fig.get_figheight()
    fig.suptitle(
        f"rlsup learning curves — {time.strftime('%Y-%m-%d %H:%M')}",
        y=1 - 0.12 / height_in,
        va="top",
    )
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=len(handles),
        frameon=False,
        bbox_to_anchor=(0.5, 1 - 0.42 / height_in),
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.8 / height_in))
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _curves(
    ax: Any, xs: Sequence[float | None], s: dict[str, list[float | None]], title: str, xlabel: str
) -> None:
    ret = [(x, y) for x, y in zip(xs, s["ret"], strict=False) if y is not None]
    sps = [(x, y) for x, y in zip(xs, s["sps"], strict=False) if y is not None]
    if ret:
        ax.plot([p[0] for p in ret], [p[1] for p in ret], color="tab:blue", lw=1.2)
    ax.set_ylabel("mean return", color="tab:blue")
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    if sps:
        twin.plot([p[0] for p in sps], [p[1] for p in sps], color="tab:green", lw=0.8, alpha=0.7)
    twin.set_ylabel("steps/s", color="tab:green")


def _as_datetime(ts: float) -> Any:
    import datetime

    return datetime.datetime.fromtimestamp(ts)
