"""`rlsup stop` through the state database (an operator who may not signal the service): a
request is fresh when it was written after this supervisor started, whatever the wall clock
did in between. Real SQLite, real stand-in workers; only the supervisor's wall clock is set."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.runs import FAST_LIGHT_HEAD, REPO, FakeNvml, close_supervisors, spin
from supervisor.config import load_config
from supervisor.daemon import Supervisor
from supervisor.launch.launcher import Launcher
from supervisor.ledger import db
from supervisor.lifecycle.states import WorkerState as S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

CONFIG = (
    FAST_LIGHT_HEAD
    + """\
max_concurrent = 1
[[games]]
name = "a"
env_id = "CartPole-v1"
total_steps = 100000
device = "cpu"
"""
)
HOUR = 3600.0


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Supervisor]]:
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    (tmp_path / "rlsup.toml").write_text(CONFIG)
    made: list[Supervisor] = []

    def factory(wall: Callable[[], float] = time.time) -> Supervisor:
        launcher = Launcher(python=sys.executable, module="tests.supervisor.fake_worker")
        sup = Supervisor(
            load_config(tmp_path / "rlsup.toml"),
            launcher=launcher,
            cores=2,
            wall=wall,
            exit_when_done=True,
            gpu_probe=FakeNvml(None),
            policy=None,
        )
        sup.start()
        made.append(sup)
        return sup

    yield factory
    close_supervisors(made)


def ask_to_stop(state_dir: Path, at: float) -> None:
    """What `rlsup stop` writes when it may not signal the supervisor (its wall clock `at`)."""
    conn = db.connect(state_dir, create=False)
    try:
        with db.transaction(conn):
            db.request(conn, db.STOP_REQUEST, "uid 1000 (alice)", at)
    finally:
        conn.close()


def test_a_stop_request_after_a_backward_wall_clock_step_still_stops(
    make: Callable[..., Supervisor],
) -> None:
    # The host's clock ran an hour fast when the supervisor started; NTP then stepped it back,
    # so the operator's request carries a wall time an hour before the supervisor's start.
    sup = make(wall=lambda: time.time() + HOUR)
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    ask_to_stop(sup.cfg.state_dir, time.time())
    spin(sup, lambda: sup.finished)
    assert sup.games["a"].state is S.STOPPED and sup.on.conn is not None
    assert db.pending_request(sup.on.conn, db.STOP_REQUEST) is None, "consumed"


def test_a_request_left_from_before_the_supervisor_started_is_dropped_whatever_its_time(
    make: Callable[..., Supervisor], tmp_path: Path
) -> None:
    # Written for a predecessor that died before reading it, by a clock an hour fast: stale
    # although its wall time lies after this supervisor's start.
    conn = db.connect(tmp_path / "state")
    conn.close()
    ask_to_stop(tmp_path / "state", time.time() + HOUR)
    sup = make()
    assert sup.on.conn is not None
    assert db.pending_request(sup.on.conn, db.STOP_REQUEST) is None, "dropped at start"
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    for _ in range(5):
        sup.safe_tick()
    assert not sup.stopping
