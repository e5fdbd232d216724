"""The dashboard's sweeps: `/api/sweeps`, `/api/sweep?name=NAME` and the page's sweep section,
served by a real server on a free port, over a state dir with a real Optuna study made by the
supervisor's own writer (`harness/sweep_fixture.py`: four trials complete, one pruned, one
failed, one running, three waiting). Read-only: the study store is never created or changed.

Bad input: an unknown name (or one shaped like a path) is a 404 naming the configured sweeps,
and no file outside the state dir is opened; a corrupt study store is said, naming the file, in
the API's answer (503), in `/api/sweeps` and on the page, never a 500 or a traceback; an
infinite value told to the study goes out as null (JSON has no Infinity). In a real headless
Chromium: the section's table (refreshed by the page's script, cell for cell as the server
wrote it) and its charts (best so far over trials; the value against each parameter: a log axis
for the log range, one slot per word for a list of words), with no error on the console.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
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

from harness.sweep_fixture import FAIL_MESSAGE, PRUNED_MESSAGE, SweepFixture, build_sweep_state
from supervisor.config import Config, load_config
from supervisor.observe import dashboard as dash
from supervisor.observe.dashboard_sweeps import finite
from supervisor.observe.metrics import start_bounded_wsgi
from supervisor.observe.sweeps import sweep_spec
from supervisor.sweep.study import Study, read_rows

pytestmark = pytest.mark.timeout(300)

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium)"
)
RANKED = [2, 3, 0, 1, 4, 6, 5, 7, 8, 9]  # complete by value, pruned, running, fail, waiting


@contextlib.contextmanager
def serving(app: Callable[..., Any]) -> Iterator[str]:
    server = start_bounded_wsgi("127.0.0.1", 0, app, "test-dashboard-sweeps")
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.stop()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def refuse(name: str) -> None:
    raise AssertionError(f"not JSON: {name}")


def api(base: str, path: str) -> Any:
    code, body = get(base + path)
    assert code == 200, (path, code, body)
    return json.loads(body, parse_constant=refuse)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> SweepFixture:
    """The state dir, made once (the study's writes take a second or two); each test a copy."""
    return build_sweep_state(tmp_path_factory.mktemp("sweep") / "s")


@pytest.fixture
def swept(
    built: SweepFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[SweepFixture, Config]:
    root = tmp_path / "s"
    shutil.copytree(built.root, root)
    fx = SweepFixture(root, root / "rlsup.toml", root / "state", built.name, built.trials)
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(fx.root / "boot_id"))
    return fx, load_config(fx.config)


def test_the_sweep_endpoints_rank_the_trials_of_a_real_study(
    swept: tuple[SweepFixture, Config],
) -> None:
    fx, cfg = swept
    stored = {r.number: r for r in read_rows(cfg.state_dir, sweep_spec(cfg, "cart")) or []}
    before = fx.store.stat().st_mtime_ns, fx.store.read_bytes()
    with serving(dash.Dashboard(cfg)) as base:
        [line] = api(base, "/api/sweeps")["sweeps"]
        doc = api(base, "/api/sweep?name=cart")
        code, page = get(base + "/")
    assert line["name"] == "cart" and line["error"] is None
    assert line["counts"] == {"complete": 4, "pruned": 1, "running": 1, "fail": 1, "waiting": 3}
    assert line["best"]["trial"] == 2 and line["best"]["value"] == 410.5
    assert line["best"]["params"] == stored[2].params
    assert line["params"] == ["learning_rate", "n_steps", "clip_coef", "lr_scheduler"]
    assert (line["trials_configured"], line["direction"], line["pruner"]) == (10, "maximize",
                                                                             "median")  # fmt: skip

    assert doc["schema"] == 1 and doc["best"] == 2 and doc["trials_configured"] == 10
    trials = doc["trials"]
    assert [t["trial"] for t in trials] == RANKED
    assert [t["rank"] for t in trials[:4]] == [1, 2, 3, 4]
    assert all(t["rank"] is None for t in trials[4:])
    by = {t["trial"]: t for t in trials}
    for n, row in stored.items():  # the study's own word on each trial, as the study holds it
        assert by[n]["params"] == row.params and by[n]["state"] == row.state, n
    assert by[2]["value"] == 410.5 and by[2]["std"] == pytest.approx(14.8492, abs=1e-3)
    assert by[2]["seeds"] == {"cart/t002/s1": 400.0, "cart/t002/s2": 421.0}
    assert by[2]["steps"] == 8192 and by[2]["money"] == pytest.approx(0.24, abs=0.01)
    assert (by[4]["state"], by[4]["value"], by[4]["message"]) == ("pruned", 35.0, PRUNED_MESSAGE)
    assert (by[5]["state"], by[5]["value"], by[5]["message"]) == ("fail", None, FAIL_MESSAGE)
    assert by[7]["state"] == "waiting" and by[7]["params"] == {}
    assert doc["best_so_far"][:4] == [[0, 120.0], [1, 120.0], [2, 410.5], [3, 410.5]]
    space = {p["name"]: p for p in doc["space"]}
    assert space["learning_rate"] == {"name": "learning_rate", "kind": "float", "low": 1e-5,
                                      "high": 1e-2, "log": True}  # fmt: skip
    assert space["n_steps"] == {"name": "n_steps", "kind": "choice", "choices": [64, 128, 256],
                                "log": False}  # fmt: skip
    assert space["lr_scheduler"]["choices"] == ["none", "cosine", "linear"]

    assert code == 200
    section = page[page.index('<section id="sweeps-section">') :]
    section = section[: section.index("</section>")]
    assert "maximize eval over 10 trial(s), sampler random, pruner median: 4 complete, " \
        "1 pruned, 1 running, 1 fail, 3 waiting; best: cart/t002, eval 410.50 ± 14.85" \
        in section  # fmt: skip
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", section)
    assert heads == ["rank", "trial", "state", "eval", "learning_rate", "n_steps", "clip_coef",
                     "lr_scheduler", "steps", "hours", "cost", "why"]  # fmt: skip
    rows = re.findall(r'<tr data-trial="(\d+)"', section)
    assert [int(n) for n in rows] == RANKED[:7]  # the waiting ones folded in one row
    assert '<tr class="waiting-rest"><td colspan="12">3 trial(s) not started yet: cart/t007 ' \
        ".. cart/t009</td></tr>" in section  # fmt: skip
    best = re.search(r'<tr data-trial="2" class="best">(.*?)</tr>', section)
    assert best is not None
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", best.group(1))
    assert cells[:4] == ["1", "cart/t002", "complete", "410.50 ± 14.85"]
    assert cells[-4:] == ["8,192", "0.13", "0.24", ""]
    assert '<td class="state state-pruned">pruned</td><td>35.00 ± 7.07</td>' in section
    assert "exit 78: the script refused its parameters: n_steps=256 too large for &lt;this&gt;" \
        in section  # fmt: skip
    assert section.count('class="sweep-chart"') == 5  # best so far + one per parameter
    assert 'data-kind="param" data-param="learning_rate"' in section
    assert "eval against learning_rate (log)</h4>" in section
    assert (fx.store.stat().st_mtime_ns, fx.store.read_bytes()) == before  # read-only


def test_an_unknown_sweep_is_a_404_and_no_file_outside_the_state_dir_is_opened(
    swept: tuple[SweepFixture, Config], tmp_path: Path
) -> None:
    fx, cfg = swept
    hostile = ["nope", "cart/t000", "cart/t000/s1", "../../etc/passwd", "/etc/passwd",
               "..%2Fsweeps%2Fcart", "cart.db", "sweeps/cart", "CART", "cart\x00", ""]  # fmt: skip
    opened: list[str] = []
    recording = threading.Event()

    def hook(event: str, args: tuple[Any, ...]) -> None:
        watched = recording.is_set() and event in ("open", "sqlite3.connect") and args
        if watched and isinstance(args[0], str | bytes | os.PathLike):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)  # cannot be removed: it records only while `recording` is set
    with serving(dash.Dashboard(cfg)) as base:
        api(base, "/api/sweep?name=cart")  # lazy imports (Optuna, SQLAlchemy) happen here
        recording.set()
        try:
            for name in hostile:
                code, body = get(base + "/api/sweep?name=" + urllib.parse.quote(name, safe=""))
                assert code == 404, (name, code, body)
                assert body == f"unknown sweep {name!r} (configured: cart)\n", body
            assert get(base + "/api/sweep")[0] == 404
            assert get(base + "/api/sweep?game=cart")[0] == 404  # the key is `name`
            assert get(base + "/api/sweeps/")[0] == 404
            api(base, "/api/sweep?name=cart")
            api(base, "/api/sweeps")
        finally:
            recording.clear()
    import optuna

    # Optuna reads its own package's files (alembic.ini, its schema versions) per storage.
    package = os.path.dirname(optuna.__file__) + "/"
    allowed = (str(cfg.state_dir) + "/", str(fx.root / "boot_id"), "/proc/", "/sys/", package)
    outside = [p for p in opened if not os.path.abspath(p.removeprefix("file:")).startswith(
        allowed)]  # fmt: skip
    assert opened and not outside, outside
    assert any(p.startswith(str(fx.store)) for p in opened)  # the study was read


