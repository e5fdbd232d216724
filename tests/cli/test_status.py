"""`rlsup status` against a real state database written with the contract's schema."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, Cli

from harness.state_fixture import GameFixture, StateFixture, build_state

pytestmark = pytest.mark.e2e

GAME_FIELDS = {
    "name",
    "state",
    "pid",
    "mode",
    "num_envs",
    "batch_size",
    "global_step",
    "total_steps",
    "episodes",
    "sps",
    "episodes_per_hour",
    "mean_return",
    "last_checkpoint_step",
    "last_checkpoint_age_s",
    "restarts",
    "eta_s",
}


# The fixture's supervisor runs and one of its games is FATAL: `rlsup status` exits 4.
EXIT_FATAL_GAME, EXIT_NOT_RUNNING = 4, 3


def status_json(cli: Cli) -> dict:
    r = cli("status", "--json")
    assert r.returncode == EXIT_FATAL_GAME, r.stderr
    return json.loads(r.stdout)


def test_status_human_shows_host_mode_and_every_game(cli: Cli, state: StateFixture) -> None:
    r = cli("status")
    assert r.returncode == EXIT_FATAL_GAME, r.stderr
    out = r.stdout
    assert "supervisor  running" in out
    assert "unexpected reboots 24h 0 / 7d 1" in out
    assert "GPU0 8.9/24.0G 93% 71C" in out
    assert "all games: light (auto" in out and "2 worker_oom in 1h" in out
    for g in state.games:
        assert g.name in out
    assert "FATAL" in out and "restart budget spent" in out
    assert "RuntimeError: boom" in out  # the fatal game's error.json
    assert "cost" in out and "spent" in out


def test_status_json_has_the_documented_schema(cli: Cli, state: StateFixture) -> None:
    doc = status_json(cli)
    assert {"host", "mode", "games", "supervisor", "cost", "schema"} <= set(doc)
    assert [g["name"] for g in doc["games"]] == [g.name for g in state.games]
    for g in doc["games"]:
        assert set(g) >= GAME_FIELDS, GAME_FIELDS - set(g)
    pong = doc["games"][0]
    assert pong["state"] == "running" and pong["pid"] == os.getpid()
    assert pong["global_step"] == 1_000_000 and pong["total_steps"] == 10_000_000
    assert pong["sps"] == 500.0 and pong["eta_s"] == 9_000_000 / 500.0
    assert pong["last_checkpoint_step"] == 980_000
    assert 235 <= pong["last_checkpoint_age_s"] <= 300
    assert pong["episodes_per_hour"] > 0 and pong["mean_return"] == 12.5
    assert doc["games"][3]["state"] == "done" and doc["games"][3]["percent"] == 100.0
    assert doc["games"][4]["state"] == "waiting" and doc["games"][4]["eta_s"] is None
    assert doc["host"]["unexpected_reboots_7d"] == 1
    assert doc["host"]["unexpected_reboots_24h"] == 0
    assert doc["host"]["mtbf_s"] is not None
    assert doc["mode"]["scopes"][0]["mode"] == "light"
    assert doc["mode"]["last_decision"]["kind"] == "scale_down"
    assert doc["cost"]["spent"] > 0 and doc["cost"]["projected_total"] > doc["cost"]["spent"]


def test_the_document_is_exactly_its_typed_records_and_the_readme_lists_them(
    cli: Cli, state: StateFixture
) -> None:
    """Every record of status_schema.py is the document's shape, field for field, and the
    field lists of docs/observability.md name only fields that exist."""
    from typing import get_type_hints

    from supervisor.observe import schema

    doc = status_json(cli)

    def keys(record: type) -> set[str]:
        return set(get_type_hints(record))

    assert set(doc) == keys(schema.StatusDoc)
    assert set(doc["supervisor"]) == keys(schema.SupervisorDoc)
    assert set(doc["host"]) == keys(schema.HostDoc)
    assert set(doc["mode"]) == keys(schema.ModeDoc)
    assert all(set(s) == keys(schema.ScopeDoc) for s in doc["mode"]["scopes"])
    assert all(set(g) == keys(schema.GameDoc) for g in doc["games"])
    assert set(doc["cost"]) == keys(schema.CostDoc)
    readme = (REPO / "docs" / "observability.md").read_text()
    listed = readme[readme.index("`rlsup status --json` prints") :].split("; the full schema")[0]
    top, _, game = listed.partition("each game has")
    named = set(re.findall(r"`([a-z_]+)`", top)) - {"rlsup"}
    assert named and named <= keys(schema.StatusDoc), named - keys(schema.StatusDoc)
    game_fields = set(re.findall(r"`([a-z_]+)`", game))
    assert game_fields and game_fields <= keys(schema.GameDoc), game_fields - keys(schema.GameDoc)


def test_status_flags_a_stale_heartbeat(tmp_path: Path, cli: Cli) -> None:
    games = [GameFixture("pong", "running", 5000, 100000, pid=os.getpid(), heartbeat_age_s=300.0)]
    fx = build_state(tmp_path / "stale", games=games, n_events=10)
    r = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "status", "--config", str(fx.config)],
        cwd=REPO,
        env=fx.env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "pong: heartbeat stale" in r.stdout and "running!" in r.stdout


def test_status_shows_a_dead_supervisor(tmp_path: Path) -> None:
    fx = build_state(tmp_path / "dead", n_games=2, n_events=10, supervisor_alive=False)
    r = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "status", "--json", "--config", str(fx.config)],
        cwd=REPO,
        env=fx.env(),
        capture_output=True,
        text=True,
    )
    assert json.loads(r.stdout)["supervisor"]["state"] == "stopped"
    assert r.returncode == EXIT_NOT_RUNNING  # with a FATAL game too: not running comes first
    r = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "status", "--config", str(fx.config)],
        cwd=REPO,
        env=fx.env(),
        capture_output=True,
        text=True,
    )
    assert "NOT RUNNING" in r.stdout and "rlsup run --config" in r.stdout


def test_status_without_a_database_says_how_to_start(tmp_path: Path) -> None:
    fx = build_state(tmp_path / "fresh", n_games=2, with_db=False)
    r = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "status", "--config", str(fx.config)],
        cwd=REPO,
        env=fx.env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == EXIT_NOT_RUNNING, r.stderr
    assert "rlsup run" in r.stdout and "rlsup init" in r.stdout
    assert not fx.db.exists()


def test_status_prefers_the_live_heartbeat_file(cli: Cli, state: StateFixture) -> None:
    hb_path = state.state_dir / "runs" / "pong" / "heartbeat.json"
    hb = json.loads(hb_path.read_text())
    hb.update(global_step=1_234_567, time=time.time())
    hb_path.write_text(json.dumps(hb))
    assert status_json(cli)["games"][0]["global_step"] == 1_234_567


def test_status_never_writes_the_database(cli: Cli, state: StateFixture) -> None:
    before = hashlib.sha256(state.db.read_bytes()).hexdigest()
    assert cli("status").returncode == EXIT_FATAL_GAME
    assert hashlib.sha256(state.db.read_bytes()).hexdigest() == before


def test_status_watch_redraws_until_interrupted(state: StateFixture) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor.cli",
            "status",
            "--watch",
            "0.2",
            "--config",
            str(state.config),
        ],
        cwd=REPO,
        env=state.env(),
        stdout=subprocess.PIPE,
        text=True,
        # An operator's Ctrl-C: SIGINT at its default. A test run started in the background
        # of a non-interactive shell (`make test &`) inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler: the watch would never see the signal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Interrupt only once it draws (a cold interpreter on a fresh venv can take seconds to
    # import): a SIGINT during start-up tests Python's start-up, not the watch loop.
    assert proc.stdout is not None
    seen, deadline = [], time.monotonic() + 60
    while sum("supervisor  running" in line for line in seen) < 2:
        assert time.monotonic() < deadline, "status --watch drew fewer than two frames"
        seen.append(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "".join(seen).count("supervisor  running") >= 2


def test_status_bad_config_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    r = cli("status", "--config", str(tmp_path / "missing.toml"), config=False)
    assert r.returncode == 2 and "no configuration file" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("state_dir = 3\n")
    r = cli("status", "--config", str(bad), config=False)
    assert r.returncode == 2 and "bad.toml" in r.stderr
    r = cli("status", "--watch", "0")
    assert r.returncode == 2


def test_status_loads_no_torch_numpy_or_envpool(state: StateFixture) -> None:
    code = (
        "import sys, contextlib, io\n"
        "from supervisor import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = cli.main(['status', '--config', {str(state.config)!r}])\n"
        "    rc2 = cli.main(['status', '--json', '--config', "
        f"{str(state.config)!r}])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'numpy', 'envpool', 'matplotlib', 'boto3', 'botocore'))\n"
        "print(rc, rc2, heavy)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=state.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "4 4 []"


def test_status_shows_each_games_device_and_last_evaluation(cli: Cli, state: StateFixture) -> None:
    """`device` from the heartbeat; `eval_return`/`eval_step` from the heartbeat's newest
    evaluation, else the eval.json an earlier worker left (a restarted worker has none yet)."""
    run = state.state_dir / "runs"
    hb_path = run / "pong" / "heartbeat.json"
    hb = json.loads(hb_path.read_text())
    hb.update(device="cuda:1", eval={"mean": 17.5, "step": 900_000}, time=time.time())
    hb_path.write_text(json.dumps(hb))
    second = state.games[1].name
    (run / second / "eval.json").write_text(json.dumps({"mean": -3.25, "step": 40_000}))
    games = {g["name"]: g for g in status_json(cli)["games"]}
    assert games["pong"]["device"] == "cuda:1"
    assert (games["pong"]["eval_return"], games["pong"]["eval_step"]) == (17.5, 900_000)
    assert (games[second]["eval_return"], games[second]["eval_step"]) == (-3.25, 40_000)
    last = state.games[-1].name
    assert games[last]["eval_return"] is None and games[last]["eval_step"] is None
    out = cli("status").stdout
    for cell in ("DEVICE", "cuda:1", "17.5@900.0k", "-3.2@40.0k"):
        assert cell in out, out


def test_status_exits_0_with_the_supervisor_running_and_no_game_fatal(tmp_path: Path) -> None:
    games = [GameFixture("pong", "running", 5000, 100000, pid=os.getpid())]
    fx = build_state(tmp_path / "ok", games=games, n_events=5)
    r = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "status", "--config", str(fx.config)],
        cwd=REPO,
        env=fx.env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_episodes_per_hour_uses_the_last_hour_of_one_resume_segment() -> None:
    from supervisor.observe.status import episodes_per_hour

    def rows(points: list[tuple[float, float]]) -> list[dict[str, str]]:
        return [{"time": str(t), "episodes": str(e)} for t, e in points]

    hour = 3600.0
    # 2 h of rows, 100 episodes every 60 s: the rate over the last hour is 6,000/h.
    steady = rows([(i * 60.0, i * 100.0) for i in range(121)])
    assert episodes_per_hour(steady, 2 * hour) == 6000.0
    # A resume reset the counter 10 min ago: only the segment since then counts.
    reset = rows(
        [(i * 60.0, 5000.0 + i) for i in range(50)]
        + [(3000 + i * 60.0, i * 20.0) for i in range(11)]
    )
    assert episodes_per_hour(reset, 3600.0) == 1200.0
    assert episodes_per_hour(rows([(0.0, 1.0)]), 0.0) is None  # one point: no rate
    assert episodes_per_hour(rows([(0.0, 1.0), (5.0, 9.0)]), 5.0) is None  # under 10 s
    assert episodes_per_hour([{"time": "", "episodes": "3"}], 0.0) is None
