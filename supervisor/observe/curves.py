"""Any numeric column of a run's `progress.csv` as a curve, as `rlsup plot` and the dashboard
draw it: the points a resume superseded dropped, unusable cells dropped and counted, thinned.

Pure and stdlib only (no matplotlib, no numpy): the dashboard serves it per request.

A progress file is written by the built-in worker or by the SDK, by whichever version of rlsup
started the run (training/progress.py: a resumed run keeps its file's first header), so columns
are found by name in each file's own header, and a column a file lacks is no curve of that run.

Superseded points: a worker killed at step 12,288 whose newest checkpoint is 12,032 resumes at
12,032 and redoes those steps; its progress rows restart below the old ones. As TensorBoard's
`purge_step` does, the later life wins: when a row's `global_step` goes back to S, every earlier
row at step >= S is dropped, so a curve's steps strictly increase and nothing is drawn twice.
(The checkpoint's own step is not in progress.csv: the old life's rows between it and the new
life's first row stay, no newer point standing for them.)

Bad cells: a metric's cell that is not a finite number (`nan`, `inf`, text) is left out of its
curve and counted (`Curve.dropped`); an empty cell (no value yet, a column the writer did not
fill) is simply no point. A row without a usable time or step has no place on either axis and
is counted in `Curve.bad_rows`. Nothing here raises on a file's content.
"""

from __future__ import annotations

import bisect
import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from training.run_files import MAX_UNIX_TIME, PROGRESS_FILE

T = TypeVar("T")

TIME, STEP, RESUMES = "time", "global_step", "resume_count"
AXES = (TIME, STEP)  # the columns that are axes, not metrics
DEFAULT_METRIC = "mean_return"
MAX_POINTS = 2000
MAX_CELL = 64  # a cell longer than this is no number (never parsed)


@dataclass
class Curve:
    """One run's curves: `step` and `time` per kept row (strictly increasing steps), and per
    metric asked for, its value at each (None: no usable value in that row)."""

    step: list[float] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)
    # metric -> (step, time, value) of the rows where it has a value, thinned on their own (a
    # column filled once in a thousand rows, an evaluation, keeps its points)
    series: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    columns: tuple[str, ...] = ()  # the file's header
    rows: int = 0  # data rows read
    superseded: int = 0  # rows dropped as redone after a resume
    resumes: int = 0  # lives after the first seen in the file (resume_count moved, step back)
    bad_rows: int = 0  # rows without a usable time or step
    dropped: dict[str, int] = field(default_factory=dict)  # metric -> unusable cells left out

    def points(self, metric: str, x: str = "step") -> list[tuple[float, float]]:
        """(x, value) of `metric` where it has a value; x is "step" or "time"."""
        k = 0 if x == "step" else 1
        return [(p[k], p[2]) for p in self.series.get(metric, [])]


def number(cell: str | None) -> tuple[float | None, bool]:
    """A cell's finite number, and whether it was bad (not empty, yet no finite number)."""
    if cell is None:
        return None, False
    text = cell.strip()
    if not text:
        return None, False
    if len(text) > MAX_CELL:
        return None, True
    try:
        value = float(text)
    except ValueError:
        return None, True
    return (value, False) if math.isfinite(value) else (None, True)


def read_curve(run_dir: Path, metrics: Iterable[str], max_points: int | None = MAX_POINTS) -> Curve:
    """The run's curves of `metrics` from its progress.csv (empty when it has none yet)."""
    wanted = list(metrics)
    try:
        with (run_dir / PROGRESS_FILE).open(newline="", encoding="utf-8", errors="replace") as f:
            return parse(f, wanted, max_points)
    except OSError:
        return _empty(wanted)


