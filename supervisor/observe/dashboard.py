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
  /api/progress?game=NAME[&metric=M]  a configured run's curve (thinned) and its markers
  /api/metrics               every numeric progress column any run has (the page's list)
  /api/curves?game=GAME[&metric=M]  a [[games]] table's runs of metric M against agent
                             steps: each run, each variant's mean and min..max band
  /api/events[?since=TS][&limit=N]  events since Unix time TS (newest last), with sentences
  /api/sweeps                the configured sweeps: each one's counts by state and best trial
  /api/sweep?name=NAME       a sweep's trials ranked (`rlsup results --sweep NAME --json`) and
                             its search space (an unknown name 404; an unreadable store 503)
  /static/NAME               a fixed map of packaged files (the page's JS/CSS, uPlot)

Files read: the database, the run directories of configured games, the configured sweeps'
study stores (a name from a request is looked up among the configured games or sweeps, never
joined into a path) and the static map's files.
With a token, every request must carry it (`?token=` or `Authorization: Bearer`): 401 without
one, 403 with a wrong one. Without a token (loopback only), a request whose Host header is not
a loopback name is refused (403): a web page cannot read the dashboard by DNS rebinding.
"""

from __future__ import annotations

import hmac
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
from supervisor.observe import curves as C
from supervisor.observe import dashboard_sweeps as S
from supervisor.observe import readonly
from supervisor.observe import results as results_mod
from supervisor.observe.dashboard_page import (
    _cost_section,
    _e,
    _num,
    _table,
    charts_section,
    events_section,
    params_section,
)
from supervisor.observe.sentences import sentences
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
MAX_CACHED = 512  # curves kept (run x metric), read again once the file changes
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
        # (run, metric) -> (its progress file's (mtime, size), its curve): read once per change
        self._curves: dict[tuple[str, str], tuple[tuple[int, int], C.Curve]] = {}
        self._columns: dict[str, tuple[tuple[int, int], list[str]]] = {}
        self._tables = C.group_runs((g.name, g.group) for g in cfg.games)
        self._sweeps = S.specs(cfg)

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
            "/api/metrics": lambda q: {"metrics": self.metrics(), "default": C.DEFAULT_METRIC},
            "/api/curves": self.curves,
            "/api/events": self.events,
            "/api/sweeps": lambda q: {"sweeps": [S.summary(self.cfg, s) for s in self._sweeps]},
            "/api/sweep": self.sweep,
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

    def _metric_of(self, query: dict[str, list[str]]) -> str:
        metric = (query.get("metric") or [C.DEFAULT_METRIC])[0]
        if not metric or len(metric) > 200 or not metric.isprintable():
            raise HTTPError("400 Bad Request", "metric: expected a column name")
        return metric

    def progress(self, query: dict[str, list[str]]) -> dict[str, Any]:
        name = self._game_of(query)
        metric = self._metric_of(query)
        wanted = list(dict.fromkeys(("mean_return", "sps", metric)))
        c = self._curve(name, wanted)
        markers = []
        for e in self._events(kinds=tuple(readonly.MARKERS)):
            if e["game"] in (None, name):
                colour, label = readonly.MARKERS[e["kind"]]
                markers.append({"ts": e["ts"], "kind": e["kind"], "label": label,
                                "colour": colour, "step": C.x_of_time(c, e["ts"])})  # fmt: skip
        return {
            "game": name, "time": c.time, "step": c.step,
            "mean_return": c.values["mean_return"], "sps": c.values["sps"],
            "metric": metric, "value": c.values[metric], "superseded": c.superseded,
            "dropped": c.dropped[metric], "markers": markers,
        }  # fmt: skip

    def _key(self, name: str) -> tuple[int, int] | None:
        try:
            st = (self.cfg.run_dir(name) / PROGRESS_FILE).stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _curve(self, name: str, metrics: list[str]) -> C.Curve:
        """The run's curves of `metrics` (superseded points dropped, thinned to MAX_POINTS),
        cached while its progress.csv is unchanged (a week of 2 s rows is read once)."""
        key, tag = self._key(name), "\0".join(metrics)
        with self._lock:
            hit = self._curves.get((name, tag))
        if hit is not None and hit[0] == key:
            return hit[1]
        c = C.read_curve(self.cfg.run_dir(name), metrics, MAX_POINTS)
        if key is not None:
            with self._lock:
                if len(self._curves) >= MAX_CACHED:  # names asked for are any strings
                    self._curves.clear()
                self._curves[(name, tag)] = (key, c)
        return c

    def metrics(self) -> list[str]:
        """Every numeric column of any configured run's progress.csv (the default first)."""
        found: dict[str, None] = {C.DEFAULT_METRIC: None}
        for g in self.cfg.games:
            key = self._key(g.name)
            with self._lock:
                hit = self._columns.get(g.name)
            if hit is None or hit[0] != key:
                hit = (key or (0, 0), C.numeric_columns(self.cfg.run_dir(g.name)))
                with self._lock:
                    self._columns[g.name] = hit
            found.update(dict.fromkeys(hit[1]))
        return list(found)

    def _metrics_or_default(self) -> list[str]:
        try:
            return self.metrics()
        except OSError:
            return [C.DEFAULT_METRIC]

    def curves(self, query: dict[str, list[str]]) -> dict[str, Any]:
        game = (query.get("game") or [""])[0]
        groups = self._tables.get(game)  # looked up, never joined into a path
        if groups is None:
            raise HTTPError("404 Not Found", f"unknown game {game!r}")
        metric = self._metric_of(query)
        read = {r: self._curve(r, [metric]) for members in groups.values() for r in members}
        doc = C.chart(game, groups, read, metric)
        markers = []
        for e in self._events(kinds=tuple(readonly.MARKERS)):
            for r in read:
                x = C.x_of_time(read[r], e["ts"]) if e["game"] in (None, r) else None
                if x is not None:
                    colour, label = readonly.MARKERS[e["kind"]]
                    markers.append({"x": x, "kind": e["kind"], "label": label,
                                    "colour": colour, "run": r})  # fmt: skip
        return {**doc, "markers": markers}

    def sweep(self, query: dict[str, list[str]]) -> dict[str, Any]:
        name = (query.get("name") or [""])[0]
        spec = next((s for s in self._sweeps if s.name == name), None)  # never a path
        if spec is None:
            raise HTTPError("404 Not Found", f"unknown sweep {name!r} (configured: "
                            f"{S.known(self.cfg)})")  # fmt: skip
        try:
            return S.sweep_doc(self.cfg, spec)
        except S.SweepError as exc:
            raise HTTPError(
                "503 Service Unavailable", f"cannot read sweep {name!r}: {exc}"
            ) from None

    def events(self, query: dict[str, list[str]]) -> dict[str, Any]:
        since = _number(query, "since")
        limit = _number(query, "limit")
        n = EVENTS_LIMIT if limit is None else max(1, min(EVENTS_LIMIT, int(limit)))
        found = self._events(since=since, limit=n)
        for e, text in zip(found, sentences(found), strict=True):
            e["text"] = text
        return {"events": found}

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
        try:
            res: results_mod.Results | None = results_mod.collect(self.cfg)
            error = None
        except (sqlite3.Error, OSError) as exc:
            res, error = None, str(exc)
        parts.append(self._results_section(res, error))
        parts.append(S.sweeps_section(self.cfg))
        if doc is not None:
            parts.append(_cost_section(doc))
        parts.append(params_section(None if res is None else [*res.runs, *res.unscored], error))
        parts.append(charts_section(self._metrics_or_default(), self._tables, C.DEFAULT_METRIC))
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

    def _results_section(self, res: results_mod.Results | None, error: str | None) -> str:
        if res is None:
            return f'<h2>Results</h2><p class="error">cannot read the results: {_e(error)}</p>'
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
        return events_section(found)


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
