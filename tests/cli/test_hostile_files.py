"""Hostile run-dir files: every number rlsup reads from disk is validated where it is read.

A worker, a user's script or anyone with access to the state dir can leave a value rlsup cannot
convert (`json.dump(float("inf"))` writes `Infinity`). Over the matrix file x bad value x
command: no traceback, the documented exit code, the bad field shown as `-` and named (file and
key) on stderr; the dashboard answers 200; the metrics collector goes on.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import wsgiref.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.state_fixture import StateFixture, build_state

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GAME = "pong"  # running, with a heartbeat and progress rows
FATAL = "enduro"  # fatal: its error.json is shown


def _json(state: StateFixture, game: str, name: str, edit: Callable[[Any], Any]) -> None:
    path = state.state_dir / "runs" / game / name
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(edit(old)))  # json.dumps writes Infinity / NaN as Python does


def _set(**bad: Any) -> Callable[[Any], Any]:
    return lambda d: {**d, **bad}


def _accounting(edit: Callable[[dict[str, Any]], None]) -> Callable[[StateFixture], None]:
    def apply(state: StateFixture) -> None:
        path = state.state_dir / "accounting.json"
        doc = json.loads(path.read_text())
        edit(doc)
        path.write_text(json.dumps(doc))

    return apply


def _progress_last_row(cells: dict[str, str]) -> Callable[[StateFixture], None]:
    def apply(state: StateFixture) -> None:
        run_dir = state.state_dir / "runs" / GAME
        (run_dir / "heartbeat.json").unlink()  # no heartbeat: the last row is read instead
        with sqlite3.connect(state.db) as conn:
            conn.execute("UPDATE workers SET heartbeat = NULL WHERE game = ?", (GAME,))
        conn.close()
        lines = (run_dir / "progress.csv").read_text().splitlines()
        names = lines[0].split(",")
        row = dict(zip(names, lines[-1].split(","), strict=True)) | cells
        lines.append(",".join(row[n] for n in names))
        (run_dir / "progress.csv").write_text("\n".join(lines) + "\n")

    return apply


def _del_time_key(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc["games"][GAME]["time"].pop(key)


def _set_time_key(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc["games"][GAME]["time"].__setitem__(key, value)


INF, NAN = float("inf"), float("nan")

# case id -> (the file, the key named in the warning, the corruption)
CASES: dict[str, tuple[str, str, Callable[[StateFixture], None]]] = {
    "eval-step-inf": ("eval.json", "step",
                      lambda s: _json(s, GAME, "eval.json", _set(mean=20.5, step=INF))),
    "eval-step-nan": ("eval.json", "step",
                      lambda s: _json(s, GAME, "eval.json", _set(mean=20.5, step=NAN))),
    "eval-mean-inf": ("eval.json", "mean",
                      lambda s: _json(s, GAME, "eval.json", _set(mean=INF, step=5))),
    "eval-step-text": ("eval.json", "step",
                       lambda s: _json(s, GAME, "eval.json", _set(mean=1.0, step="abc"))),
    "heartbeat-step-text": ("heartbeat.json", "global_step",
                            lambda s: _json(s, GAME, "heartbeat.json", _set(global_step="abc"))),
    "heartbeat-step-inf": ("heartbeat.json", "global_step",
                           lambda s: _json(s, GAME, "heartbeat.json", _set(global_step=INF))),
    "heartbeat-time-text": ("heartbeat.json", "time",
                            lambda s: _json(s, GAME, "heartbeat.json", _set(time="abc"))),
    "heartbeat-sps-nan": ("heartbeat.json", "sps",
                          lambda s: _json(s, GAME, "heartbeat.json", _set(sps=NAN))),
    "heartbeat-total-text": ("heartbeat.json", "total_steps",
                             lambda s: _json(s, GAME, "heartbeat.json", _set(total_steps="x"))),
    "heartbeat-episodes-inf": ("heartbeat.json", "episodes",
                               lambda s: _json(s, GAME, "heartbeat.json", _set(episodes=INF))),
    "heartbeat-return-nan": ("heartbeat.json", "mean_return",
                             lambda s: _json(s, GAME, "heartbeat.json", _set(mean_return=NAN))),
    "heartbeat-ckpt-time-text": (
        "heartbeat.json", "last_checkpoint_time",
        lambda s: _json(s, GAME, "heartbeat.json", _set(last_checkpoint_time="abc")),
    ),
    "heartbeat-ckpt-step-inf": (
        "heartbeat.json", "last_checkpoint_step",
        lambda s: _json(s, GAME, "heartbeat.json", _set(last_checkpoint_step=INF,
                                                        last_checkpoint_time=None)),
    ),
    "heartbeat-eval-step-inf": (
        "heartbeat.json", "eval.step",
        lambda s: _json(s, GAME, "heartbeat.json", _set(eval={"mean": 3.0, "step": INF})),
    ),
    "heartbeat-num-envs-text": ("heartbeat.json", "num_envs",
                                lambda s: _json(s, GAME, "heartbeat.json", _set(num_envs="8"))),
    "heartbeat-pid-text": ("heartbeat.json", "pid",
                           lambda s: _json(s, GAME, "heartbeat.json", _set(pid="me"))),
    "progress-inf": ("progress.csv", "global_step",
                     _progress_last_row({"global_step": "inf", "mean_return": "nan"})),
    "progress-text": ("progress.csv", "global_step",
                      _progress_last_row({"global_step": "abc", "sps": "fast", "time": "x"})),
    "progress-time-huge": ("progress.csv", "mean_return",
                           _progress_last_row({"time": "1e300", "mean_return": "-inf"})),
    "error-step-inf": ("error.json", "step",
                       lambda s: _json(s, FATAL, "error.json", _set(step=INF))),
    "error-message-number": ("error.json", "message",
                             lambda s: _json(s, FATAL, "error.json", _set(message=123, kind=[1]))),
    "accounting-entry-text": ("accounting.json", GAME,
                              _accounting(lambda d: d["games"].__setitem__(GAME, "x"))),
    "accounting-no-time": ("accounting.json", GAME,
                           _accounting(lambda d: d["games"][GAME].pop("time"))),
    "accounting-missing-wall": ("accounting.json", "wall_s", _accounting(_del_time_key("wall_s"))),
    "accounting-text-seconds": ("accounting.json", "training_s",
                                _accounting(_set_time_key("training_s", "abc"))),
    "accounting-nan-lost": ("accounting.json", "lost_s",
                            _accounting(_set_time_key("lost_s", NAN))),
}  # fmt: skip

COMMANDS: dict[str, list[str]] = {
    "status": ["status"],
    "status-json": ["status", "--json"],
    "results": ["results"],
    "results-json": ["results", "--json"],
    "report": ["report"],
    "report-json": ["report", "--json"],
}
# The commands that read each file (and so must name what they could not use).
READERS = {
    "eval.json": ("status", "status-json", "results", "results-json"),
    "heartbeat.json": ("status", "status-json", "results", "results-json"),
    "progress.csv": ("status", "status-json", "results", "results-json"),
    "error.json": ("status", "status-json"),
    "accounting.json": ("status", "status-json"),
}

_built: dict[str, StateFixture] = {}


@pytest.fixture
def hostile(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One state dir per case, corrupted once (the commands only read it)."""

    def get(case: str) -> StateFixture:
        if case not in _built:
            root = tmp_path_factory.mktemp(case)
            state = build_state(root / "site", n_games=6, n_events=300, cost_per_hour=0.9)
            CASES[case][2](state)
            _built[case] = state
        return _built[case]

    return get