def parse(
    lines: Iterable[str], metrics: Iterable[str], max_points: int | None = MAX_POINTS
) -> Curve:
    """`read_curve` over the lines of a progress file (its header first)."""
    wanted = list(dict.fromkeys(metrics))
    reader = csv.reader(line.replace("\0", "") for line in lines)
    try:
        header = [h.strip() for h in next(reader)]
    except (StopIteration, csv.Error):
        return _empty(wanted)
    index = {name: header.index(name) for name in set(header)}  # the first of a repeated name
    out = Curve(columns=tuple(header), dropped=dict.fromkeys(wanted, 0))
    it, ist, ir = index.get(TIME), index.get(STEP), index.get(RESUMES)
    last_life: float | None = None
    cols = [(m, index.get(m)) for m in wanted]
    kept: list[tuple[float, float, list[float | None]]] = []
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error:  # a broken line (a NUL, an unterminated quote): skip it
            out.rows += 1
            out.bad_rows += 1
            continue
        if not row:
            continue
        out.rows += 1
        t = _cell_number(row, it)
        s = _cell_number(row, ist)
        if t is None or s is None or not 0.0 <= t <= MAX_UNIX_TIME:
            out.bad_rows += 1
            continue
        vals: list[float | None] = []
        for m, i in cols:
            v, bad = number(row[i] if i is not None and i < len(row) else None)
            if bad:
                out.dropped[m] += 1
            vals.append(v)
        life = _cell_number(row, ir)
        if kept and (s < kept[-1][0] or (None not in (life, last_life) and life != last_life)):
            out.resumes += 1  # a new life: a resume (its count moved) or a step back
        if life is not None:
            last_life = life
        back = bool(kept) and s < kept[-1][0]
        while kept and kept[-1][0] >= s:  # a resume went back to s: the later life wins
            kept.pop()
            out.superseded += back  # (a repeated step in one life is just the newer row)
        kept.append((s, t, vals))
    for j, m in enumerate(wanted):
        pts = [(k[0], k[1], v) for k in kept if (v := k[2][j]) is not None]
        out.series[m] = pts if max_points is None else thin(pts, max_points)
    if max_points is not None:
        kept = thin(kept, max_points)
    out.step = [k[0] for k in kept]
    out.time = [k[1] for k in kept]
    out.values = {m: [k[2][j] for k in kept] for j, m in enumerate(wanted)}
    return out


def _empty(wanted: list[str], columns: tuple[str, ...] = ()) -> Curve:
    return Curve(values={m: [] for m in wanted}, series={m: [] for m in wanted},
                 dropped=dict.fromkeys(wanted, 0), columns=columns)  # fmt: skip


def _cell_number(row: Sequence[str], i: int | None) -> float | None:
    if i is None or i >= len(row):
        return None
    return number(row[i])[0]


def thin(items: list[T], max_points: int) -> list[T]:
    """At most about `max_points` of `items`, evenly strided, the first and the last kept."""
    if max_points < 2 or len(items) <= max_points:
        return items
    stride = math.ceil(len(items) / max_points)
    keep = items[::stride]
    if keep[-1] is not items[-1]:
        keep.append(items[-1])
    return keep


def numeric_columns(run_dir: Path) -> list[str]:
    """The columns of the run's progress.csv that hold a finite number in some row (the axes
    `time` and `global_step` left out), in the header's order. [] without a file."""
    try:
        with (run_dir / PROGRESS_FILE).open(newline="", encoding="utf-8", errors="replace") as f:
            return numeric_columns_of(f)
    except OSError:
        return []


def numeric_columns_of(lines: Iterable[str]) -> list[str]:
    reader = csv.reader(line.replace("\0", "") for line in lines)
    try:
        header = [h.strip() for h in next(reader)]
    except (StopIteration, csv.Error):
        return []
    open_cols = {i: name for i, name in enumerate(header) if name and name not in AXES}
    found: set[str] = set()
    while open_cols:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error:
            continue
        for i in [i for i in open_cols if i < len(row)]:
            if number(row[i])[0] is not None:
                found.add(open_cols.pop(i))
    return [h for h in dict.fromkeys(header) if h in found]


# ---- several runs: seeds and variants ---------------------------------------------------------


def interp(x: float, pts: Sequence[tuple[float, float]]) -> float:
    """Linear interpolation of the curve `pts` (sorted by x) at x, clamped at its ends."""
    i = bisect.bisect_left(pts, (x, -math.inf))
    if i <= 0:
        return pts[0][1]
    if i >= len(pts):
        return pts[-1][1]
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Band:
    """The mean of several runs' curves on a common grid, with their min and max."""

    x: list[float]
    mean: list[float]
    lo: list[float]
    hi: list[float]
    runs: int


def band(curves: Sequence[Sequence[tuple[float, float]]], points: int = 200) -> Band | None:
    """The runs' mean, min and max on `points` values of x, from the x every run has reached
    to the x every run has reached (so each point is over all of them). None with no run of
    two points or no common range."""
    usable = [sorted(c) for c in curves if len(c) >= 2]
    if not usable:
        return None
    lo_x = max(c[0][0] for c in usable)
    hi_x = min(c[-1][0] for c in usable)
    if hi_x <= lo_x:
        return None
    n = max(2, points)
    grid = [lo_x + (hi_x - lo_x) * k / (n - 1) for k in range(n)]
    ys = [[interp(x, c) for x in grid] for c in usable]
    cols = list(zip(*ys, strict=True))
    return Band(grid, [sum(c) / len(c) for c in cols], [min(c) for c in cols],
                [max(c) for c in cols], len(usable))  # fmt: skip


