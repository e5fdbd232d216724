"""Where the bridge sends a run's points: TensorBoard event files (command games: the built-in
learners write their own) and MLflow (every run). Each sink's library is imported on its
thread's first use, never by the daemon's tick. A sink raises on any failure; the bridge turns
that into `tracking_failed` and retries later, from the same position.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from supervisor.config.tracking import MlflowConfig
from supervisor.tracking.progress import Row

TB_DIR = "tb"  # as training/metrics.py's
TB_SUFFIX = ".rlsup"  # the bridge's event files, beside anything else in tb/
EVAL_PREFIX = "eval/"


@dataclass(frozen=True)
class RunFacts:
    """One run as the tick saw it: what the bridge's thread needs, nothing to read back."""

    name: str  # the run's name: pong, pong/lr3/s1
    run_dir: Path
    kind: str  # "builtin" or "command"
    group: str
    seed: int
    done: bool  # the game reached its total steps
    committed: int | None  # heartbeat's last_checkpoint_step (None: no heartbeat or none)
    life: int | None  # heartbeat's resume_count
    resumed_from: int | None
    params: tuple[tuple[str, Any], ...] = ()  # a command game's declared params
    live: bool = field(default=False, compare=False)  # a worker process exists now


# A run's hyper-parameters as the sinks log them, {} while not known yet (a built-in game
# before its first checkpoint). The participant gives observe/params.py's run_params (this
# wing sits below observe); alone, a sink takes the params the facts carry.
ParamsOf = Callable[[RunFacts], dict[str, Any]]


def declared_params(run: RunFacts) -> dict[str, Any]:
    return dict(run.params)


@dataclass(frozen=True)
class Evaluation:
    step: int
    time: float
    values: dict[str, float]  # eval/mean_return, eval/episodes, ...


class Sink(Protocol):
    name: str

    def wants(self, run: RunFacts) -> bool: ...

    def open_run(self, run: RunFacts, st: dict[str, Any], save: Callable[..., None]) -> None: ...

    def send(self, run: RunFacts, st: dict[str, Any], rows: Sequence[Row],
             evals: Sequence[Evaluation]) -> None: ...  # fmt: skip

    def finish(self, run: RunFacts, st: dict[str, Any], checkpoint: Path | None) -> None: ...

    def close(self) -> None: ...


# ---- TensorBoard ----------------------------------------------------------------------------


