"""`rlsup dashboard`'s page and API: a read-only WSGI app over the state directory.

Everything it shows comes from the owners of the figures: the status document
(`status.collect`), the results table (`results.collect`), the event log and each game's
`progress.csv` (`readonly`). It reads the database read-only (`mode=ro`) and never writes the
state directory, so it works whether or not the supervisor runs and costs the supervisor nothing
but SQLite readers.

Routes (GET or HEAD; anything else 405, any other path 404):
  /                          the page: games, results, cost, recent events, one chart per game
  /api/status                the status document (`rlsup status --json`)
  /api/results               the results table (`rlsup results --json`)
  /api/progress?game=NAME    a configured game's curve (thinned) and its incident markers
  /api/events[?since=TS][&limit=N]  events since Unix time TS (newest last)
  /static/NAME               a fixed map of packaged files (the page's JS/CSS, uPlot)

Files read: the database, the run directories of configured games (a name from a request is
looked up among the configured games, never joined into a path) and the static map's files.
With a token, every request must carry it (`?token=` or `Authorization: Bearer`): 401 without
one, 403 with a wrong one. Without a token (loopback only), a request whose Host header is not
a loopback name is refused (403): a web page cannot read the dashboard by DNS rebinding.
"""

from __future__ import annotations

import hmac
import html
import json
import math
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from supervisor.config import Config
from supervisor.observe import readonly
from supervisor.observe import results as results_mod
from supervisor.observe.status import collect as collect_status
from training.protocol import PROGRESS_FILE

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
# name in the URL -> (packaged file, content type). Nothing outside this map is ever served.
STATIC: dict[str, tuple[str, str]] = {
    "dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "uPlot.iife.min.js": ("uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "uPlot.min.css": ("uPlot.min.css", "text/css; charset=utf-8"),
}

POLL_S = 2.0  # the page polls /api/status this often
STATUS_TTL_S = 1.0  # one status document serves every tab polling within this
MAX_POINTS = 2000  # per curve
EVENTS_ON_PAGE = 30
EVENTS_LIMIT = 1000
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})

SECURITY_HEADERS = [
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]

StartResponse = Callable[..., Any]


