"""`rlsup dashboard`: a real server on a free port, asked over HTTP (urllib, http.client).

Unit-ish: 404s and path traversal (raw and encoded), the token for a non-loopback --listen,
the Host check, a page with no state yet, the CLI's start, URL and clean stop. Against a state
dir made by a real `rlsup run --exit-when-done` of a tiny CartPole game over two seeds (names
with '/'): the JSON endpoints and the page, while the supervisor is down. In a real headless
Chromium (Debian's `chromium`, skipped only when none is installed): a screenshot of the page
with the games and the results table, and the page updating a game's state in place after the
state changed in the database.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.runs import MODES, REPO, env_for, start_supervisor, stop_supervisor
from harness.state_fixture import SUPERSEDED, build_matrix_state
from supervisor.config import load_config
from supervisor.observe import dashboard as dash
from supervisor.observe import dashboard_page, readonly
from supervisor.observe.metrics import start_bounded_wsgi

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium)"
)


def write_config(directory: Path, total_steps: int = 1024) -> Path:
    path = directory / "rlsup.toml"
    path.write_text(
        'state_dir = "state"\ncheckpoint_every_s = 5\nstop_grace_s = 20\n'
        + MODES.format(max_concurrent=2)
        + f'[[games]]\nname = "cart"\nenv_id = "CartPole-v1"\ntotal_steps = {total_steps}\n'
        'device = "cpu"\nseeds = [1, 2]\nargs = { eval_episodes = 2 }\n'
    )
    return path


@contextlib.contextmanager
def serving(app: Callable[..., Any]) -> Iterator[str]:
    server = start_bounded_wsgi("127.0.0.1", 0, app, "test-dashboard")
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.stop()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def raw_get(base: str, target: str) -> int:
    """GET with the request target sent exactly as written (no client normalisation)."""
    host, port = urllib.parse.urlsplit(base).netloc.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("GET", target, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


# ---- no state yet: routes, 404s, traversal, token ------------------------------------------


@pytest.fixture
def fresh(tmp_path: Path) -> Any:
    env_for(tmp_path)  # the boot id file
    return load_config(write_config(tmp_path))


def test_the_page_says_no_state_yet_and_lists_the_configured_games(fresh: Any) -> None:
    with serving(dash.Dashboard(fresh)) as base:
        code, body, headers = get(base + "/")
        assert code == 200 and headers["Content-Type"].startswith("text/html")
        page = body.decode()
        assert "no state yet" in page
        assert 'data-game="cart/s1"' in page and 'data-game="cart/s2"' in page
        assert "no evaluation or training return yet" in page
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        code, body, _ = get(base + "/api/status")
        doc = json.loads(body)
        assert code == 200 and doc["supervisor"]["state"] == "absent"
        assert {g["state"] for g in doc["games"]} == {"not_started"}
        assert json.loads(get(base + "/api/events")[1]) == {"events": []}
        code, body, _ = get(base + "/api/progress?game=" + urllib.parse.quote("cart/s1", safe=""))
        assert code == 200 and json.loads(body)["time"] == []
        code, body, headers = get(base + "/static/uPlot.iife.min.js")
        assert code == 200 and b"uPlot" in body[:200]
        assert headers["Content-Type"].startswith("text/javascript")
    assert not fresh.state_dir.exists()  # read-only: not even the state dir is made


NOT_SERVED = [
    "/nope",
    "/index.html",
    "/api",
    "/api/status/",
    "/api/unknown",
    "/static/",
    "/static/nope.js",
    "/static/README.md",
    "/static/LICENSE-uPlot.txt",
    "/static/../../etc/passwd",
    "/static/..%2f..%2fetc%2fpasswd",
    "/static/%2e%2e/%2e%2e/etc/passwd",
    "/static/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/static//etc/passwd",
    "/static/dashboard.js/../../../etc/passwd",
    "/../../../etc/passwd",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/etc/passwd",
    "/state/rlsup.db",
    "/rlsup.db",
    "/api/progress?game=..%2F..%2F..%2Fetc",
    "/api/progress?game=%2Fetc%2Fpasswd",
    "/api/progress?game=cart",  # the group, not a run
    "/api/progress",
]


def test_what_it_does_not_serve_is_404(fresh: Any) -> None:
    with serving(dash.Dashboard(fresh)) as base:
        for target in NOT_SERVED:
            assert raw_get(base, target) == 404, target
        assert get(base + "/api/events?since=yesterday")[0] == 400
        req = urllib.request.Request(base + "/", method="POST", data=b"x")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 405


def test_it_never_opens_a_file_outside_the_state_dir(fresh: Any, tmp_path: Path) -> None:
    """Every file the dashboard opens while serving hostile requests (Python's audit hook sees
    each open() and sqlite3.connect) is in the state dir, the packaged static files, /proc or
    /sys (host vitals), or the boot id file."""
    opened: list[str] = []
    recording = threading.Event()

    def hook(event: str, args: tuple[Any, ...]) -> None:
        watched = recording.is_set() and event in ("open", "sqlite3.connect") and args
        if watched and isinstance(args[0], str | bytes | os.PathLike):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)  # cannot be removed: it records only while `recording` is set
    fresh.state_dir.mkdir(mode=0o700)
    (fresh.state_dir / "rlsup.db").write_bytes(b"")  # an empty database file
    with serving(dash.Dashboard(fresh)) as base:
        get(base + "/")  # lazy imports happen here, not while recording
        get(base + "/api/progress?game=cart%2Fs1")
        recording.set()
        try:
            for target in [*NOT_SERVED, "/", "/api/status", "/api/results", "/api/events",
                           "/api/progress?game=cart%2Fs1", "/static/dashboard.js"]:  # fmt: skip
                raw_get(base, target)
        finally:
            recording.clear()
    allowed = (
        str(fresh.state_dir) + "/",
        str(dash.STATIC_DIR) + "/",
        "/proc/",
        "/sys/",
        str(tmp_path / "boot_id"),
    )
    outside = [
        p for p in opened if not os.path.abspath(p.removeprefix("file:")).startswith(allowed)
    ]
    assert opened and not outside, outside
    assert all(p.endswith("?mode=ro") for p in opened if p.startswith("file:"))  # read-only


def test_a_token_is_needed_on_every_request(fresh: Any) -> None:
    token = "t0ken-" + "x" * 20
    with serving(dash.Dashboard(fresh, token=token)) as base:
        for path in ("/", "/api/status", "/static/dashboard.js", "/nope"):
            code, _, headers = get(base + path)
            assert code == 401 and headers["WWW-Authenticate"].startswith("Bearer"), path
            assert get(base + path + "?token=wrong")[0] == 403, path
            bearer = {"Authorization": "Bearer wrong"}
            assert get(base + path, bearer)[0] == 403, path
        assert get(base + "/nope?token=" + token)[0] == 404
        code, body, _ = get(base + "/?token=" + token)
        assert code == 200
        assert f'src="/static/dashboard.js?token={token}"' in body.decode()
        code, _, _ = get(base + "/api/status", {"Authorization": f"Bearer {token}"})
        assert code == 200


def test_without_a_token_only_loopback_host_names_are_served(fresh: Any) -> None:
    with serving(dash.Dashboard(fresh)) as base:
        port = base.rsplit(":", 1)[1]
        assert get(base + "/", {"Host": f"localhost:{port}"})[0] == 200
        assert get(base + "/", {"Host": f"[::1]:{port}"})[0] == 200
        assert get(base + "/", {"Host": f"attacker.example:{port}"})[0] == 403  # DNS rebinding


def test_the_params_tables_put_differing_and_partial_keys_first() -> None:
    from types import SimpleNamespace as Run

    runs = [
        Run(name="cmd/a/s1", group="cmd/a", params={"lr": 0.1, "env": "x", "flag": True}),
        Run(name="cmd/b/s1", group="cmd/b", params={"lr": 0.2, "env": "x", "extra": None}),
        Run(name="other", group="other", params={}),  # nothing known: no table
    ]
    html = dashboard_page.params_section(runs)
    heads = "<tr><th>run</th><th>lr</th><th>flag</th><th>extra</th></tr>"
    assert heads in html and html.count('class="params-game"') == 1
    row = '<tr class="params-run"><td>'
    assert row + "cmd/a/s1</td><td>0.1</td><td>true</td><td>-</td></tr>" in html
    assert row + "cmd/b/s1</td><td>0.2</td><td>-</td><td>null</td></tr>" in html
    assert "<summary>shared by its 2 run(s): 1 parameter(s)</summary>" in html
    assert "no run with known parameters yet" in dashboard_page.params_section([])
    broken = dashboard_page.params_section(None, "database is locked <x>")
    assert "cannot read the parameters: database is locked &lt;x&gt;" in broken


def test_thinning_keeps_the_newest_row() -> None:
    rows = [{"time": str(t), "global_step": str(10 * t), "mean_return": "1"} for t in range(5001)]
    cols = dash.thin(rows, max_points=1000)
    assert len(cols["time"]) <= 1001 and cols["time"][-1] == 5000.0 and cols["time"][0] == 0.0


# ---- the command -----------------------------------------------------------------------------


def dashboard_cli(config: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "dashboard", "--config", str(config), *args],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def url_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("rlsup dashboard: http://"), (line, proc.stderr and proc.stderr.read())
    return line.split(": ", 1)[1].strip().rstrip("/")


def stop_cli(proc: subprocess.Popen[str], sig: int) -> int:
    try:
        proc.send_signal(sig)
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_command_prints_the_url_and_stops_cleanly_on_sigint_and_sigterm(
    tmp_path: Path,
) -> None:
    config, env = write_config(tmp_path), env_for(tmp_path)
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = dashboard_cli(config, env, "--port", "0")
        try:
            base = url_of(proc)
            assert base.startswith("http://127.0.0.1:")
            assert get(base + "/")[0] == 200
        finally:
            assert stop_cli(proc, sig) == 0


def test_a_port_in_use_is_exit_1(tmp_path: Path) -> None:
    config, env = write_config(tmp_path), env_for(tmp_path)
    proc = dashboard_cli(config, env, "--port", "0")
    try:
        port = url_of(proc).rsplit(":", 1)[1]
        second = dashboard_cli(config, env, "--port", port)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 1 and "cannot listen" in err
    finally:
        assert stop_cli(proc, signal.SIGTERM) == 0


def test_a_non_loopback_listen_needs_a_token(tmp_path: Path) -> None:
    config, env = write_config(tmp_path), env_for(tmp_path)
    state = tmp_path / "state"

    def refused(*args: str) -> str:
        proc = dashboard_cli(config, env, "--port", "0", *args)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err
        return err

    assert "does not exist" in refused("--listen", "0.0.0.0")  # no state dir to keep one in
    assert not state.exists()
    assert "cannot read the token file" in refused("--listen", "0.0.0.0", "--token-file", "/nope")
    loose = tmp_path / "loose.token"
    loose.write_text("y" * 32)
    loose.chmod(0o644)
    assert "chmod 600" in refused("--listen", "0.0.0.0", "--token-file", str(loose))
    short = tmp_path / "short.token"
    short.write_text("abc")
    short.chmod(0o600)
    assert "at least 16" in refused("--listen", "0.0.0.0", "--token-file", str(short))

    state.mkdir(mode=0o700)
    proc = dashboard_cli(config, env, "--port", "0", "--listen", "0.0.0.0")
    try:
        base = url_of(proc).replace("0.0.0.0", "127.0.0.1")
        token_file = state / "dashboard.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        assert get(base + "/")[0] == 401
        assert get(base + "/?token=" + token)[0] == 200
        assert get(base + "/api/status", {"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        assert stop_cli(proc, signal.SIGTERM) == 0
    assert sorted(p.name for p in state.iterdir()) == ["dashboard.token"]  # nothing else written

    own = tmp_path / "own.token"
    own.write_text("z" * 24 + "\n")
    own.chmod(0o600)
    proc = dashboard_cli(config, env, "--port", "0", "--token-file", str(own))  # on loopback
    try:
        base = url_of(proc)
        assert get(base + "/api/status")[0] == 401
        assert get(base + "/api/status?token=" + "z" * 24)[0] == 200
    finally:
        assert stop_cli(proc, signal.SIGTERM) == 0


# ---- against a real run's state dir, the supervisor down -------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `rlsup run --exit-when-done`: CartPole over seeds 1 and 2 (runs cart/s1, cart/s2)."""
    tmp = tmp_path_factory.mktemp("trained")
    config = write_config(tmp)
    sup = start_supervisor(config, env_for(tmp), "--exit-when-done")
    try:
        assert sup.wait(240) == 0, (tmp / "supervisor.log").read_text()[-3000:]
    finally:
        stop_supervisor(sup)
    return tmp


