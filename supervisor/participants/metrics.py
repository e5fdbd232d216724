"""`[metrics]`: the Prometheus export (a listener and/or a textfile), refreshed by its own
thread; its failures become `metrics_failed` events."""

from __future__ import annotations

from supervisor.config import Config
from supervisor.observe.metrics import MetricsExporter
from supervisor.participants.tick import Event, TickView


class MetricsExport:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.exporter: MetricsExporter | None = None

    def start(self) -> None:
        self.exporter = MetricsExporter(self.cfg) if self.cfg.metrics.enabled else None
        if self.exporter is not None:
            self.exporter.start()

    def reconfigure(self, cfg: Config) -> None:
        old, self.cfg = self.cfg.metrics, cfg
        if cfg.metrics == old:
            if self.exporter is not None:
                self.exporter.cfg = cfg
            return
        if self.exporter is not None:  # the old exporter writes no "up 0"
            self.exporter.stop(replaced_by=cfg.metrics)
        self.start()

    def tick(self, view: TickView) -> list[Event]:
        if self.exporter is None:
            return []
        return [("metrics_failed", None, failure) for failure in self.exporter.drain()]

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.stop()