def test_a_corrupt_study_store_is_said_naming_it_never_a_500(
    swept: tuple[SweepFixture, Config],
) -> None:
    fx, cfg = swept
    garbage = b"this is not a database\n" * 64
    fx.store.write_bytes(garbage)
    with serving(dash.Dashboard(cfg)) as base:
        code, body = get(base + "/api/sweep?name=cart")
        assert code == 503, body
        assert body.startswith(f"cannot read sweep 'cart': {fx.store}: the sweep's study storage")
        assert "Traceback" not in body
        [line] = api(base, "/api/sweeps")["sweeps"]
        assert line["counts"] is None and line["best"] is None
        assert line["error"].startswith(f"{fx.store}: ") and "unreadable" in line["error"]
        code, page = get(base + "/")
    assert code == 200 and "Traceback" not in page
    assert f'<p class="error sweep-error">{fx.store}: the sweep' in page
    assert 'class="sweep-chart"' not in page  # no chart boxes for a store it cannot read
    assert fx.store.read_bytes() == garbage  # never overwritten, never "repaired"

    # A SQLite file, but another program's: said as such.
    fx.store.unlink()
    import sqlite3

    conn = sqlite3.connect(fx.store)
    conn.execute("CREATE TABLE notes(x)")
    conn.close()
    with serving(dash.Dashboard(cfg)) as base:
        code, body = get(base + "/api/sweep?name=cart")
    assert code == 503 and "not an Optuna study storage" in body, body