class HTTPError(Exception):
    def __init__(self, status: str, message: str, headers: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or []


class Dashboard:
    """The WSGI app. `token`: required on every request when set; without one, only requests
    whose Host header names loopback (or one of `allowed_hosts`: the address it listens on)."""

    def __init__(
        self,
        cfg: Config,
        token: str | None = None,
        poll_s: float = POLL_S,
        allowed_hosts: Iterable[str] = (),
        status_ttl_s: float = STATUS_TTL_S,
    ) -> None:
        self.cfg = cfg
        self.status_ttl_s = status_ttl_s
        self.token = token
        self.allowed_hosts = LOOPBACK_HOSTS | set(allowed_hosts)
        self.poll_s = poll_s
        self._games = {g.name: g for g in cfg.games}
        self._lock = threading.Lock()
        self._status: tuple[float, dict[str, Any]] | None = None
        self._progress: dict[str, tuple[tuple[int, int], dict[str, list[float | None]]]] = {}

    # ---- WSGI ---------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            if method not in ("GET", "HEAD"):
                raise HTTPError("405 Method Not Allowed", "read-only", [("Allow", "GET, HEAD")])
            query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
            self._authorize(environ, query)
            status, ctype, body = self.route(environ.get("PATH_INFO", "/"), query)
            headers = [("Content-Type", ctype)]
        except HTTPError as exc:
            status, body = exc.status, (exc.message + "\n").encode()
            headers = [("Content-Type", "text/plain; charset=utf-8"), *exc.headers]
        headers += [("Content-Length", str(len(body))), *SECURITY_HEADERS]
        start_response(status, headers)
        return [b""] if method == "HEAD" else [body]

    def _authorize(self, environ: dict[str, Any], query: dict[str, list[str]]) -> None:
        if self.token is None:
            host = environ.get("HTTP_HOST", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host and name not in self.allowed_hosts:
                raise HTTPError("403 Forbidden", f"unexpected Host {host!r}: use 127.0.0.1")
            return
        given = None
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        elif query.get("token"):
            given = query["token"][0]
        if not given:
            raise HTTPError(
                "401 Unauthorized",
                "a token is required (?token= or Authorization: Bearer)",
                [("WWW-Authenticate", 'Bearer realm="rlsup"')],
            )
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise HTTPError("403 Forbidden", "wrong token")

    def route(self, path: str, query: dict[str, list[str]]) -> tuple[str, str, bytes]:
        if path == "/":
            return "200 OK", "text/html; charset=utf-8", self.page().encode()
        if path.startswith("/static/"):
            entry = STATIC.get(path[len("/static/") :])
            if entry is None:
                raise HTTPError("404 Not Found", "not found")
            return "200 OK", entry[1], (STATIC_DIR / entry[0]).read_bytes()
        api: dict[str, Callable[[dict[str, list[str]]], Any]] = {
            "/api/status": lambda q: self.status(),
            "/api/results": lambda q: results_mod.collect(self.cfg).as_json(),
            "/api/progress": self.progress,
            "/api/events": self.events,
        }
        handler = api.get(path)
        if handler is None:
            raise HTTPError("404 Not Found", "not found")
        try:
            doc = handler(query)
        except (sqlite3.Error, OSError) as exc:
            raise HTTPError("503 Service Unavailable", f"cannot read the state: {exc}") from None
        return "200 OK", "application/json", json.dumps(doc, default=str).encode()

    # ---- data ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            if self._status is not None and now - self._status[0] < self.status_ttl_s:
                return self._status[1]
        doc: dict[str, Any] = dict(collect_status(self.cfg, now))
        with self._lock:
            self._status = (now, doc)
        return doc

    def _game_of(self, query: dict[str, list[str]]) -> str:
        name = (query.get("game") or [""])[0]
        if name not in self._games:  # looked up, never joined into a path
            raise HTTPError("404 Not Found", f"unknown game {name!r}")
        return name

    def progress(self, query: dict[str, list[str]]) -> dict[str, Any]:
        name = self._game_of(query)
        series = self._series(name)
        markers = []
        for e in self._events(kinds=tuple(readonly.MARKERS)):
            if e["game"] in (None, name):
                colour, label = readonly.MARKERS[e["kind"]]
                markers.append({"ts": e["ts"], "kind": e["kind"], "label": label,
                                "colour": colour})  # fmt: skip
        return {"game": name, **series, "markers": markers}

    def _series(self, name: str) -> dict[str, list[float | None]]:
        """The game's progress.csv thinned to MAX_POINTS rows, cached while the file is
        unchanged (a week of 2 s rows is read once, not per request)."""
        path = self.cfg.run_dir(name) / PROGRESS_FILE
        try:
            st = path.stat()
            key = (st.st_mtime_ns, st.st_size)
        except OSError:
            return {"time": [], "step": [], "mean_return": [], "sps": []}
        with self._lock:
            hit = self._progress.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        series = thin(readonly.read_progress(self.cfg.run_dir(name)))
        with self._lock:
            self._progress[name] = (key, series)
        return series

    def events(self, query: dict[str, list[str]]) -> dict[str, Any]:
        since = _number(query, "since")
        limit = _number(query, "limit")
        n = EVENTS_LIMIT if limit is None else max(1, min(EVENTS_LIMIT, int(limit)))
        return {"events": self._events(since=since, limit=n)}

    def _events(
        self, *, since: float | None = None, kinds: tuple[str, ...] = (), limit: int | None = None
    ) -> list[dict[str, Any]]:
        with readonly.open_db_readonly(self.cfg.db_path) as conn:
            if conn is None:
                return []
            return readonly.query_events(conn, since=since, kinds=kinds, limit=limit)

    # ---- the page -----------------------------------------------------------------------

    def page(self) -> str:
        q = "" if self.token is None else "?token=" + urllib.parse.quote(self.token, safe="")
        parts: list[str] = []
        try:
            doc = self.status()
        except (sqlite3.Error, OSError) as exc:
            doc = None
            parts.append(f'<p class="error">cannot read the state: {_e(exc)}</p>')
        if doc is not None:
            parts += _status_sections(doc)
        parts.append(self._results_section())
        if doc is not None:
            parts.append(_cost_section(doc))
        parts.append(_charts_section(self.cfg))
        parts.append(self._events_section())
        token_attr = "" if self.token is None else f' data-token="{_e(self.token)}"'
        return PAGE.format(
            q=q,
            state_dir=_e(self.cfg.state_dir),
            poll_ms=int(self.poll_s * 1000),
            token_attr=token_attr,
            body="\n".join(parts),
            generated=_e(time.strftime("%Y-%m-%d %H:%M:%S")),
        )

    def _results_section(self) -> str:
        try:
            res = results_mod.collect(self.cfg)
        except (sqlite3.Error, OSError) as exc:
            return f'<h2>Results</h2><p class="error">cannot read the results: {_e(exc)}</p>'
        if res.empty:
            body = '<p class="empty">no evaluation or training return yet</p>'
        else:
            rows = []
            for g in res.groups:
                mark = f" (training {g.training}/{g.n})" if g.training else ""
                hns = "-" if g.hns is None else f"{100 * g.hns:.0f}%"
                rows.append(
                    "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in (
                        g.group + mark, g.env_id, g.algo, g.n, _steps(g),
                        _stat(g.eval), _stat(g.last_100), hns,
                    )) + "</tr>"
                )  # fmt: skip
            body = _table(
                "results",
                ("game", "env", "algo", "runs", "steps", "eval", "last-100", "HNS"),
                rows,
            )
            if res.hns_games:
                med = "-" if res.median_hns is None else f"{100 * res.median_hns:.1f}%"
                iqm = "-" if res.iqm_hns is None else f"{100 * res.iqm_hns:.1f}%"
                body += f"<p>human-normalised, {res.hns_games} Atari game(s): median {med}, "
                body += f"IQM {iqm}</p>"
        return f'<section id="results-section"><h2>Results</h2>{body}</section>'

    def _events_section(self) -> str:
        try:
            found = self._events(limit=EVENTS_ON_PAGE)
        except sqlite3.Error as exc:
            return f'<h2>Recent events</h2><p class="error">cannot read events: {_e(exc)}</p>'
        if not found:
            body = '<p class="empty">no events yet</p>'
        else:
            rows = [
                f"<tr><td>{_e(_clock(e['ts']))}</td><td class='kind-{_e(e['kind'])}'>"
                f"{_e(e['kind'])}</td><td>{_e(e['game'] or '')}</td>"
                f"<td class='detail'>{_e(_detail(e['detail']))}</td></tr>"
                for e in reversed(found)
            ]
            body = _table("events", ("time", "kind", "game", "detail"), rows)
        return f'<section id="events-section"><h2>Recent events</h2>{body}</section>'


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rlsup dashboard</title>
<link rel="stylesheet" href="/static/uPlot.min.css{q}">
<link rel="stylesheet" href="/static/dashboard.css{q}">
</head>
<body data-poll-ms="{poll_ms}"{token_attr}>
<header><h1>rlsup</h1><span class="muted">{state_dir}</span>
<span id="stamp" class="muted">rendered {generated}</span></header>
{body}
<script src="/static/uPlot.iife.min.js{q}"></script>
<script src="/static/dashboard.js{q}"></script>
</body></html>
"""

GAME_COLUMNS = (
    ("game", "name"), ("state", "state"), ("steps", "steps"), ("%", "percent"),
    ("steps/s", "sps"), ("return", "mean_return"), ("eval", "eval"), ("restarts", "restarts"),
    ("checkpoint", "checkpoint"), ("mode", "mode"), ("device", "device"),
)  # fmt: skip


def game_cells(g: dict[str, Any]) -> dict[str, str]:
    """The games table's cells of one game (dashboard.js formats the polled ones alike)."""
    ev = "-"
    if g.get("eval_return") is not None:
        ev = _num(g["eval_return"], 1) + (f" @{g['eval_step']:,}" if g.get("eval_step") else "")
    ckpt = "-" if g.get("last_checkpoint_step") is None else f"{g['last_checkpoint_step']:,}"
    return {
        "name": g["name"],
        "state": g["state"],
        "steps": f"{g['global_step']:,} / {g['total_steps']:,}",
        "percent": f"{g['percent']:.1f}",
        "sps": _num(g.get("sps"), 0),
        "mean_return": _num(g.get("mean_return"), 1),
        "eval": ev,
        "restarts": str(g["restarts"]),
        "checkpoint": ckpt,
        "mode": g.get("mode") or "-",
        "device": g.get("device") or "-",
    }