def copy_of(trained: Path, tmp_path: Path) -> Any:
    shutil.copytree(trained, tmp_path / "t")
    env_for(tmp_path / "t")
    return load_config(tmp_path / "t" / "rlsup.toml")


def test_the_json_endpoints_and_the_page_from_the_state_dir_alone(
    trained: Path, tmp_path: Path
) -> None:
    cfg = copy_of(trained, tmp_path)
    with serving(dash.Dashboard(cfg)) as base:
        status = json.loads(get(base + "/api/status")[1])
        assert status["supervisor"]["state"] == "stopped"
        assert {g["name"]: g["state"] for g in status["games"]} == {
            "cart/s1": "done",
            "cart/s2": "done",
        }
        results = json.loads(get(base + "/api/results")[1])
        [row] = results["groups"]
        assert row["group"] == "cart" and row["n"] == 2 and row["eval"]["n"] == 2
        prog = json.loads(get(base + "/api/progress?game=cart%2Fs2")[1])
        assert prog["game"] == "cart/s2" and len(prog["time"]) >= 1
        assert len(prog["time"]) == len(prog["mean_return"]) == len(prog["step"])
        assert prog["step"][-1] >= 1024
        events = json.loads(get(base + "/api/events")[1])["events"]
        kinds = {e["kind"] for e in events}
        assert {"supervisor_start", "game_done", "supervisor_stop"} <= kinds
        later = json.loads(get(base + f"/api/events?since={events[-1]['ts']}")[1])["events"]
        assert later and all(e["ts"] >= events[-1]["ts"] for e in later)
        assert len(json.loads(get(base + "/api/events?limit=2")[1])["events"]) == 2
        page = get(base + "/")[1].decode()
        assert 'id="games"' in page and 'id="results"' in page
        assert '<td data-field="state" class="state state-done">done</td>' in page
        assert "<td>cart</td>" in page and "game_done" in page
        assert "supervisor stopped cleanly" in page
        # Where each run's time went (status's games[].time), one row per run.
        assert 'id="time"' in page and page.count("<tr><td>cart/s") == 2


def chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-dev-shm-usage", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@needs_chromium
def test_chromium_screenshot_shows_the_games_and_the_results_table(
    trained: Path, tmp_path: Path
) -> None:
    cfg = copy_of(trained, tmp_path)
    shot = tmp_path / "dashboard.png"
    times = [float(r["time"]) for r in readonly.read_progress(cfg.run_dir("cart/s1"))]
    conn = sqlite3.connect(cfg.db_path)  # a crash mid-curve: its marker is drawn
    with conn:
        conn.execute(
            "INSERT INTO events(ts, kind, game, detail) VALUES (?, 'worker_crash', 'cart/s1', ?)",
            ((times[0] + times[-1]) / 2, '{"note": "inserted by the test"}'),
        )
    conn.close()
    with serving(dash.Dashboard(cfg)) as base:
        profile = f"--user-data-dir={tmp_path / 'profile'}"
        out = chromium(profile, "--window-size=1400,1300", "--virtual-time-budget=5000",
                       f"--screenshot={shot}", base + "/")  # fmt: skip
        assert shot.is_file(), out.stderr[-2000:]
        dom = chromium(profile, "--virtual-time-budget=5000", "--dump-dom", base + "/").stdout
    keep = os.environ.get("RLSUP_DASHBOARD_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page, not a blank one
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1400, 1300)
    # What the browser rendered (after its scripts ran): the games, the table, the charts.
    assert 'data-game="cart/s1"' in dom and 'data-game="cart/s2"' in dom
    assert 'id="results"' in dom and "<td>cart</td>" in dom
    # uPlot drew the game's one chart, its two seeds overlaid (script and CSP work)
    assert dom.count("<canvas") >= 1 and 'data-table="cart"' in dom
    assert 'data-metric="mean_return" data-series="' in dom
    assert 'id="stamp" class="muted">updated' in dom  # the poll ran and succeeded
    assert "worker_crash" in dom