def _cli(state: StateFixture, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args, "--config", str(state.config)],
        cwd=REPO, env=state.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_value_is_shown_as_unknown_never_a_traceback(
    hostile: Callable[[str], StateFixture], case: str, command: str
) -> None:
    state = hostile(case)
    filename, key, _ = CASES[case]
    done = _cli(state, *COMMANDS[command])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if command.startswith("status"):
        # The fixture's supervisor (this process) runs and one game is FATAL: 4, as unharmed.
        assert done.returncode == 4, (done.returncode, done.stderr[-2000:])
    else:
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    if command.endswith("json"):
        json.loads(done.stdout, parse_constant=_refuse)  # strict JSON: no NaN, no Infinity
    if command in READERS[filename]:
        warned = [ln for ln in done.stderr.splitlines() if filename in ln and f"{key} = " in ln]
        assert len(warned) == 1, done.stderr


def _refuse(name: str) -> None:
    raise AssertionError(f"{name} in a --json document")


def _get(app: Any, path: str) -> tuple[str, bytes]:
    route, _, query = path.partition("?")
    environ: dict[str, Any] = {"REQUEST_METHOD": "GET", "PATH_INFO": route,
                               "QUERY_STRING": query, "HTTP_HOST": "127.0.0.1"}  # fmt: skip
    wsgiref.util.setup_testing_defaults(environ)
    got: list[str] = []
    body = b"".join(app(environ, lambda status, headers: got.append(status)))
    return got[0], body