def test_a_sweep_not_started_yet_shows_every_trial_waiting_and_creates_nothing(
    swept: tuple[SweepFixture, Config],
) -> None:
    fx, cfg = swept
    shutil.rmtree(fx.state_dir)  # the config alone: never run
    with serving(dash.Dashboard(cfg)) as base:
        doc = api(base, "/api/sweep?name=cart")
        [line] = api(base, "/api/sweeps")["sweeps"]
        page = get(base + "/")[1]
    assert [t["state"] for t in doc["trials"]] == ["waiting"] * 10
    assert doc["best"] is None and all(v is None for _, v in doc["best_so_far"])
    assert line["counts"] == {"waiting": 10} and line["best"] is None
    assert "10 trial(s) not started yet: cart/t000 .. cart/t009" in page
    assert "best: none complete yet" in page
    assert not fx.state_dir.exists()  # read-only: no store, no state dir made


def test_without_a_sweep_there_is_no_section_and_every_name_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "boot_id").write_text("b\n")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot_id"))
    config = tmp_path / "rlsup.toml"
    config.write_text('state_dir = "state"\n[modes.light]\nnum_envs = 4\nbatch_size = 128\n'
                      'n_steps = 64\nmax_concurrent = 1\n[[games]]\nname = "cart"\n'
                      'env_id = "CartPole-v1"\ntotal_steps = 1024\n')  # fmt: skip
    with serving(dash.Dashboard(load_config(config))) as base:
        assert api(base, "/api/sweeps") == {"sweeps": []}
        code, body = get(base + "/api/sweep?name=cart")
        page = get(base + "/")[1]
    assert code == 404
    assert body == "unknown sweep 'cart' (configured: none: no [[games]] table has [games.sweep])\n"
    assert "sweeps-section" not in page


def test_an_infinite_value_told_to_the_study_goes_out_as_null(
    swept: tuple[SweepFixture, Config],
) -> None:
    """Optuna stores a value of inf as a complete trial's; JSON has no Infinity (a browser's
    JSON.parse refuses the page's data): it goes out as null, the rest unchanged."""
    _, cfg = swept
    study = Study(sweep_spec(cfg, "cart"), cfg.state_dir)  # the supervisor's writer
    study.params(7)
    study.report(7, 0, float("-inf"))
    assert study.tell(7, "complete", float("inf")) == "complete"
    with serving(dash.Dashboard(cfg)) as base:
        doc = api(base, "/api/sweep?name=cart")  # parse_constant: Infinity/NaN refused
        [line] = api(base, "/api/sweeps")["sweeps"]
    by = {t["trial"]: t for t in doc["trials"]}
    assert by[7]["state"] == "complete" and by[7]["value"] is None
    assert doc["best"] == 7 and line["best"]["trial"] == 7 and line["best"]["value"] is None
    assert by[2]["value"] == 410.5
    assert finite({"a": [1.0, float("nan")], "b": (float("-inf"), "x", 2)}) == {
        "a": [1.0, None], "b": [None, "x", 2]
    }  # fmt: skip


