"""A sweep's study on a real Optuna RDB store: a trial's values drawn once and re-attached after
a restart (never re-sampled), ended once, a store that is corrupt or another sweep's refused
(named, unchanged), private files, and a SIGKILL at any point of its writes losing nothing."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from harness.runs import REPO
from supervisor.config.sweep import ParamSpace, SweepSpec
from supervisor.sweep.study import DEFINITION_ATTR, Study, SweepError, read_rows, storage_path

SPACE = (
    ParamSpace("learning_rate", low=1e-4, high=1e-2, log=True),
    ParamSpace("epochs", choices=(2, 4, 8)),
    ParamSpace("width", low=16, high=64, step=16),
)


def spec(**kw: object) -> SweepSpec:
    base = dict(
        name="cart", trials=6, metric="eval", direction="maximize", sampler="tpe",
        pruner="median", min_trials=2, seed=3, space=SPACE, seeds=(1, 2), kind="builtin",
    )  # fmt: skip
    base.update(kw)
    return SweepSpec(**base)  # type: ignore[arg-type]


def test_a_trials_values_are_drawn_once_and_re_attached_after_a_restart(tmp_path: Path) -> None:
    first = Study(spec(), tmp_path)
    drawn = first.params(1)  # trial 0 is asked first: numbers are the sweep's trials
    assert [t.number for t in first.study.trials] == [0, 1]
    assert 1e-4 <= drawn["learning_rate"] <= 1e-2 and drawn["epochs"] in (2, 4, 8)
    assert drawn["width"] in (16, 32, 48, 64) and isinstance(drawn["width"], int)
    assert first.params(1) == drawn
    # A new supervisor on the same store: the same trial, the same values, nothing asked.
    again = Study(spec(), tmp_path)
    assert again.params(1) == drawn and again.state(1) == "running"
    assert len(again.study.trials) == 2 and again.state(2) == "waiting"
    # A trial asked but cut before its every value was drawn keeps the ones it had.
    raw = optuna.load_study(
        study_name="cart", storage=f"sqlite:///{storage_path(tmp_path, 'cart')}"
    )
    half = raw.ask()
    lr = half.suggest_float("learning_rate", 1e-4, 1e-2, log=True)
    assert half.number == 2
    third = Study(spec(), tmp_path).params(2)
    assert third["learning_rate"] == lr and set(third) == {"learning_rate", "epochs", "width"}


def test_a_trial_ends_once_and_its_reports_feed_the_pruner(tmp_path: Path) -> None:
    s = Study(spec(), tmp_path)
    for n, curve in enumerate(([10.0, 50.0, 90.0], [12.0, 55.0, 95.0])):
        s.params(n)
        for k, value in enumerate(curve):
            assert s.report(n, k, value) is False  # under min_trials complete: never pruned
        assert s.tell(n, "complete", curve[-1]) == "complete"
    assert s.tell(0, "fail", None, "late") == "complete"  # an ended trial keeps its end
    s.params(2)
    assert s.report(2, 0, 1.0) is True  # below the median of the others at index 0
    assert s.report(2, 0, 999.0) is True  # an index already reported is ignored
    assert s.tell(2, "pruned", None, "pruned at evaluation 0") == "pruned"
    s.params(3)
    assert s.tell(3, "fail", None, "cart/t003/s1: configuration error: bad") == "fail"
    rows = {r.number: r for r in read_rows(tmp_path, spec()) or []}
    assert (rows[0].state, rows[0].value) == ("complete", 90.0)
    assert (rows[2].state, rows[2].value, rows[2].message) == (
        "pruned", 1.0, "pruned at evaluation 0",
    )  # fmt: skip
    assert rows[3].state == "fail" and "configuration error" in (rows[3].message or "")
    assert s.study.best_trial.number == 1


def test_the_store_is_private(tmp_path: Path) -> None:
    Study(spec(), tmp_path).params(0)
    path = storage_path(tmp_path, "cart")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_another_sweeps_study_is_refused_naming_what_changed(tmp_path: Path) -> None:
    Study(spec(), tmp_path).params(0)
    before = storage_path(tmp_path, "cart").read_bytes()
    with pytest.raises(SweepError) as err:
        Study(spec(direction="minimize"), tmp_path)
    message = str(err.value)
    assert str(storage_path(tmp_path, "cart")) in message and "direction" in message
    assert "new name" in message
    wider = (ParamSpace("learning_rate", low=1e-5, high=1e-2, log=True), *SPACE[1:])
    with pytest.raises(SweepError, match="space"):
        Study(spec(space=wider), tmp_path)
    assert storage_path(tmp_path, "cart").read_bytes() == before  # unchanged
    # More trials or another pruner are the same study (taken at a start).
    assert Study(spec(trials=9, pruner="halving"), tmp_path).params(0)


def test_a_corrupt_or_foreign_store_is_refused_never_replaced(tmp_path: Path) -> None:
    path = storage_path(tmp_path, "cart")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database, " * 100)
    with pytest.raises(SweepError) as err:
        Study(spec(), tmp_path)
    assert str(path) in str(err.value) and "unreadable" in str(err.value)
    assert path.read_bytes() == b"not a database, " * 100
    with pytest.raises(SweepError):
        read_rows(tmp_path, spec())
    path.unlink()
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE mine(x)")
    with pytest.raises(SweepError, match="not an Optuna study storage"):
        Study(spec(), tmp_path)
    # An Optuna study of the same name made by someone else (trials, no rlsup definition).
    path.unlink()
    other = optuna.create_study(study_name="cart", storage=f"sqlite:///{path}")
    other.ask()
    with pytest.raises(SweepError, match="another program's study"):
        Study(spec(), tmp_path)
    assert (
        DEFINITION_ATTR
        not in optuna.load_study(study_name="cart", storage=f"sqlite:///{path}").user_attrs
    )


CHILD = """
import sys
from pathlib import Path
from supervisor.sweep.study import Study
from tests.sweep.test_study import spec
s = Study(spec(trials=10_000), Path(sys.argv[1]))
n = int(sys.argv[2])
while True:
    s.params(n)
    s.report(n, 0, float(n))
    s.tell(n, "complete", float(n))
    n += 1