@needs_chromium
def test_chromium_page_updates_a_game_state_in_place(trained: Path, tmp_path: Path) -> None:
    """The page is served while cart/s1 is `done`; the state changes in the database right
    after (as the supervisor would write it); the page's poll shows `fatal` without a reload."""
    cfg = copy_of(trained, tmp_path)
    app = dash.Dashboard(cfg, status_ttl_s=0)  # virtual time polls faster than real time
    served: list[str] = []

    def change_after_the_page(environ: dict[str, Any], start_response: Any) -> Any:
        body = app(environ, start_response)
        if environ["PATH_INFO"] == "/" and not served:
            served.append(b"".join(body).decode())
            conn = sqlite3.connect(cfg.db_path)
            with conn:
                conn.execute(
                    "UPDATE workers SET state = 'fatal', reason = 'test' WHERE game = 'cart/s1'"
                )
            conn.close()
            return [served[0].encode()]
        return body

    with serving(change_after_the_page) as base:
        dom = chromium(f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=8000",
                       "--dump-dom", base + "/").stdout  # fmt: skip
    assert served, "chromium never asked for the page"
    before = '<td data-field="state" class="state state-done">done</td>'
    assert served[0].count(before) == 2  # both done when the page was rendered
    after = '<td data-field="state" class="state state-fatal">fatal</td>'
    assert dom.count(after) == 1 and dom.count(before) == 1, dom[:3000]


