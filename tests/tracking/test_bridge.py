"""The tracking bridge with its real sinks (TensorBoard's own writer and reader; MLflow's client
on an SQLite store), driven pass by pass (`pass_once`): only final steps are sent, each once and
in order, across bridge restarts (its state file), resumes that redo steps, and a sink that is
down (an event, a retry, the points sent once it is back)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.tracking import MlflowConfig
from supervisor.ledger import db
from supervisor.tracking.bridge import TrackingBridge
from supervisor.tracking.sinks import MlflowSink, RunFacts, Sink, TensorBoardSink
from supervisor.tracking.state import STATE_DIR, STATE_FILE

HEADER = "time,wall_s,global_step,episodes,sps,mean_return,num_envs,batch_size,resume_count,loss\n"


def add_rows(run_dir: Path, *steps: int, life: int = 0, loss: float = 0.5) -> None:
    path = run_dir / "progress.csv"
    new = not path.exists()
    with path.open("a") as f:
        if new:
            f.write(HEADER)
        for s in steps:
            f.write(f"{1_700_000_000 + s},{s},{s},1,10.0,1.5,2,64,{life},{loss + s / 1000}\n")


def commit(run_dir: Path, step: int) -> None:
    (run_dir / "checkpoints" / f"ckpt-{step:012d}").mkdir(parents=True, exist_ok=True)


def facts(run_dir: Path, name: str = "mine", **kw: Any) -> RunFacts:
    values: dict[str, Any] = dict(
        name=name, run_dir=run_dir, kind="command", group=name, seed=1, done=False,
        committed=None, life=None, resumed_from=None, params=(("lr", 0.001), ("arch", "mlp")),
    )  # fmt: skip
    values.update(kw)
    return RunFacts(**values)


def bridge(state: Path, *sinks: Sink) -> TrackingBridge:
    b = TrackingBridge(state, state / "rlsup.db", list(sinks))
    b.state.load()
    return b


def tb_steps(run_dir: Path, tag: str = "loss") -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


# ---- TensorBoard ---------------------------------------------------------------------------


def test_tensorboard_gets_final_steps_once_across_a_bridge_restart_and_a_resume(
    tmp_path: Path,
) -> None:
    state, run_dir = tmp_path / "state", tmp_path / "state" / "runs" / "mine"
    run_dir.mkdir(parents=True)
    add_rows(run_dir, 10, 20, 30, 40)
    commit(run_dir, 20)
    b = bridge(state, TensorBoardSink())
    b.post((facts(run_dir, committed=20, life=0),))
    b.pass_once()
    assert tb_steps(run_dir) == [10, 20]  # 30 and 40 wait: a crash could redo them
    # Killed at 40; the next life resumes from 20 and redoes 30 and 40 with new values.
    add_rows(run_dir, 30, 40, 50, life=1, loss=9.0)
    commit(run_dir, 40)
    saved = (state / STATE_DIR / STATE_FILE).read_text()
    b.post((facts(run_dir, committed=40, life=1, resumed_from=20),))
    b.pass_once()
    b.close()
    for sink in b.sinks:
        sink.close()
    assert tb_steps(run_dir) == [10, 20, 30, 40]
    # The supervisor died after sending 30 and 40 but before recording it: a new bridge
    # sends them again, and TensorBoard's purge (its SessionLog START) keeps one of each.
    (state / STATE_DIR / STATE_FILE).write_text(saved)
    b2 = bridge(state, TensorBoardSink())
    b2.post((facts(run_dir, committed=40, life=1, resumed_from=20),))
    b2.pass_once()
    for sink in b2.sinks:
        sink.close()
    assert tb_steps(run_dir) == [10, 20, 30, 40]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    assert [round(e.value, 3) for e in acc.Scalars("loss")][2:] == [9.03, 9.04]  # the redone ones
    assert (state / STATE_DIR / STATE_FILE).stat().st_mode & 0o077 == 0


def test_tensorboard_gets_the_runs_hparams_once(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    state, run_dir = tmp_path / "state", tmp_path / "state" / "runs" / "mine"
    run_dir.mkdir(parents=True)
    add_rows(run_dir, 10, 20)
    commit(run_dir, 20)
    for life in range(2):  # a second bridge (a supervisor restarted) writes them no more
        b = bridge(state, TensorBoardSink())
        b.post((facts(run_dir, committed=20, life=0),))
        b.pass_once()
        add_rows(run_dir, 30 + 10 * life)
        commit(run_dir, 30 + 10 * life)
        b.post((facts(run_dir, committed=30 + 10 * life, life=0),))
        b.pass_once()
        b.close()
        for sink in b.sinks:
            sink.close()
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    assert list(content) == [metadata.SESSION_START_INFO_TAG]
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    got = {k: v.string_value or v.number_value for k, v in start.hparams.items()}
    assert got == {"lr": 0.001, "arch": "mlp"}
    assert len(list((run_dir / "tb").iterdir())) == 2 and tb_steps(run_dir) == [10, 20, 30, 40]


def test_tensorboard_is_for_command_games_only(tmp_path: Path) -> None:
    assert not TensorBoardSink().wants(facts(tmp_path, kind="builtin"))


# ---- a sink that is down -------------------------------------------------------------------


class Flaky:
    """A sink whose every call fails while `down` (the seam: where the network would be)."""

    name = "flaky"

    def __init__(self) -> None:
        self.down = True
        self.got: list[int] = []
        self.evals: list[tuple[int, float]] = []

    def wants(self, run: RunFacts) -> bool:
        return True

    def open_run(self, run: RunFacts, st: dict[str, Any], save: Any) -> None:
        if self.down:
            raise ConnectionError("connection refused")

    def send(self, run: RunFacts, st: dict[str, Any], rows: Any, evals: Any) -> None:
        self.got += [r.step for r in rows]
        self.evals += [(e.step, e.values["eval/mean_return"]) for e in evals]

    def finish(self, run: RunFacts, st: dict[str, Any], checkpoint: Path | None) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_sink_that_is_down_is_one_event_a_retry_and_then_the_points(tmp_path: Path) -> None:
    state, run_dir = tmp_path / "state", tmp_path / "run"
    run_dir.mkdir()
    add_rows(run_dir, 10, 20)
    flaky = Flaky()
    b = bridge(state, flaky)
    b.post((facts(run_dir, committed=20, life=0),))
    b.pass_once()
    b.health["flaky"].retry_at = 0.0
    b.pass_once()  # still down: no second event
    [(kind, _, detail)] = b.drain()
    assert kind == "tracking_failed" and detail["sink"] == "flaky"
    assert "connection refused" in detail["error"] and detail["retry_s"] == 1.0
    assert b.health["flaky"].failures == 2 and flaky.got == []
    flaky.down = False
    b.health["flaky"].retry_at = 0.0
    b.pass_once()
    [(kind, _, detail)] = b.drain()
    assert kind == "tracking_ok" and detail["points"] == 2 and flaky.got == [10, 20]


def test_a_resume_before_steps_already_sent_skips_their_new_values_with_an_event(
    tmp_path: Path,
) -> None:
    state, run_dir = tmp_path / "state", tmp_path / "run"
    run_dir.mkdir()
    add_rows(run_dir, 10, 20, 30)
    flaky = Flaky()
    flaky.down = False
    b = bridge(state, flaky)
    b.post((facts(run_dir, committed=30, life=0),))
    b.pass_once()
    # The checkpoint at 30 turned out corrupt: the next life resumed from 10.
    add_rows(run_dir, 20, 30, 40, life=1)
    b.post((facts(run_dir, committed=40, life=1, resumed_from=10),))
    b.pass_once()
    assert flaky.got == [10, 20, 30, 40]  # never a step twice, never backwards
    [(kind, game, detail)] = b.drain()
    assert (kind, game) == ("tracking_skipped", "mine")
    assert detail["points"] == 1 and detail["from_step"] == 20 and detail["sent_through"] == 40


def test_an_evaluation_a_later_life_redid_is_never_sent(tmp_path: Path) -> None:
    state, run_dir = tmp_path / "state", tmp_path / "run"
    run_dir.mkdir()
    conn = db.connect(state)
    db._add_event(conn, "evaluation", "mine", {"step": 10, "mean": 1.0})
    db._add_event(conn, "evaluation", "mine", {"step": 30, "mean": 3.0})  # killed at 35
    db._add_event(conn, "worker_start", "mine", {"pid": 2})  # resumes from 20
    db._add_event(conn, "evaluation", "mine", {"step": 30, "mean": 3.5})
    flaky = Flaky()
    flaky.down = False
    b = bridge(state, flaky)
    b.post((facts(run_dir, committed=20, life=0),))
    b.pass_once()
    assert flaky.evals == [(10, 1.0)]  # 30 waits past the committed step
    b.post((facts(run_dir, committed=40, life=1, resumed_from=20),))
    b.pass_once()
    assert flaky.evals == [(10, 1.0), (30, 3.5)]  # the first life's 30 was redone


# ---- MLflow --------------------------------------------------------------------------------


def mlflow_sink(uri: str) -> MlflowSink:
    pytest.importorskip("mlflow")
    return MlflowSink(MlflowConfig(tracking_uri=uri, experiment="tests"))


def history(uri: str, run_id: str, key: str = "loss") -> list[int]:
    from mlflow.tracking import MlflowClient

    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


@pytest.mark.e2e  # MLflow's client runs `uname -p` (platform.processor())
def test_mlflow_one_run_for_the_whole_life_with_params_tags_evals_and_the_final_checkpoint(
    tmp_path: Path,
) -> None:
    state, run_dir = tmp_path / "state", tmp_path / "state" / "runs" / "pong" / "lr3" / "s2"
    run_dir.mkdir(parents=True)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    conn = db.connect(state)
    db._add_event(conn, "evaluation", "pong/lr3/s2", {"step": 20, "mean": 7.5, "episodes": 4})
    db._add_event(conn, "evaluation", "pong/lr3/s2", {"step": 40, "mean": 9.0, "episodes": 4})
    add_rows(run_dir, 10, 20, 30)
    name = dict(name="pong/lr3/s2", group="pong/lr3", seed=2)
    b = bridge(state, mlflow_sink(uri))
    b.post((facts(run_dir, **name, committed=20, life=0),))
    b.pass_once()
    assert b.drain() == []
    run_id = b.state.run("mlflow", "pong/lr3/s2")["run_id"]
    b.close()
    # A new supervisor (a restart, a reboot): the same MLflow run, continued by id.
    add_rows(run_dir, 40, 50)
    commit(run_dir, 50)
    b2 = bridge(state, mlflow_sink(uri))
    b2.post((facts(run_dir, **name, committed=50, life=0, done=True),))
    b2.pass_once()
    assert b2.state.run("mlflow", "pong/lr3/s2")["run_id"] == run_id
    assert history(uri, run_id) == [10, 20, 30, 40, 50]
    assert history(uri, run_id, "eval/mean_return") == [20, 40]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    [only] = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert only.info.run_id == run_id and only.info.status == "FINISHED"
    tags = only.data.tags
    assert (tags["game"], tags["group"], tags["seed"], tags["variant"]) == ("pong", "pong/lr3",
                                                                            "2", "lr3")  # fmt: skip
    assert tags["host"] and tags["rlsup.final_checkpoint"].endswith("ckpt-000000000050")
    assert only.data.params == {"lr": "0.001", "arch": "mlp"}
    assert only.data.metrics["eval/episodes"] == 4.0


@pytest.mark.e2e
def test_mlflow_misconfigured_then_fixed_loses_no_point(tmp_path: Path) -> None:
    state, run_dir = tmp_path / "state", tmp_path / "run"
    run_dir.mkdir(parents=True)
    add_rows(run_dir, 10, 20)
    where = tmp_path / "not-yet"
    where.write_text("a file where the store's directory should be\n")
    uri = f"sqlite:///{where / 'mlflow.db'}"  # cannot be created: no store
    b = bridge(state, mlflow_sink(uri))
    b.post((facts(run_dir, committed=20, life=0),))
    b.pass_once()
    [(kind, _, detail)] = b.drain()
    assert kind == "tracking_failed" and detail["sink"] == "mlflow", detail
    where.unlink()
    where.mkdir()
    b.health["mlflow"].retry_at = 0.0
    b.pass_once()
    [(kind, _, detail)] = b.drain()
    assert kind == "tracking_ok" and detail["points"] == 2
    assert history(uri, b.state.run("mlflow", "mine")["run_id"]) == [10, 20]
    shutil.rmtree(where)
    json.loads((state / STATE_DIR / STATE_FILE).read_text())  # whole JSON
