"""`[tracking]`: the tracking bridge's thread (supervisor/tracking/), handed each tick's runs:
a few fields per game, copied from the runtimes the lifecycle keeps; everything else, reading
files and sending, happens on its thread. Its news become `tracking_*` events."""

from __future__ import annotations

from pathlib import Path

from supervisor.config import Config
from supervisor.lifecycle.runtime import GameRuntime
from supervisor.lifecycle.states import WorkerState
from supervisor.participants.tick import Event, TickView
from supervisor.tracking.bridge import TrackingBridge
from supervisor.tracking.sinks import MlflowSink, RunFacts, Sink, TensorBoardSink


def make_sinks(cfg: Config) -> list[Sink]:
    sinks: list[Sink] = []
    if cfg.tracking.tensorboard:
        sinks.append(TensorBoardSink())
    if cfg.tracking.mlflow is not None:
        sinks.append(MlflowSink(cfg.tracking.mlflow))
    return sinks


class TrackingBridgeParticipant:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.bridge = TrackingBridge(cfg.state_dir, cfg.db_path, make_sinks(cfg))
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

    def reconfigure(self, cfg: Config) -> None:
        # A changed [tracking] takes a new thread (its sinks); the runs follow the view.
        if cfg.tracking != self.cfg.tracking:
            self.bridge.close()
            self._held += self.bridge.drain()
            self.bridge = TrackingBridge(cfg.state_dir, cfg.db_path, make_sinks(cfg))
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