def test_every_static_file_exists_and_is_package_data() -> None:
    """A wheel ships what the fixed map serves (pyproject's package-data globs match it)."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["supervisor"]
    for name, (file, _) in dash.STATIC.items():
        assert (dash.STATIC_DIR / file).is_file(), name
        assert any(fnmatch.fnmatch(f"static/{file}", g) for g in globs), file
    assert any(fnmatch.fnmatch("static/LICENSE-uPlot.txt", g) for g in globs)


# ---- curves of any metric: a game's variants overlaid, each with its seeds' mean and band ----


@pytest.fixture
def matrix(tmp_path: Path) -> Any:
    """cart over seeds 1-3 x variants base, lr3 (six runs, done); cart/lr3/s2 crashed at 80 %
    and resumed from its checkpoint at 50 % (its old life's rows carry SUPERSEDED)."""
    fx = build_matrix_state(tmp_path / "m", bad_cells=2)
    env_for(tmp_path / "m")
    return load_config(fx.config)


def test_the_curves_endpoints_overlay_variants_with_mean_and_band(matrix: Any) -> None:
    with serving(dash.Dashboard(matrix)) as base:
        doc = json.loads(get(base + "/api/metrics")[1])
        assert doc["default"] == "mean_return" and doc["metrics"][0] == "mean_return"
        assert {"policy_loss", "value_loss", "my_metric", "sps"} <= set(doc["metrics"])
        assert "time" not in doc["metrics"] and "global_step" not in doc["metrics"]
        code, body, _ = get(base + "/api/curves?game=cart&metric=policy_loss")
        assert code == 200, body
        doc = json.loads(body)
        assert doc["game"] == "cart" and doc["metric"] == "policy_loss"
        assert [v["group"] for v in doc["variants"]] == ["cart/base", "cart/lr3"]
        assert all(v["runs"] == 3 and v["band"] for v in doc["variants"])
        roles = sorted((s["group"], s["role"]) for s in doc["series"])
        assert roles.count(("cart/base", "run")) == 3 and roles.count(("cart/lr3", "run")) == 3
        for group in ("cart/base", "cart/lr3"):
            assert {(group, r) for r in ("mean", "min", "max")} <= set(roles)
        assert all(len(s["values"]) == len(doc["x"]) for s in doc["series"])
        assert doc["superseded"] == 36
        values = [v for s in doc["series"] for v in s["values"] if v is not None]
        assert values and SUPERSEDED not in values and min(values) > 0
        assert any(
            m["kind"] == "worker_crash" and m["run"] == "cart/lr3/s2" for m in doc["markers"]
        )
        prog = json.loads(get(base + "/api/progress?game=cart%2Flr3%2Fs2&metric=my_metric")[1])
        assert prog["metric"] == "my_metric" and prog["superseded"] == 36
        assert len(prog["value"]) == len(prog["step"]) == len(prog["mean_return"])
        assert SUPERSEDED not in prog["mean_return"] and prog["dropped"] == 2
        assert all(b > a for a, b in zip(prog["step"], prog["step"][1:], strict=False))
        for bad in ("/api/curves?game=cart%2Fbase", "/api/curves?game=nosuch", "/api/curves"):
            assert get(base + bad)[0] == 404, bad
        assert get(base + "/api/curves?game=cart&metric=%00")[0] == 400
        empty = json.loads(get(base + "/api/curves?game=cart&metric=nosuch")[1])
        assert empty["x"] == [] and empty["series"] == []
        events = json.loads(get(base + "/api/events")[1])["events"]
        assert all(isinstance(e["text"], str) and e["text"] for e in events)
        res = json.loads(get(base + "/api/results")[1])
        lrs = {r["name"]: r["params"]["learning_rate"] for r in res["runs"]}
        assert lrs["cart/lr3/s2"] == 3e-4 and lrs["cart/base/s2"] is None  # the algo's default
        page = get(base + "/")[1].decode()
    assert '<select id="metric" name="metric">' in page
    assert '<option value="policy_loss">policy_loss</option>' in page
    assert '<option value="mean_return" selected>mean_return</option>' in page
    assert page.count('class="chart" data-table=') == 1  # one chart per game, variants overlaid
    assert (
        "cart/lr3/s2 crashed (killed by SIGKILL) at step 96,000; its last checkpoint was step "
        "60,000"
    ) in page
    assert "cart/lr3/s2 was restarted (restart 1), resuming from its last checkpoint, step " \
        "60,000" in page  # fmt: skip
    assert "<details><summary>worker_crash</summary><pre>" in page
    assert "&quot;returncode&quot;: -9" in page  # the raw detail, a click away
    assert 'id="params-section"' in page and "hyper-parameters: next" not in page
    # One table for cart, a row per run; the keys that differ (the variant's learning rate,
    # the seed) first, the shared ones folded.
    assert '<div class="params-game" data-game="cart"><h3>cart</h3>' in page
    assert "<thead><tr><th>run</th><th>learning_rate</th><th>seed</th></tr></thead>" in page
    assert '<tr class="params-run"><td>cart/lr3/s2</td><td>0.0003</td><td>2</td></tr>' in page
    assert "<details><summary>shared by its 6 run(s): " in page
    assert "<tr><th>game</th><td>CartPole-v1</td></tr>" in page


@needs_chromium
def test_chromium_overlays_three_seeds_of_two_variants_for_a_metric_picked_from_the_list(
    matrix: Any, tmp_path: Path
) -> None:
    """The page, opened with a metric picked from its list (#metric=policy_loss: the select
    takes it only when the list has it), draws cart's one chart: six runs, two means, two
    bands, a legend of the two variants; a name not in the list leaves mean_return."""
    shot = tmp_path / "curves.png"
    with serving(dash.Dashboard(matrix)) as base:
        profile = f"--user-data-dir={tmp_path / 'profile'}"
        url = base + "/#metric=policy_loss"
        out = chromium(profile, "--window-size=1400,1800", "--virtual-time-budget=6000",
                       f"--screenshot={shot}", url)  # fmt: skip
        assert shot.is_file(), out.stderr[-2000:]
        dom = chromium(profile, "--virtual-time-budget=6000", "--dump-dom", url).stdout
        other = chromium(profile, "--virtual-time-budget=6000", "--dump-dom",
                         base + "/#metric=not_a_column").stdout  # fmt: skip
    keep = os.environ.get("RLSUP_DASHBOARD_CURVES_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
    assert 'data-table="cart" data-metric="policy_loss"' in dom, dom[-4000:]
    # 6 runs + per variant mean, min, max = 12 series; one band per variant
    assert 'data-series="12" data-bands="2"' in dom
    assert dom.count("<canvas") == 1
    assert '<span class="variant" data-group="cart/base">' in dom
    assert "cart/base: 3 seeds, mean and min..max band" in dom
    assert "cart/lr3: 3 seeds, mean and min..max band" in dom
    assert "point(s) redone after a resume dropped" in dom
    assert 'data-table="cart" data-metric="mean_return"' in other
    assert 'class="sentence">cart/lr3/s2 crashed (killed by SIGKILL)' in dom
    # The hyper-parameters: cart's table, the differing key (learning_rate) its first column.
    table = dom[dom.index('<div class="params-game" data-game="cart">') :]
    heads = re.findall(r"<th>([^<]*)</th>", table[: table.index("</thead>")])
    assert heads == ["run", "learning_rate", "seed"], heads
    assert '<tr class="params-run"><td>cart/lr3/s1</td><td>0.0003</td><td>1</td></tr>' in table
    assert "<summary>shared by its 6 run(s): " in table
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