def supervisor_line(doc: dict[str, Any]) -> str:
    s = doc["supervisor"]
    if s["state"] == "absent":
        if not doc.get("db_present"):
            return f"no state yet: no state database in {doc['state_dir']} (never run)"
        return "supervisor not started"
    if s["state"] == "running":
        return f"supervisor running (pid {s['pid']})"
    if s["state"] == "stale":
        return f"supervisor STALE (pid {s['pid']} alive but not ticking)"
    return "supervisor stopped" + (" cleanly" if s.get("clean_stop") else " (no clean stop)")


def _status_sections(doc: dict[str, Any]) -> list[str]:
    sup = doc["supervisor"]["state"]
    out = [f'<p id="supervisor" class="sup-{_e(sup)}">{_e(supervisor_line(doc))}</p>']
    mode = doc.get("mode") or {}
    scopes = "; ".join(
        f"{'all games' if s['scope'] == '*' else s['scope']}: {s['mode']}"
        + (" (pinned)" if s["pinned"] else "")
        for s in mode.get("scopes") or []
    )
    host = doc.get("host") or {}
    out.append(
        f'<p class="muted">mode {_e(scopes or (mode.get("initial_mode") or "-") + " (initial)")}'
        f" · unexpected reboots 24h {_e(host.get('unexpected_reboots_24h', 0))} / 7d "
        f"{_e(host.get('unexpected_reboots_7d', 0))}</p>"
    )
    rows = []
    for g in doc["games"]:
        cells = game_cells(g)
        tds = "".join(
            f'<td data-field="{f}"'
            + (f' class="state state-{_e(cells[f])}"' if f == "state" else "")
            + f">{_e(cells[f])}</td>"
            for _, f in GAME_COLUMNS
        )
        rows.append(f'<tr data-game="{_e(g["name"])}">{tds}</tr>')
    table = _table("games", tuple(h for h, _ in GAME_COLUMNS), rows)
    out.append(f'<section id="games-section"><h2>Games</h2>{table}</section>')
    return out


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