class TensorBoardSink:
    """`<run_dir>/tb/events.out.tfevents.*.rlsup` of a command game, by agent step, with
    tensorboard's own writer (no torch in the supervisor). Each supervisor life opens a new
    file that starts with a SessionLog START at the step after the last one the state saved:
    TensorBoard's loader then drops what a killed supervisor sent but had not yet recorded as
    sent, which is sent again (TensorBoard's purge, as the built-in learners use it)."""

    name = "tensorboard"

    def __init__(self, params_of: ParamsOf = declared_params) -> None:
        self._writers: dict[str, Any] = {}
        self.params_of = params_of

    def wants(self, run: RunFacts) -> bool:
        return run.kind == "command"

    def open_run(self, run: RunFacts, st: dict[str, Any], save: Callable[..., None]) -> None:
        if run.name in self._writers:
            return
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        writer = EventFileWriter(str(run.run_dir / TB_DIR), filename_suffix=TB_SUFFIX)
        purge = int(st.get("step", -1)) + 1
        start = SessionLog(status=SessionLog.START)
        writer.add_event(Event(step=purge, wall_time=time.time(), session_log=start))
        writer.flush()
        self._writers[run.name] = writer

    def log_params(self, run: RunFacts, st: dict[str, Any]) -> bool:
        """The run's hyper-parameters, once, as TensorBoard's hparams plugin reads them (its
        session-start summary, built by tensorboard's own summary_v2 without TensorFlow)."""
        params = self.params_of(run)
        if not params:
            return False
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb

        values = {k: v if isinstance(v, bool | int | float | str) else str(v)
                  for k, v in params.items()}  # fmt: skip
        writer = self._writers[run.name]
        writer.add_event(Event(step=0, wall_time=time.time(), summary=hparams_pb(values)))
        writer.flush()
        return True

    def send(
        self, run: RunFacts, st: dict[str, Any], rows: Sequence[Row], evals: Sequence[Evaluation]
    ) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self._writers[run.name]
        try:
            for step, at, values in [
                *((r.step, r.time or time.time(), r.values) for r in rows),
                *((e.step, e.time, e.values) for e in evals),
            ]:
                tagged = [Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
                writer.add_event(Event(step=step, wall_time=at, summary=Summary(value=tagged)))
            writer.flush()
        except Exception:
            # Sent again from the state's step: in a new file, whose purge drops what of
            # this batch reached the old one.
            self._writers.pop(run.name, None)
            with contextlib.suppress(Exception):
                writer.close()
            raise

    def finish(self, run: RunFacts, st: dict[str, Any], checkpoint: Path | None) -> None:
        writer = self._writers.pop(run.name, None)
        if writer is not None:
            writer.close()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


# ---- MLflow ---------------------------------------------------------------------------------

_KEY_BAD = re.compile(r"[^A-Za-z0-9_\-. :/]")
PARAM_MAX = 6000  # characters of a parameter's value MLflow takes
BATCH_METRICS = 1000  # MLflow's log_batch limits
BATCH_PARAMS = 100


def mlflow_key(name: str) -> str:
    """A metric or parameter name as MLflow takes it (its refused characters become `_`)."""
    key = _KEY_BAD.sub("_", name).replace("..", "_").strip("/")
    return key or "_"


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def run_tags(run: RunFacts) -> dict[str, str]:
    game, _, rest = run.group.partition("/")
    return {
        "game": game,
        "group": run.group,
        "seed": str(run.seed),
        "variant": rest,
        "host": socket.gethostname(),
        "rlsup.run": run.name,
        "rlsup.kind": run.kind,
    }


class MlflowSink:
    """One MLflow run per rlsup run for its whole life: created once (tagged with a random
    key saved first, so a supervisor killed between creating it and saving its id finds it
    again), resumed by id after every restart; parameters once, metrics by agent step, the
    final checkpoint's path as the tag `rlsup.final_checkpoint` when the game is done."""

    name = "mlflow"

    def __init__(self, cfg: MlflowConfig, params_of: ParamsOf = declared_params) -> None:
        self.cfg = cfg
        self.params_of = params_of
        self._client: Any = None
        self._experiment: str | None = None
        self._checked: set[str] = set()  # runs found by id this supervisor life

    def client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.cfg.tracking_uri)
        return self._client

    def experiment_id(self) -> str:
        if self._experiment is None:
            client = self.client()
            found = client.get_experiment_by_name(self.cfg.experiment)
            if found is None:
                try:
                    where = self.artifact_location()
                    self._experiment = str(client.create_experiment(self.cfg.experiment, where))
                except Exception:  # created meanwhile (another supervisor): read it back
                    found = client.get_experiment_by_name(self.cfg.experiment)
                    if found is None:
                        raise
                    self._experiment = str(found.experiment_id)
            else:
                self._experiment = str(found.experiment_id)
        return self._experiment

    def artifact_location(self) -> str | None:
        """Beside an SQLite store (MLflow's default would be ./mlruns in the supervisor's
        working directory); a server's own default otherwise."""
        uri = self.cfg.tracking_uri
        if not uri.startswith("sqlite:///"):
            return None
        return (Path(uri[len("sqlite:///") :]).parent / "mlflow-artifacts").as_uri()

    def wants(self, run: RunFacts) -> bool:
        return True

    def open_run(self, run: RunFacts, st: dict[str, Any], save: Callable[..., None]) -> None:
        if run.name in self._checked:
            return
        client = self.client()
        if st.get("run_id"):
            client.get_run(st["run_id"])  # raises when the store lost it (said as a failure)
        else:
            if not st.get("key"):
                save(key=uuid.uuid4().hex)  # before the run exists: found again by it
            exp = self.experiment_id()
            found = client.search_runs(
                [exp], filter_string=f"tags.`rlsup.key` = '{st['key']}'", max_results=1
            )
            if found:
                run_id = found[0].info.run_id
            else:
                tags = {**run_tags(run), "rlsup.key": st["key"]}
                run_id = client.create_run(exp, tags=tags, run_name=run.name).info.run_id
            save(run_id=run_id)
        self._checked.add(run.name)

    def log_params(self, run: RunFacts, st: dict[str, Any]) -> bool:
        """The run's parameters, once (a built-in game's need its first checkpoint)."""
        from mlflow.entities import Param

        params = self.params_of(run)
        if not params:
            return False
        from mlflow.exceptions import MlflowException

        items = [Param(mlflow_key(k), _param_text(v)) for k, v in sorted(params.items())]
        for chunk in _chunks(items, BATCH_PARAMS):
            try:
                self.client().log_batch(st["run_id"], params=chunk)
            except MlflowException as exc:
                # MLflow's parameters never change: a run's first values stay (the config's
                # params edited since); anything else is the store's failure.
                if exc.error_code != "INVALID_PARAMETER_VALUE":
                    raise
        return True

    def send(
        self, run: RunFacts, st: dict[str, Any], rows: Sequence[Row], evals: Sequence[Evaluation]
    ) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        metrics = [
            Metric(mlflow_key(k), v, int(at * 1000) if at else now_ms, step)
            for step, at, values in [
                *((r.step, r.time, r.values) for r in rows),
                *((e.step, e.time, e.values) for e in evals),
            ]
            for k, v in values.items()
        ]
        for chunk in _chunks(metrics, BATCH_METRICS):
            self.client().log_batch(st["run_id"], metrics=chunk)

    def finish(self, run: RunFacts, st: dict[str, Any], checkpoint: Path | None) -> None:
        client = self.client()
        if checkpoint is not None:
            client.set_tag(st["run_id"], "rlsup.final_checkpoint", str(checkpoint))
        client.set_terminated(st["run_id"], "FINISHED")

    def close(self) -> None:
        self._client = None


def _param_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:PARAM_MAX]
