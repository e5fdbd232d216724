"""A supervisor's start catches up on what its predecessor's workers reported and it never
recorded (it died between the heartbeat and the event): real SQLite, real heartbeat files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from supervisor.config import Config
from supervisor.ledger import db
from supervisor.lifecycle.liveness import Reported, new_reports, reported_from_events
from supervisor.lifecycle.startup import stop_leftover_workers, unrecorded_reports
from supervisor.sdnotify import Notifier
from training.protocol import HEARTBEAT_FILE, PARENT_PID_ENV, RUN_DIR_ENV, Heartbeat

DAMAGE = {
    "checkpoint": "ckpt-000000005120",
    "when": "load",
    "files": ["replay/frames-000002.bin"],
    "transitions_dropped": 512,
}


def _heartbeat(run: Path, pid: int, **kw: object) -> Heartbeat:
    hb = Heartbeat(
        seq=7, pid=pid, phase="training", phase_deadline_s=30.0, global_step=6000,
        total_steps=10**6, episodes=3, sps=100.0, mean_return=None, last_checkpoint_step=5120,
        resumed_from_step=5120, num_envs=4, batch_size=32, device="cpu", gpu_mem_mb=None,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    run.mkdir(parents=True, exist_ok=True)
    (run / HEARTBEAT_FILE).write_text(json.dumps(hb.to_json()))
    return hb


def test_reported_from_events_inverts_new_reports() -> None:
    hb = Heartbeat(
        seq=1, pid=41, phase="training", phase_deadline_s=30.0, global_step=1, total_steps=9,
        episodes=0, sps=0.0, mean_return=None, last_checkpoint_step=None, resumed_from_step=None,
        num_envs=1, batch_size=1, device="cpu", gpu_mem_mb=None, quarantined=["ckpt-1 (bad)"],
        checkpoint_failures=2, replay_damage=[DAMAGE], write_failures={"progress": 3},
        checkpoint_sync_fallbacks=1, last_checkpoint_sync_fallback="needs 2 bytes",
    )  # fmt: skip
    first = new_reports(Reported(), hb)
    assert {k for k, _ in first} == {
        "checkpoint_corrupt", "checkpoint_failed", "replay_damaged", "write_failed",
        "checkpoint_sync_fallback",
    }  # fmt: skip
    [fallback] = [d for k, d in first if k == "checkpoint_sync_fallback"]
    assert fallback == {"reason": "needs 2 bytes", "step": 1, "fallbacks": 1, "pid": 41}
    assert all(d["pid"] == 41 for _, d in first), "each report names its worker"
    assert new_reports(reported_from_events(41, first), hb) == [], "all of them recorded"
    assert len(new_reports(reported_from_events(42, first), hb)) == 5, "another worker's"
    some = [(k, d) for k, d in first if k != "replay_damaged"]
    assert [k for k, _ in new_reports(reported_from_events(41, some), hb)] == ["replay_damaged"]


def test_start_records_a_report_the_dead_supervisor_never_did(tmp_path: Path) -> None:
    conn = db.connect(tmp_path, owner=True)
    run_dir = lambda g: tmp_path / "runs" / g  # noqa: E731
    with db.transaction(conn):
        db.upsert_worker(conn, "dqn", state="running", pid=41, pid_create_time=1.0)
        db.upsert_worker(conn, "ppo", state="running", pid=52, pid_create_time=1.0)
        db.upsert_worker(conn, "gone", state="running", pid=63, pid_create_time=1.0)
    _heartbeat(run_dir("dqn"), 41, replay_damage=[DAMAGE])
    _heartbeat(run_dir("ppo"), 99, replay_damage=[DAMAGE])  # a newer worker's: not ours
    rows = db.workers(conn)

    caught = unrecorded_reports(conn, rows, run_dir)
    assert caught == [("dqn", "replay_damaged", {**DAMAGE, "pid": 41, "caught_up": True})]

    # Recorded once (by the dead supervisor, or by this catch-up): never again.
    for game, kind, detail in caught:
        with db.transaction(conn):
            db._add_event(conn, kind, game, detail, 2.0, 2.0)
    assert unrecorded_reports(conn, rows, run_dir) == []
    # A second damage report from the same worker is still new.
    _heartbeat(run_dir("dqn"), 41, replay_damage=[DAMAGE, {**DAMAGE, "when": "checkpoint"}])
    assert [d["when"] for _, _, d in unrecorded_reports(conn, rows, run_dir)] == ["checkpoint"]
    conn.close()


def test_every_evaluation_between_two_reads_of_the_heartbeat_is_an_event() -> None:
    """Two evaluations done between two reads of the heartbeat (a fast game, a busy host):
    each is an `evaluation` event, from the heartbeat's recent `evals`, none twice."""
    ev = lambda step: {"step": step, "mean": step / 100, "episodes": 3, "seconds": 0.2,  # noqa: E731
                       "time": 1.0e9 + step}  # fmt: skip
    hb = Heartbeat(
        seq=1, pid=41, phase="training", phase_deadline_s=30.0, global_step=6200,
        total_steps=9000, episodes=0, sps=0.0, mean_return=None, last_checkpoint_step=None,
        resumed_from_step=None, num_envs=1, batch_size=1, device="cpu", gpu_mem_mb=None,
        eval=ev(6144), evals=[ev(2048), ev(4096), ev(6144)],
    )  # fmt: skip
    seen = Reported(evaluations={2048})  # the first was read at the last look
    got = new_reports(seen, hb)
    assert [(k, d["step"]) for k, d in got] == [("evaluation", 4096), ("evaluation", 6144)]
    assert got[0][1]["mean"] == 40.96 and got[0][1]["seconds"] == 0.2
    assert new_reports(seen, hb) == []
    assert new_reports(reported_from_events(41, got), hb)[0][1]["step"] == 2048
    # The heartbeat round-trips the list (the worker writes it, the supervisor reads it).
    assert Heartbeat.from_json(hb.to_json()).evals == hb.evals


# ---- workers no row names -------------------------------------------------------------------


def _sleeper(argv_tail: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A real process whose command line (or environment) is a worker's; it only sleeps."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", *argv_tail],
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


@pytest.mark.e2e
def test_a_worker_started_just_before_the_supervisor_died_is_stopped_though_no_row_names_it(
    tmp_path: Path,
) -> None:
    """The spare handed a game (or a cold spawn) an instant before the supervisor was killed,
    its row still waiting for a locked database: the next supervisor found no row, started the
    game again, and two workers of one game ran at once (the soak saw it). Now every process
    that is a worker of this state directory's games is stopped before anything starts, and
    nothing else is."""
    state = tmp_path / "state"
    runs = state / "runs"
    worker = _sleeper(["-m", "training.worker", "--run-dir", str(runs / "dqn")])
    command = _sleeper([], {PARENT_PID_ENV: "1", RUN_DIR_ENV: str(runs / "byo")})
    stranger = _sleeper(["-m", "training.worker", "--run-dir", str(tmp_path / "other" / "g")])
    standby = _sleeper(["-m", "training.worker", "--standby"])
    try:
        time.sleep(0.3)  # the interpreters are up, their command lines as given
        cfg = cast(Config, SimpleNamespace(state_dir=state, stop_grace_s=5.0))
        stopped = stop_leftover_workers([], cfg, Notifier({}))
        assert sorted(stopped) == sorted([worker.pid, command.pid])
        assert worker.wait(10) is not None and command.wait(10) is not None
        assert stranger.poll() is None and standby.poll() is None, "not ours: left alone"
    finally:
        for p in (worker, command, stranger, standby):
            p.kill()
            p.wait()
