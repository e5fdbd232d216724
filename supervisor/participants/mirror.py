"""`[mirror]`: the uploader process (this host's games; on several hosts, each host mirrors
its own and this only turns mirror.json's changes into events)."""

from __future__ import annotations

from typing import Any

from supervisor.config import Config
from supervisor.mirror.uploader import Uploader
from supervisor.participants.tick import Event, TickView


class MirrorUploads:
    def __init__(self, cfg: Config, *, local: bool) -> None:
        self._heard: list[Event] = []  # what the uploader said in its tick, for the daemon
        self.uploader = Uploader(cfg, self._hear, local)

    def _hear(self, kind: str, game: str | None, detail: dict[str, Any]) -> None:
        self._heard.append((kind, game, detail))

    def start(self) -> None:
        pass

    def tick(self, view: TickView) -> list[Event]:
        if not view.stopping:
            self.uploader.tick(view.now)
        heard, self._heard = self._heard, []
        return heard

    def reconfigure(self, cfg: Config) -> None:
        self.uploader.reconfigure(cfg)

    def close(self) -> None:
        self.uploader.stop()