"""


def _count(state_dir: Path) -> int:
    """Trials in the store, read without the study's own code (0: none yet, or not there)."""
    import sqlite3

    path = storage_path(state_dir, "cart")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return int(conn.execute("SELECT count(*) FROM trials").fetchone()[0])
    except sqlite3.Error:
        return 0


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_sigkill_at_any_point_of_the_writes_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(5)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = 0
    for _ in range(6):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), str(start)], env=env, cwd=REPO
        )
        # Once it writes trials (after its imports, however loaded the machine), a random
        # moment among its writes.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _count(tmp_path) <= start:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        s = Study(spec(trials=10_000), tmp_path)  # opens: nothing torn
        trials = s.study.get_trials(deepcopy=False)
        assert [t.number for t in trials] == list(range(len(trials)))
        for t in trials[:-1]:
            assert t.state.name == "COMPLETE" and t.value == float(t.number), t
        if trials:
            last = trials[-1]
            assert last.state.name in ("COMPLETE", "RUNNING")
            if last.state.name == "RUNNING":  # cut mid-trial: re-attached, then ended
                drawn = dict(last.params)
                assert {k: v for k, v in s.params(last.number).items() if k in drawn} == drawn
                s.tell(last.number, "complete", float(last.number))
        start = len(trials)
    assert start >= 6  # each kill landed after its child had written a trial


def test_a_grid_draws_every_point_once_and_its_last_tell_is_kept(tmp_path: Path) -> None:
    grid = spec(sampler="grid", trials=3, space=(ParamSpace("epochs", choices=(2, 4, 8)),))
    s = Study(grid, tmp_path)
    drawn = [s.params(n)["epochs"] for n in range(3)]
    assert sorted(drawn) == [2, 4, 8]
    for n in range(3):  # Optuna's grid would Study.stop() at its end: outside optimize, a raise
        assert s.tell(n, "complete", float(n)) == "complete"
    assert [r.state for r in s.rows()] == ["complete"] * 3


HOT = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size = 1")  # pages spill into the file before the commit
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE trials SET state = 'FAIL'")
conn.execute("DELETE FROM trial_params")
conn.execute("CREATE TABLE filler(x)")
conn.executemany("INSERT INTO filler VALUES (?)", [("x" * 1000,) for _ in range(2000)])
os.kill(os.getpid(), signal.SIGKILL)  # inside the transaction: its journal left hot
"""


@pytest.mark.e2e
def test_a_store_left_with_a_hot_journal_by_a_kill_opens_rolled_back(tmp_path: Path) -> None:
    s = Study(spec(), tmp_path)
    drawn = s.params(1)
    path = storage_path(tmp_path, "cart")
    del s
    child = subprocess.run([sys.executable, "-c", HOT, str(path)], check=False)
    assert child.returncode == -signal.SIGKILL
    journal = path.with_name(path.name + "-journal")
    assert journal.exists() and journal.stat().st_size > 0  # hot: the kill's half-transaction
    again = Study(spec(), tmp_path)  # rolled back, not refused
    assert again.params(1) == drawn and again.state(0) == again.state(1) == "running"
    assert read_rows(tmp_path, spec()) is not None