# ---- in a real browser -------------------------------------------------------------------------


def chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-dev-shm-usage", "--enable-logging=stderr", "--v=0", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def console(out: subprocess.CompletedProcess[str]) -> list[str]:
    """What the page's scripts said on the console (uncaught errors, CSP refusals, logs)."""
    return [line for line in out.stderr.splitlines() if ":CONSOLE" in line]


def tbody(html: str) -> list[str]:
    """The sweep table's rows, the running trial's left out (its cost grows by the second)."""
    start = html.index("<tbody>", html.index('class="sweep-trials"'))
    rows = re.findall(r"<tr[^>]*>.*?</tr>", html[start : html.index("</tbody>", start)])
    return [r for r in rows if 'class="state state-running"' not in r]


@pytest.mark.e2e
@needs_chromium
def test_chromium_draws_the_sweep_table_and_charts_without_a_script_error(
    swept: tuple[SweepFixture, Config], tmp_path: Path
) -> None:
    fx, cfg = swept
    shot = tmp_path / "sweep.png"
    app = dash.Dashboard(cfg)
    with serving(app) as base:
        served = get(base + "/")[1]
        profile = f"--user-data-dir={tmp_path / 'profile'}"
        out = chromium(profile, "--window-size=1400,2600", "--virtual-time-budget=6000",
                       f"--screenshot={shot}", base + "/")  # fmt: skip
        assert shot.is_file(), out.stderr[-2000:]
        dumped = chromium(profile, "--virtual-time-budget=6000", "--dump-dom", base + "/")
    keep = os.environ.get("RLSUP_DASHBOARD_SWEEP_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
    dom = dumped.stdout
    assert not console(out) and not console(dumped), console(out) + console(dumped)
    charts = dict(re.findall(r'<div class="sweep-chart" data-sweep="cart" data-kind="(?:best|'
                             r'param)"(?: data-param="(\w+)")?([^>]*)>', dom))  # fmt: skip
    # The best so far: trials 0..6 (the newest asked), 4 complete dots, 1 pruned ring.
    assert 'data-trials="7" data-complete="4" data-pruned="1" data-drawn="1"' in charts[""]
    for name, scale in (("learning_rate", "log"), ("n_steps", "linear"),
                        ("clip_coef", "linear"), ("lr_scheduler", "category")):  # fmt: skip
        assert f'data-scale="{scale}" data-complete="4" data-pruned="1" data-drawn="1"' in \
            charts[name], (name, charts[name])  # fmt: skip
    assert dom.count("<canvas") == 6  # cart's curves chart, the best so far, four parameters
    assert tbody(dom) == tbody(served) and len(tbody(dom)) == 7  # refreshed, cell for cell
    assert 'class="sweep-summary">maximize eval over 10 trial(s)' in dom
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000

    # The store turns unreadable right after the page was served (its charts' boxes are on
    # it): each box says why, naming the file; the script stays quiet on the console.
    def corrupt_after_the_page(environ: dict[str, Any], start_response: Any) -> Any:
        body = b"".join(app(environ, start_response))
        if environ["PATH_INFO"] == "/":
            fx.store.write_bytes(b"garbage" * 100)
        return [body]

    with serving(corrupt_after_the_page) as base:
        broken = chromium(f"--user-data-dir={tmp_path / 'profile2'}",
                          "--virtual-time-budget=4000", "--dump-dom", base + "/")  # fmt: skip
    assert not console(broken), console(broken)
    boxes = re.findall(r'<div class="sweep-chart[^>]*>([^<]*)</div>', broken.stdout)
    assert len(boxes) == 5, boxes
    assert all(b.startswith("cannot load the sweep (cannot read sweep 'cart': ") for b in boxes)
    assert all(str(fx.store) in b and "unreadable" in b for b in boxes), boxes
