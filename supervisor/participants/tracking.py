"""`[tracking]`: the tracking bridge's thread (supervisor/tracking/), handed each tick's runs:
a few fields per game, copied from the runtimes the lifecycle keeps; everything else, reading
files and sending, happens on its thread. Its news become `tracking_*` events."""

from __future__ import annotations

from pathlib import Path

from checkpoints.names import newest_step
from supervisor.config import Config
from supervisor.lifecycle.runtime import GameRuntime
from supervisor.lifecycle.states import WorkerState
from supervisor.observe.params import run_params
from supervisor.participants.tick import Event, TickView
from supervisor.tracking.bridge import TrackingBridge
from supervisor.tracking.sinks import (
    MlflowSink,
    ParamsOf,
    RunFacts,
    Sink,
    TensorBoardSink,
    declared_params,
)
from training.protocol import CHECKPOINT_DIR


def make_sinks(cfg: Config, params_of: ParamsOf = declared_params) -> list[Sink]:
    sinks: list[Sink] = []
    if cfg.tracking.tensorboard:
        sinks.append(TensorBoardSink(params_of))
    if cfg.tracking.mlflow is not None:
        sinks.append(MlflowSink(cfg.tracking.mlflow, params_of))
    return sinks


class TrackingBridgeParticipant:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.bridge = TrackingBridge(cfg.state_dir, cfg.db_path, make_sinks(cfg, self.params_of))
        self._held: list[Event] = []  # a replaced bridge's last news
        self._dirs: dict[str, Path] = {}  # run dirs by run name (not rebuilt every tick)

    def start(self) -> None:
        self.bridge.start()

    def tick(self, view: TickView) -> list[Event]:
        if self.bridge.sinks:
            self.bridge.post(tuple(self._facts(rt) for rt in view.games))
        held, self._held = self._held, []
        return held + self.bridge.drain()

    def _facts(self, rt: GameRuntime) -> RunFacts:
        spec, hb = rt.spec, rt.heartbeat
        return RunFacts(
            name=spec.name,
            run_dir=self._dirs.get(spec.name)
            or self._dirs.setdefault(spec.name, self.cfg.run_dir(spec.name)),
            kind=spec.kind,
            group=spec.group,
            seed=spec.seed,
            done=rt.state is WorkerState.DONE,
            committed=hb.last_checkpoint_step if hb else None,
            life=hb.resume_count if hb else None,
            resumed_from=hb.resumed_from_step if hb else None,
            params=_params(spec),
            live=rt.life is not None,
        )

    def params_of(self, run: RunFacts) -> dict[str, object]:
        """A run's effective hyper-parameters (observe/params.py), read on the bridge's
        thread: a built-in game's once its first checkpoint holds its resolved arguments."""
        if run.kind != "command" and newest_step(run.run_dir / CHECKPOINT_DIR) is None:
            return {}
        try:
            return dict(run_params(self.cfg, run.name))
        except KeyError:  # no longer configured
            return {}

    def reconfigure(self, cfg: Config) -> None:
        # A changed [tracking] takes a new thread (its sinks); the runs follow the view.
        if cfg.tracking != self.cfg.tracking:
            self.bridge.close()
            self._held += self.bridge.drain()
            self.bridge = TrackingBridge(
                cfg.state_dir, cfg.db_path, make_sinks(cfg, self.params_of)
            )
            self.bridge.start()
        self.cfg = cfg
        self._dirs.clear()

    def close(self) -> None:
        self.bridge.close()


def _params(spec: object) -> tuple[tuple[str, object], ...]:
    """A command game's declared `params` (`[games.X] params`, when the config has the key)."""
    params = getattr(spec, "params", None) or ()
    items = params.items() if isinstance(params, dict) else params
    return tuple(sorted((str(k), v) for k, v in items))
