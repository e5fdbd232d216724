"""The supervisor's side of a sweep (`SweepKeeper`) on a real state database and a real study:
evaluations reported when every seed has them, a pruned trial's runs ended, a failed run failing
its trial, a finished trial's value from its runs' eval.json, a successor keeper that finds a
trial ended but its runs not, and the lifecycle's route for a run its sweep ended."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import Config, load_config
from supervisor.ledger import db
from supervisor.lifecycle.exits import Route, StopReason, route_exit
from supervisor.lifecycle.restart import ExitKind
from supervisor.sweep.keeper import EndRun, SweepKeeper
from supervisor.sweep.study import Study
from tests.supervisor.config.test_config import GOOD
from tests.sweep.test_sweep_config import BUILTIN, HEAD

# The config tests' sweep, with five trials pruned once two are complete, over one parameter.
SWEEP = BUILTIN.replace("trials = 3", "trials = 5\nmin_trials = 2") + (
    "params = { learning_rate = { low = 1e-4, high = 1e-2, log = true } }\n"
)


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    path = tmp_path / "c.toml"
    path.write_text(HEAD + SWEEP)
    return load_config(path)


def evaluation(conn: Any, game: str, step: int, mean: float) -> None:
    detail = json.dumps({"step": step, "mean": mean, "episodes": 3, "pid": 1})
    conn.execute(
        "INSERT INTO events(ts, kind, game, detail) VALUES (?, 'evaluation', ?, ?)",
        (time.time(), game, detail),
    )
    conn.commit()


def final(cfg: Config, game: str, mean: float) -> None:
    run_dir = cfg.run_dir(game)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "eval.json").write_text(json.dumps({"step": 4096, "mean": mean, "episodes": 3}))


def states(cfg: Config, **by_run: str) -> dict[str, tuple[str, str]]:
    out = {g.name: ("waiting", "queued") for g in cfg.games}
    for run, state in by_run.items():
        out[run.replace("_", "/")] = (state, "crash: exit status 78" if state == "fatal" else "")
    return out


def start(cfg: Config, keeper: SweepKeeper, trial: int) -> dict[str, Any]:
    spec = keeper.assign(cfg.game(f"cart/t{trial:03d}/s1"))
    keeper.assign(cfg.game(f"cart/t{trial:03d}/s2"))
    return dict(spec.args)


def test_a_trial_runs_evaluations_feed_the_pruner_and_a_pruned_trial_ends_its_runs(
    cfg: Config,
) -> None:
    conn = db.connect(cfg.state_dir, owner=True)
    keeper = SweepKeeper(cfg, conn)
    keeper.start()
    ended: dict[str, str] = {}
    for n, (a, b) in enumerate(((50.0, 70.0), (60.0, 80.0))):
        args = start(cfg, keeper, n)
        assert 1e-4 <= args["learning_rate"] <= 1e-2 and args["eval_every_steps"] == 1024
        drawn = json.loads((cfg.run_dir(f"cart/t{n:03d}/s2") / "trial.json").read_text())
        assert drawn == {"sweep": "cart", "trial": n, "params": {"learning_rate": args[
            "learning_rate"]}}  # fmt: skip
        evaluation(conn, f"cart/t{n:03d}/s1", 1024, a)
        evaluation(conn, f"cart/t{n:03d}/s1", 1024, a + 999)  # redone after a crash: first kept
        evaluation(conn, f"cart/t{n:03d}/s2", 1024, b)
        final(cfg, f"cart/t{n:03d}/s1", a + 100)
        final(cfg, f"cart/t{n:03d}/s2", b + 100)
        ended |= {f"cart_t{n:03d}_s1": "done", f"cart_t{n:03d}_s2": "done"}
        step = keeper.step(states(cfg, **ended))
        [(kind, _, detail)] = step.events
        assert kind == "sweep_trial" and detail["state"] == "complete"
        assert detail["value"] == pytest.approx((a + b) / 2 + 100) and step.ends == []
    study = keeper.studies["cart"].study
    assert study.trials[0].intermediate_values == {0: 60.0}  # the seeds' mean at index 0

    # Trial 2 evaluates low on both seeds: pruned, its runs stopped (one alive, one waiting).
    start(cfg, keeper, 2)
    evaluation(conn, "cart/t002/s1", 1024, 1.0)
    step = keeper.step(states(cfg, **ended, cart_t002_s1="running"))
    assert step.events == [] and step.ends == []  # seed 2 has not evaluated yet
    evaluation(conn, "cart/t002/s2", 1024, 2.0)
    step = keeper.step(states(cfg, **ended, cart_t002_s1="running", cart_t002_s2="running"))
    [(kind, _, detail)] = step.events
    assert (detail["trial"], detail["state"], detail["value"]) == (2, "pruned", 1.5)
    assert "pruned at evaluation 0" in detail["message"]
    why = "sweep cart: trial 2 ended pruned"
    assert step.ends == [EndRun("cart/t002/s1", why), EndRun("cart/t002/s2", why)]

    # A successor (the supervisor died before the stops): the same ends, no second tell.
    successor = SweepKeeper(cfg, conn)
    successor.start()
    again = successor.step(states(cfg, **ended, cart_t002_s1="running", cart_t002_s2="done"))
    assert again.events == [] and again.ends == [EndRun("cart/t002/s1", why)]
    assert successor.trial_over(cfg.game("cart/t002/s2")) == "its trial ended pruned"
    assert successor.trial_over(cfg.game("cart/t003/s1")) is None
    # ... and the values of trial 1 come back, not drawn again.
    assert start(cfg, successor, 1)["learning_rate"] == study.trials[1].params["learning_rate"]
    conn.close()


def test_a_fatal_run_fails_its_trial_with_its_reason_and_the_sweep_goes_on(cfg: Config) -> None:
    conn = db.connect(cfg.state_dir, owner=True)
    keeper = SweepKeeper(cfg, conn)
    keeper.start()
    start(cfg, keeper, 0)
    step = keeper.step(states(cfg, cart_t000_s1="fatal", cart_t000_s2="running"))
    [(_, _, detail)] = step.events
    assert detail["state"] == "fail"
    assert detail["message"] == "cart/t000/s1: crash: exit status 78"
    assert step.ends == [EndRun("cart/t000/s2", "sweep cart: trial 0 ended fail")]
    # Done runs without an evaluation: failed, saying which.
    start(cfg, keeper, 1)
    step = keeper.step(states(cfg, cart_t000_s1="fatal", cart_t001_s1="done", cart_t001_s2="done"))
    [(_, _, detail)] = step.events
    assert detail["state"] == "fail" and "no evaluation recorded by cart/t001/s1" in detail[
        "message"]  # fmt: skip
    assert Study(cfg.games[0].sweep, cfg.state_dir).state(1) == "fail"  # type: ignore[arg-type]
    conn.close()


def test_a_store_that_fails_is_said_once_and_the_runs_go_on(
    cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = db.connect(cfg.state_dir, owner=True)
    keeper = SweepKeeper(cfg, conn)
    keeper.start()
    start(cfg, keeper, 0)
    evaluation(conn, "cart/t000/s1", 1024, 5.0)
    evaluation(conn, "cart/t000/s2", 1024, 6.0)
    study = keeper.studies["cart"]

    def broken(*a: object) -> bool:
        import sqlalchemy.exc

        raise sqlalchemy.exc.OperationalError("UPDATE", {}, Exception("disk I/O error"))

    monkeypatch.setattr(study, "report", broken)
    running = states(cfg, cart_t000_s1="running", cart_t000_s2="running")
    first, second = keeper.step(running), keeper.step(running)
    assert [e[0] for e in first.events] == ["sweep_failed"] and second.events == []
    assert "disk I/O error" in first.events[0][2]["message"]
    monkeypatch.undo()
    back = keeper.step(running)
    assert [e[0] for e in back.events] == ["sweep_ok"]
    assert keeper.studies["cart"].study.trials[0].intermediate_values == {0: 5.5}
    conn.close()


def test_a_run_its_sweep_ended_is_done_whatever_its_exit() -> None:
    for kind in (ExitKind.STOPPED, ExitKind.CRASH, ExitKind.SIGNALED):
        assert route_exit(kind, StopReason.SWEEP, removed=False, stopping=False) is Route.SWEEP
    # A shutdown wins (the next start ends it again); total_steps reached is done anyway.
    assert route_exit(ExitKind.STOPPED, StopReason.SWEEP, removed=False, stopping=True) is (
        Route.SHUTDOWN
    )
    assert route_exit(ExitKind.DONE, StopReason.SWEEP, removed=False, stopping=False) is Route.DONE


def test_a_trial_beyond_lowered_trials_is_failed_never_left_running(
    cfg: Config, tmp_path: Path
) -> None:
    conn = db.connect(cfg.state_dir, owner=True)
    keeper = SweepKeeper(cfg, conn)
    keeper.start()
    start(cfg, keeper, 4)  # trials 0..4 asked, all running
    path = tmp_path / "c.toml"
    path.write_text(HEAD + SWEEP.replace("trials = 5", "trials = 3"))
    fewer = load_config(path)
    SweepKeeper(fewer, conn).start()
    rows = {r.number: r for r in keeper.studies["cart"].rows()}
    assert [rows[n].state for n in range(5)] == ["running"] * 3 + ["fail"] * 2
    assert "lowered to 3" in (rows[4].message or "")
    conn.close()


def test_a_sweep_added_by_a_reload_is_opened_and_one_that_cannot_be_is_said(
    cfg: Config, tmp_path: Path
) -> None:
    from supervisor.sweep.keeper import TrialWaits

    plain = tmp_path / "plain.toml"
    plain.write_text(GOOD)
    conn = db.connect(cfg.state_dir, owner=True)
    keeper = SweepKeeper(load_config(plain), conn)
    keeper.start()
    assert not keeper.active
    keeper.reconfigure(cfg)  # the sweep arrives with a reload
    assert keeper.active and start(cfg, keeper, 0)["learning_rate"] > 0
    keeper.reconfigure(load_config(plain))  # and leaves
    assert not keeper.active
    (cfg.state_dir / "sweeps" / "cart.db").write_bytes(b"garbage" * 100)
    keeper.reconfigure(cfg)  # back, onto a store that cannot be read: its runs wait
    [(kind, _, detail)] = keeper.step(states(cfg)).events
    assert kind == "sweep_failed" and "cart.db" in detail["message"]
    with pytest.raises(TrialWaits):
        keeper.assign(cfg.game("cart/t001/s1"))
    conn.close()
