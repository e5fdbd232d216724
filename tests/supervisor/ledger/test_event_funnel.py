"""One funnel for events: every event kind reaches the ledger through the Recorder, so its
`[[hooks]]` fire. The mode changes the stability policy decides, an operator's pin (`rlsup
scale` writes the wish; the supervisor records `mode_pinned` when it reads it) and the state
database's outage, each driven through an in-process supervisor with a real SQLite file and
real hook programs; and a check of the source tree that nothing else writes events."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.runs import REPO, FakeNvml, close_supervisors, spin
from supervisor.cli import main
from supervisor.config import load_config
from supervisor.daemon import Supervisor
from supervisor.launch.launcher import Launcher
from supervisor.ledger import db
from supervisor.lifecycle.states import WorkerState as S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

RECORD = """\
import json, sys
event = json.load(sys.stdin)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(event) + "\\n")
"""

CONFIG = """\
state_dir = "state"
stop_grace_s = 5
tick_s = 0.05
initial_mode = "heavy"
[modes.light]
num_envs = 2
batch_size = 2
n_steps = 4
max_concurrent = 4
[modes.heavy]
num_envs = 4
batch_size = 4
n_steps = 4
max_concurrent = 4
[[games]]
name = "a"
env_id = "CartPole-v1"
total_steps = 1000000000
[restart]
backoff_base_s = 0.05
backoff_max_s = 0.1
budget = 5
budget_window_s = 60
[stability]
cooldown_s = 1
calm_s = 3600
[[hooks]]
on = ["scale_down", "scale_up", "mode_pinned", "state_db_unavailable"]
command = ["{python}", "{record}", "{out}"]
"""


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Supervisor]]:
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    (tmp_path / "record.py").write_text(RECORD)
    config = CONFIG.format(
        python=sys.executable, record=tmp_path / "record.py", out=tmp_path / "hooks.jsonl"
    )
    (tmp_path / "rlsup.toml").write_text(config)
    made: list[Supervisor] = []

    def factory(**kw: Any) -> Supervisor:
        sup = Supervisor(
            load_config(tmp_path / "rlsup.toml"),
            launcher=Launcher(python=sys.executable, module="tests.supervisor.fake_worker"),
            cores=2,
            gpu_probe=FakeNvml(None),
            **kw,
        )
        sup.start()
        made.append(sup)
        return sup

    yield factory
    close_supervisors(made)


def alerts(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    path = tmp_path / "hooks.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def evs(sup: Supervisor, kind: str) -> list[db.Event]:
    sup.on.journal.flush(force=True)
    return db.events(sup.on.conn, kind=kind)


def test_a_step_down_the_policy_decides_fires_its_hook(
    make: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make(policy="default")
    run = sup.cfg.run_dir("a")
    run.mkdir(parents=True, exist_ok=True)
    (run / "fake.json").write_text(json.dumps({"oom_above_envs": 2}))  # OOMs at heavy only
    spin(sup, lambda: bool(alerts(tmp_path, "scale_down")), timeout=30)
    [alert] = alerts(tmp_path, "scale_down")
    [down] = evs(sup, "scale_down")
    assert alert["game"] == "a" == down.game and alert["detail"] == down.detail
    assert (down.detail["from"], down.detail["to"]) == ("heavy", "light")
    assert down.mono is not None, "the policy's clock, as incident windows need"
    assert db.get_mode(sup.on.conn, "a")[0] == "light"  # type: ignore[index]


def test_an_operators_pin_is_recorded_once_by_the_supervisor_and_fires_its_hook(
    make: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make(policy=None)
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    config = str(tmp_path / "rlsup.toml")
    assert main(["scale", "--mode", "light", "--game", "a", "--config", config]) == 0
    spin(sup, lambda: bool(alerts(tmp_path, "mode_pinned")), timeout=30)
    [alert] = alerts(tmp_path, "mode_pinned")
    assert alert["game"] == "a"
    assert alert["detail"] == {"scope": "a", "mode": "light", "pinned": True}
    for _ in range(10):
        sup.safe_tick()
    [pinned] = evs(sup, "mode_pinned")  # the supervisor's, once; none from the CLI
    assert pinned.detail == alert["detail"]


def test_a_pin_written_while_no_supervisor_runs_is_recorded_at_its_next_start_once(
    make: Callable[..., Supervisor], tmp_path: Path
) -> None:
    config = str(tmp_path / "rlsup.toml")
    assert main(["scale", "--mode", "light", "--config", config]) == 0
    with db.connect(tmp_path / "state") as conn:
        assert db.events(conn, kind="mode_pinned") == [], "the CLI writes the wish only"
    sup = make(policy=None)
    spin(sup, lambda: bool(evs(sup, "mode_pinned")))
    close_supervisors([sup])
    sup = make(policy=None)  # a restart reads the same wish: already recorded
    for _ in range(10):
        sup.safe_tick()
    [pinned] = evs(sup, "mode_pinned")
    assert pinned.detail == {"scope": "*", "mode": "light", "pinned": True}
    assert main(["scale", "--mode", "auto", "--config", config]) == 0
    spin(sup, lambda: len(evs(sup, "mode_pinned")) == 2)


def test_the_state_databases_outage_fires_its_hook(
    make: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make(policy=None)
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    locker = sqlite3.connect(sup.cfg.state_dir / db.DB_NAME, isolation_level=None)
    try:
        locker.execute("BEGIN EXCLUSIVE")  # an operator's sqlite3 shell, say
        spin(sup, lambda: not sup.on.journal.healthy)
        time.sleep(0.3)
    finally:
        locker.execute("COMMIT")
        locker.close()
    spin(sup, lambda: bool(alerts(tmp_path, "state_db_unavailable")), timeout=40)
    [alert] = alerts(tmp_path, "state_db_unavailable")
    [outage] = evs(sup, "state_db_unavailable")
    assert alert["detail"] == outage.detail and outage.detail["writes_waited"] >= 1
    assert "locked" in outage.detail["error"]


# Where the product may write an event: the ledger's own modules (db.py defines the private
# `_add_event`, the Recorder is the one funnel that calls it). Tests and benchmarks build
# ledgers of their own.
_EVENT_WRITERS = {"supervisor/ledger/db.py", "supervisor/ledger/recorder.py"}
# The ledger's add_event (or SQL into its events table). TensorBoard's
# `EventFileWriter.add_event(Event(...))` (supervisor/tracking/sinks.py) writes a TensorBoard
# record, no ledger event: a call whose argument is an `Event(` proto is not counted.
_WRITES_EVENTS = re.compile(r"\b_?add_event\b(?!\(Event\()|INSERT\s+INTO\s+events\b", re.IGNORECASE)


def test_nothing_but_the_recorder_writes_events() -> None:
    """Hooks fire for what the Recorder records: an event written any other way is an event
    no alert ever hears of (as scale_down, mode_pinned and state_db_unavailable were)."""
    writers = set()
    for package in ("supervisor", "training", "checkpoints", "rlsup"):
        for path in (REPO / package).rglob("*.py"):
            if _WRITES_EVENTS.search(path.read_text(errors="replace")):
                writers.add(str(path.relative_to(REPO)))
    assert writers <= _EVENT_WRITERS, sorted(writers - _EVENT_WRITERS)
