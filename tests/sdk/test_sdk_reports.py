"""What a script reports beyond its steps, through the SDK: evaluations (`run.evaluation()`,
recorded as rlsup's own worker records one), its hyper-parameters (`run.params` from
RLSUP_PARAMS) and the metric names it may not take. A real run directory, real files, the real
checkpoint store and the supervisor's own readers of them; no process is started (the command
game under a real `rlsup run`: tests/supervisor/daemon/test_command_evaluations.py)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

import rlsup
from checkpoints import CheckpointStore
from rlsup._evaluation import RESERVED_METRICS
from supervisor.lifecycle.liveness import Reported, new_reports
from supervisor.observe.results import run_figures
from training import protocol as P


def _attach(path: Path, **kw: object) -> rlsup.Run:
    kw.setdefault("handle_signals", False)
    return rlsup.attach(path, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name", ["sps", "global_step", "time", "wall_s", "num_envs", "batch_size", "resume_count"]
)
def test_a_reserved_metric_name_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    with _attach(tmp_path) as run:
        with pytest.raises(ValueError, match=rf"metric name '{name}' is reserved"):
            run.heartbeat(10, loss=0.5, **{name: 1.0})
        run.heartbeat(10, loss=0.5, my_sps=3.0)  # any other name is the script's own
        hb = P.read_heartbeat(tmp_path)
        assert hb is not None and hb.metrics == {"loss": 0.5, "my_sps": 3.0}
    assert set(P.PROGRESS_COLUMNS) == RESERVED_METRICS


def test_an_evaluation_is_recorded_as_the_workers_and_becomes_the_supervisors_event(
    tmp_path: Path,
) -> None:
    with _attach(tmp_path) as run:
        run.heartbeat(100, mean_return=1.0)
        assert run.evaluation(100, 12.5, episodes=10, seconds=1.25, std=2.0, note="greedy")
        time.sleep(0.06)
        run.heartbeat(200, mean_return=2.0)
        assert run.evaluation(200, 20.0, episodes=10)
        hb = P.read_heartbeat(tmp_path)  # on disk at once, not at the next second's write
        assert hb is not None
        assert [(e["step"], e["mean"], e["episodes"]) for e in hb.evals] == [
            (100, 12.5, 10),
            (200, 20.0, 10),
        ]
        assert hb.evals[0]["seconds"] == 1.25 and hb.evals[1]["seconds"] is None
        assert hb.eval is not None and hb.eval["step"] == 200
        # eval.json: the newest, in the worker's format, with the script's extra figures.
        first = json.loads((tmp_path / P.EVAL_FILE).read_text())
        assert (first["step"], first["mean"], first["episodes"]) == (200, 20.0, 10)
        # The supervisor's own reading of that heartbeat: one `evaluation` event each.
        seen = Reported()
        events = new_reports(seen, hb)
        assert [(k, d["step"], d["mean"], d["seconds"]) for k, d in events] == [
            ("evaluation", 100, 12.5, 1.25),
            ("evaluation", 200, 20.0, None),
        ]
        assert new_reports(seen, hb) == []  # read again: nothing new
    # `rlsup results`' reading of the run dir: EVAL of the newest.
    fig = run_figures("mine", tmp_path, "running")
    assert (fig.eval, fig.eval_step, fig.eval_episodes) == (20.0, 200, 10)


def test_values_that_are_no_finite_number_are_dropped_and_counted_never_a_crash(
    tmp_path: Path,
) -> None:
    with _attach(tmp_path) as run:
        run.heartbeat(10, mean_return=float("nan"), loss=float("inf"), ok=1.0)
        assert run.evaluation(10, float("nan")) is False
        assert run.evaluation(float("inf"), 1.0) is False  # type: ignore[arg-type]
        assert run.evaluation(-5, 1.0) is False
        assert run.evaluation(20, 3.0, episodes=float("nan"), seconds=-1.0, std=math.inf)
        hb = P.read_heartbeat(tmp_path)
        assert hb is not None
        assert hb.dropped == {"metric": 2, "evaluation": 3, "evaluation_field": 3}
        assert [e["step"] for e in hb.evals] == [20]
        assert hb.eval is not None
        assert (hb.eval["episodes"], hb.eval["seconds"], "std" in hb.eval) == (None, None, False)
        # Not a number at all is a bug of the script's: said at once.
        with pytest.raises(rlsup.SdkError, match="mean_return='high' is not a number"):
            run.evaluation(30, "high")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'mean' is one of the evaluation's own fields"):
            run.evaluation(30, 1.0, mean=2.0)


def test_a_checkpoint_at_an_evaluated_step_records_it_and_keep_best_ranks_it(
    tmp_path: Path,
) -> None:
    scores = {100: 5.0, 200: 50.0, 300: 10.0, 400: 7.0, 500: 8.0}
    with _attach(tmp_path, keep=1, keep_best=1) as run:
        for step, score in scores.items():
            run.heartbeat(step)
            run.evaluation(step, score, episodes=4, std=1.5)
            with run.checkpoint(step) as d:
                (d / "s").write_text(str(step))
        with run.checkpoint(550) as d:  # no evaluation at this step: none recorded
            (d / "s").write_text("550")
    store = CheckpointStore(tmp_path / P.CHECKPOINT_DIR)
    kept = {ref.step: store.meta(ref) for ref in store.committed()}
    assert sorted(kept) == [200, 550]  # the newest, and the best evaluated
    assert kept[200]["eval"] == {"step": 200, "mean": 50.0, "std": 1.5, "episodes": 4}
    assert "eval" not in kept[550]


def test_evaluating_is_its_own_phase_and_times_the_evaluation(tmp_path: Path) -> None:
    with _attach(tmp_path, step_deadline_s=5) as run:
        run.heartbeat(10)
        with run.evaluating(deadline_s=900):
            hb = P.read_heartbeat(tmp_path)
            assert hb is not None and (hb.phase, hb.phase_deadline_s) == ("evaluating", 900)
            time.sleep(0.2)
            run.evaluation(10, 1.0)
        hb = P.read_heartbeat(tmp_path)
        assert hb is not None and (hb.phase, hb.phase_deadline_s) == ("training", 5)
        assert hb.eval is not None and 0.2 <= hb.eval["seconds"] < 5
        with pytest.raises(rlsup.SdkError, match="deadline_s"):
            run.evaluating(deadline_s=0)


def test_params_come_from_rlsup_params_over_the_scripts_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _attach(tmp_path / "a") as run:
        assert run.params == {}
    with _attach(tmp_path / "b", params={"lr": 1e-3, "gamma": 0.99}) as run:
        assert run.params == {"lr": 1e-3, "gamma": 0.99}  # standalone: the script's own
    monkeypatch.setenv(P.PARAMS_ENV, json.dumps({"lr": 3e-4, "env_id": "CartPole-v1"}))
    with _attach(tmp_path / "c", params={"lr": 1e-3, "gamma": 0.99}) as run:
        assert run.params == {"lr": 3e-4, "gamma": 0.99, "env_id": "CartPole-v1"}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("{lr: 3e-4", "RLSUP_PARAMS='{lr: 3e-4': not JSON"),
        ("[1, 2]", "a JSON list, expected an object"),
        ('{"lr": [1, 2]}', r"lr = \[1, 2\] is no scalar"),
        ('{"lr": NaN}', "lr = nan is no scalar"),
    ],
)
def test_bad_rlsup_params_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: str, says: str
) -> None:
    monkeypatch.setenv(P.PARAMS_ENV, raw)
    with pytest.raises(rlsup.SdkError, match=says):
        _attach(tmp_path)
    assert not (tmp_path / P.HEARTBEAT_FILE).exists()