def on_grid(pts: Sequence[tuple[float, float]], grid: Sequence[float]) -> list[float | None]:
    """The curve interpolated at each x of `grid` inside its own range (None outside)."""
    if not pts:
        return [None] * len(grid)
    a, b = pts[0][0], pts[-1][0]
    return [interp(x, pts) if a <= x <= b else None for x in grid]


def game_of(run: str) -> str:
    """`pong/lr3/s2` -> `pong`: the [[games]] table a run came from (variants overlaid)."""
    return run.split("/", 1)[0]


def group_runs(runs: Iterable[tuple[str, str]]) -> dict[str, dict[str, list[str]]]:
    """(run, group) pairs -> {game: {group: [runs]}} in the order given."""
    out: dict[str, dict[str, list[str]]] = {}
    for run, group in runs:
        out.setdefault(game_of(run), {}).setdefault(group, []).append(run)
    return out


def elapsed(c: Curve) -> list[float]:
    """Seconds since the run's first kept point: the x of `--x time` (comparable over seeds)."""
    return [t - c.time[0] for t in c.time] if c.time else []


def format_duration(seconds: float) -> str:
    """An axis tick of elapsed time: `45s`, `12m`, `1h05`, `2d03h`."""
    s = round(seconds)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 60:
        return f"{sign}{s}s"
    if s < 3600:
        m, r = divmod(s, 60)
        return f"{sign}{m}m" + (f"{r:02d}s" if r else "")
    if s < 86400:
        h, r = divmod(s, 3600)
        return f"{sign}{h}h{r // 60:02d}"
    d, r = divmod(s, 86400)
    return f"{sign}{d}d{r // 3600:02d}h"


NICE_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                43200, 86400, 172800, 604800)  # fmt: skip


def duration_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Tick positions at round durations (whole minutes, hours, days) across [lo, hi]."""
    span = max(hi - lo, 1.0)
    step = next((s for s in NICE_STEPS_S if span / s <= target), NICE_STEPS_S[-1])
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) // step) + 1)]


def x_of_time(c: Curve, ts: float, x: str = "step") -> float | None:
    """Where the moment `ts` falls on the run's x-axis (its step then, or its elapsed time):
    None outside the run's curve."""
    if len(c.time) < 2 or not c.time[0] <= ts <= c.time[-1]:
        return None
    if x == "time":
        return ts - c.time[0]
    return c.step[max(0, bisect.bisect_right(c.time, ts) - 1)]


# tab10's colours (matplotlib's default cycle), one per variant: the plot's and the page's
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip


def chart(
    game: str,
    groups: dict[str, list[str]],
    read: dict[str, Curve],
    metric: str,
    points: int = 400,
) -> dict[str, Any]:
    """One game's chart of `metric` against agent steps, as the dashboard draws it: a common
    grid of steps (`x`), each run's curve on it (`role` "run"), and each variant of several
    runs its mean, min and max over them (`role` "mean" / "min" / "max", over the steps every
    one of its runs reached); `variants` is the legend. Values are null off a curve."""
    pts = {r: read[r].points(metric) for members in groups.values() for r in members if r in read}
    xs = [p[0] for v in pts.values() for p in (v[:1] + v[-1:])]
    doc: dict[str, Any] = {"game": game, "metric": metric, "x": [], "series": [], "variants": []}
    doc["superseded"] = sum(read[r].superseded for r in pts)
    doc["dropped"] = sum(read[r].dropped.get(metric, 0) for r in pts)
    if not xs:
        return doc
    lo, hi = min(xs), max(xs)
    n = max(2, points) if hi > lo else 1
    grid = [lo + (hi - lo) * k / (n - 1) for k in range(n)] if n > 1 else [lo]
    doc["x"] = grid
    for k, (group, members) in enumerate(groups.items()):
        colour = PALETTE[k % len(PALETTE)]
        have = {r: pts[r] for r in members if pts.get(r)}
        if not have:
            continue
        for r, v in have.items():
            doc["series"].append({"role": "run", "run": r, "group": group, "colour": colour,
                                  "values": on_grid(v, grid)})  # fmt: skip
        b = band(list(have.values()), points) if len(have) > 1 else None
        if b is not None:
            for role, ys in (("mean", b.mean), ("min", b.lo), ("max", b.hi)):
                values = on_grid(list(zip(b.x, ys, strict=True)), grid)
                doc["series"].append({"role": role, "group": group, "colour": colour,
                                      "values": values})  # fmt: skip
        doc["variants"].append({"group": group, "colour": colour, "runs": len(have),
                                "band": b is not None})  # fmt: skip
    return doc