def _charts_section(cfg: Config) -> str:
    legend: dict[str, str] = {}
    for colour, label in readonly.MARKERS.values():
        legend.setdefault(label, colour)
    keys = "".join(
        f'<span class="marker marker-{_e(c)}">{_e(label)}</span>' for label, c in legend.items()
    )
    charts = "".join(
        f'<div class="chart-box"><h3>{_e(g.name)}</h3>'
        f'<div class="chart" data-game="{_e(g.name)}"></div></div>'
        for g in cfg.games
    )
    return (
        '<section id="charts-section"><h2>Mean return against wall time</h2>'
        f'<p class="legend">markers: {keys}</p><div class="charts">{charts}</div></section>'
    )


def thin(rows: list[dict[str, str]], max_points: int = MAX_POINTS) -> dict[str, list[float | None]]:
    """Columns of progress.csv (time, step, mean_return, sps), at most `max_points` rows, the
    newest always kept."""
    stride = max(1, math.ceil(len(rows) / max_points))
    keep = rows[::stride]
    if rows and keep[-1] is not rows[-1]:
        keep.append(rows[-1])
    cols: dict[str, list[float | None]] = {"time": [], "step": [], "mean_return": [], "sps": []}
    for r in keep:
        t = readonly.to_time(r.get("time"))
        if t is None:
            continue
        cols["time"].append(t)
        cols["step"].append(readonly.to_float(r.get("global_step")))  # finite or None
        cols["mean_return"].append(readonly.to_float(r.get("mean_return")))
        cols["sps"].append(readonly.to_float(r.get("sps")))
    return cols


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


def _stat(s: results_mod.Stats | None) -> str:
    if s is None:
        return "-"
    return f"{s.mean:.1f}" + ("" if s.std is None else f" ± {s.std:.1f}")


def _steps(g: results_mod.GroupRow) -> str:
    if g.steps_max is None:
        return "-"
    if g.steps_min is not None and g.steps_min != g.steps_max:
        return f"{g.steps_min:,}-{g.steps_max:,}"
    return f"{g.steps_max:,}"


def _clock(ts: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(ts))


def _detail(detail: Any) -> str:
    text = json.dumps(detail, default=str, separators=(", ", ": ")) if detail else ""
    return text if len(text) <= 200 else text[:199] + "…"


def _number(query: dict[str, list[str]], key: str) -> float | None:
    values = query.get(key)
    if not values:
        return None
    raw = values[0]
    try:
        value = float(raw)
    except ValueError:
        raise HTTPError("400 Bad Request", f"{key}: expected a number") from None
    if not math.isfinite(value):
        raise HTTPError("400 Bad Request", f"{key}: expected a finite number")
    return value