@pytest.mark.parametrize("case", list(CASES))
def test_the_dashboard_and_the_metrics_survive_a_hostile_value(
    hostile: Callable[[str], StateFixture], case: str
) -> None:
    from supervisor.config import load_config
    from supervisor.observe.dashboard import Dashboard
    from supervisor.observe.metrics import MetricsExporter

    state = hostile(case)
    cfg = load_config(state.config)
    app = Dashboard(cfg, status_ttl_s=0.0)
    for path in ("/", "/api/status", "/api/results", f"/api/progress?game={GAME}"):
        status, body = _get(app, path)
        assert status.startswith("200"), (path, status, body[:500])
        if path.startswith("/api/"):
            json.loads(body, parse_constant=_refuse)
    ex = MetricsExporter(cfg)
    ex.refresh()
    ex.refresh()
    assert ex.drain() == []  # nothing failed: the bad field is left out, the rest exported


def test_a_bad_field_is_reported_once_per_file_and_key(
    hostile: Callable[[str], StateFixture], capsys: pytest.CaptureFixture[str]
) -> None:
    from supervisor.config import load_config
    from supervisor.observe import fields
    from supervisor.observe.status import collect

    state = hostile("eval-step-inf")
    cfg = load_config(state.config)
    fields.forget_reported()
    capsys.readouterr()
    for _ in range(3):  # three ticks of a metrics thread, a dashboard or `status --watch`
        doc = collect(cfg, state.now)
    err = capsys.readouterr().err
    assert err.count("eval.json") == 1, err
    assert "step" in err
    pong = next(g for g in doc["games"] if g["name"] == GAME)
    assert pong["eval_return"] == 20.5 and pong["eval_step"] is None


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("progress-")])
def test_plot_draws_past_a_hostile_progress_row(
    hostile: Callable[[str], StateFixture], case: str, tmp_path: Path
) -> None:
    state = hostile(case)
    out = tmp_path / "plot.png"
    done = _cli(state, "plot", "--out", str(out))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert out.stat().st_size > 0


RUN_CONFIG = """\
state_dir = "state"
tick_s = 0.1
[metrics]
textfile = "{textfile}"
interval_s = 0.3
[modes.light]
num_envs = 1
batch_size = 1
n_steps = 1
max_concurrent = 1
[[games]]
name = "mine"
command = {command}
device = "cpu"
"""


def test_rlsup_run_with_metrics_starts_and_keeps_exporting_over_hostile_files(
    tmp_path: Path,
) -> None:
    """`[metrics]` reads every run dir at start-up: a file it cannot convert was `rlsup run`
    exiting 1 (a systemd restart loop), and at run time a metrics thread dead in silence."""
    from harness.runs import env_for, start_supervisor, stop_supervisor, wait_for

    textfile = tmp_path / "rlsup.prom"
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(120)\n")
    config = tmp_path / "rlsup.toml"
    command = json.dumps([sys.executable, str(script)])
    config.write_text(RUN_CONFIG.format(textfile=textfile, command=command))
    run_dir = tmp_path / "state" / "runs" / "mine"
    run_dir.mkdir(parents=True, mode=0o700)
    (run_dir / "eval.json").write_text(json.dumps({"mean": 1.0, "step": INF}))
    log = tmp_path / "supervisor.log"
    sup = start_supervisor(config, env_for(tmp_path), log=log)
    try:
        wait_for(lambda: textfile.exists(), 30, "the first metrics textfile")

        def updated() -> float:
            line = next(ln for ln in textfile.read_text().splitlines()
                        if ln.startswith("rlsup_metrics_updated_timestamp_seconds "))  # fmt: skip
            return float(line.split()[1])

        first = updated()
        wait_for(lambda: updated() > first + 0.5, 30, "the metrics thread to go on refreshing")
        assert sup.poll() is None, log.read_text()[-3000:]
        (run_dir / "eval.json").write_text(json.dumps({"mean": NAN, "step": 7}))  # at run time
        again = updated()
        wait_for(lambda: updated() > again + 0.5, 30, "refreshes past a new hostile value")
        assert "rlsup_game_eval_return" not in {
            ln.split("{")[0] for ln in textfile.read_text().splitlines() if 'game="mine"' in ln
        }
    finally:
        stop_supervisor(sup)
    text = log.read_text()
    assert "Traceback" not in text and "metrics_failed" not in text, text[-3000:]
    reports = [ln for ln in text.splitlines() if "unusable_value" in ln and "eval.json" in ln]
    assert len(reports) == 2, reports  # step, then mean: each once, not once a refresh
