"""The dashboard page's sections that need no state of the app: cost and time split, the
curves' metric picker and chart boxes, the events as sentences, the hyper-parameters' place.
HTML only (escaped here); the data comes from `supervisor.observe.dashboard`."""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Iterable
from typing import Any

from supervisor.observe import readonly
from supervisor.observe.params import common, differing
from supervisor.observe.sentences import sentences

DETAIL_CHARS = 4000  # the raw detail shown under a sentence is cut here


def _cost_section(doc: dict[str, Any]) -> str:
    c = doc.get("cost")
    if not c:
        body = '<p class="empty">no cost configured (cost_per_hour)</p>'
    else:
        proj = (
            f", ~{c['projected_total']:.2f} projected to finish"
            if c.get("projected_total") is not None
            else ", projection unknown (nothing running)"
        )
        lost = f"; {c['lost']:.2f} lost to instability" if c.get("lost") is not None else ""
        body = f'<p id="cost">{c["spent"]:.2f} spent at {c["per_hour"]:g}/h{_e(proj)}{_e(lost)}</p>'
    return f'<section id="cost-section"><h2>Cost</h2>{body}{_time_table(doc)}</section>'


def charts_section(metrics: Iterable[str], tables: Iterable[str], selected: str) -> str:
    """The metric picker (every numeric column any run has) and one chart per [[games]] table
    (its variants overlaid, its seeds with their mean and band), drawn by dashboard.js."""
    legend: dict[str, str] = {}
    for colour, label in readonly.MARKERS.values():
        legend.setdefault(label, colour)
    keys = "".join(
        f'<span class="marker marker-{_e(c)}">{_e(label)}</span>' for label, c in legend.items()
    )
    options = "".join(
        f'<option value="{_e(m)}"{" selected" if m == selected else ""}>{_e(m)}</option>'
        for m in metrics
    )
    charts = "".join(
        f'<div class="chart-box"><h3>{_e(t)}</h3><div class="chart" data-table="{_e(t)}"></div>'
        f'<div class="chart-legend" data-legend="{_e(t)}"></div></div>'
        for t in tables
    )
    return (
        '<section id="charts-section"><h2>Curves</h2>'
        '<p class="controls"><label for="metric">metric</label> '
        f'<select id="metric" name="metric">{options}</select> '
        '<span class="muted">against agent steps: each seed thin, each variant its mean and '
        "min..max band over its seeds; steps redone after a resume are dropped</span></p>"
        f'<p class="legend">markers: {keys}</p><div class="charts">{charts}</div></section>'
    )


def events_section(found: list[dict[str, Any]]) -> str:
    """The recent events, newest first, each a sentence with its raw detail one click away."""
    if not found:
        body = '<p class="empty">no events yet</p>'
    else:
        items = [
            f'<li class="event kind-{_e(e["kind"])}"><time>{_e(_clock(e["ts"]))}</time> '
            f'<span class="sentence">{_e(text)}</span>'
            f"<details><summary>{_e(e['kind'])}</summary><pre>{_e(_detail(e))}</pre></details>"
            "</li>"
            for e, text in reversed(list(zip(found, sentences(found), strict=True)))
        ]
        body = f'<ol id="events" class="events">{"".join(items)}</ol>'
    return f'<section id="events-section"><h2>Recent events</h2>{body}</section>'


def params_section(runs: Iterable[Any] | None, error: str | None = None) -> str:
    """One table per game, a row per run (its variants' seeds, as `results` collects them, each
    with its `params`, observe/params.py): the keys whose values differ between the rows first,
    in columns; those every row shares folded under a <details>."""
    head = '<section id="params-section"><h2>Hyper-parameters</h2>'
    if error is not None:
        return f'{head}<p class="error">cannot read the parameters: {_e(error)}</p></section>'
    by_game: dict[str, list[Any]] = {}
    for r in runs or ():
        by_game.setdefault(r.group.partition("/")[0], []).append(r)
    tables = []
    for game, found in by_game.items():
        rows = [r.params for r in found]
        if not any(rows):
            continue
        keys = differing(rows)
        shared = common(rows)
        seen = dict.fromkeys(k for row in rows for k in row)
        keys += [k for k in seen if k not in shared and k not in keys]  # in some rows only
        cols = "".join(f"<th>{_e(k)}</th>" for k in ("run", *keys))
        body = "".join(
            f'<tr class="params-run"><td>{_e(r.name)}</td>'
            + "".join(f"<td>{_e(_param(r.params, k))}</td>" for k in keys)
            + "</tr>"
            for r in found
        )
        folded = ""
        if shared:
            items = "".join(
                f"<tr><th>{_e(k)}</th><td>{_e(_param(shared, k))}</td></tr>" for k in shared
            )
            folded = (
                f"<details><summary>shared by its {len(found)} run(s): {len(shared)} "
                f'parameter(s)</summary><table class="params-shared">{items}</table></details>'
            )
        tables.append(
            f'<div class="params-game" data-game="{_e(game)}"><h3>{_e(game)}</h3>'
            f'<table class="params"><thead><tr>{cols}</tr></thead><tbody>{body}</tbody></table>'
            f"{folded}</div>"
        )
    if not tables:
        tables.append('<p class="empty">no run with known parameters yet</p>')
    return head + "".join(tables) + "</section>"


def _param(params: dict[str, Any], key: str) -> str:
    if key not in params:
        return "-"
    value = params[key]
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


TIME_PARTS = ("training", "evaluation", "redone", "setup", "starting", "waiting", "backoff",
              "down", "paused")  # fmt: skip


def _time_table(doc: dict[str, Any]) -> str:
    """Where each game's time went (status's games[].time): the parts as shares of its wall
    time, what was lost to instability, and its money with a price."""
    rows = []
    for g in doc.get("games") or []:
        t = g.get("time")
        if not t or not t.get("wall_s"):
            continue
        wall = float(t["wall_s"])
        pct = [f"{100 * float(t[f'{p}_s']) / wall:.1f}%" for p in TIME_PARTS]
        money = "-" if t.get("money") is None else f"{t['money']:.2f} ({t['money_lost']:.2f})"
        cells = [g["name"], f"{wall / 3600:.2f} h", *pct, f"{100 * t['lost_s'] / wall:.1f}%",
                 money]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    heads = ("game", "wall", *TIME_PARTS, "lost", "money (lost)")
    return _table("time", heads, rows)


def _table(ident: str, headers: tuple[str, ...], rows: list[str]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(rows)
    return f'<table id="{ident}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(v: Any, digits: int) -> str:
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        return "-"
    return f"{v:,.{digits}f}"


def _clock(ts: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(ts))


def _detail(e: dict[str, Any]) -> str:
    """The event's raw detail, as JSON (cut at DETAIL_CHARS)."""
    text = json.dumps(e.get("detail"), default=str, indent=1, sort_keys=True)
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"
