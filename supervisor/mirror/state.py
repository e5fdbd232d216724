"""`<state_dir>/mirror.json`: how far the checkpoint mirror got, per game. Written by the
uploader process, read by the supervisor (events) and by `rlsup status` (stdlib only: status
stays fast)."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "mirror.json"


@dataclass
class GameMirror:
    """How far one game's mirror got (a row of mirror.json)."""

    step: int | None = None  # newest checkpoint whose manifest is in the bucket
    created: float | None = None  # when that checkpoint was committed locally (wall clock)
    uploaded_at: float | None = None
    bytes_uploaded: int = 0  # of that checkpoint: new bytes sent
    bytes_present: int = 0  # of that checkpoint: already in the bucket (shared blobs)
    seconds: float = 0.0
    uploads: int = 0
    failures: int = 0  # every failed attempt, ever (the supervisor reports increases)
    last_error: str | None = None
    error_at: float | None = None


@dataclass
class MirrorState:
    pid: int = 0
    url: str = ""
    updated: float = 0.0
    games: dict[str, GameMirror] = field(default_factory=dict)
    gc: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, state_dir: Path) -> MirrorState | None:
        try:
            data = json.loads((state_dir / STATE_FILE).read_text(encoding="utf-8"))
            games = {str(k): GameMirror(**v) for k, v in (data.pop("games") or {}).items()}
            return cls(games=games, **data)
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def write(self, state_dir: Path) -> None:
        from checkpoints import write_json_atomic

        self.updated = time.time()
        with contextlib.suppress(OSError):  # a full disk: the next write says it
            write_json_atomic(state_dir / STATE_FILE, asdict(self))

    def game_view(self, name: str, now: float) -> tuple[int | None, float | None]:
        """(mirror_step, mirror_age_s) of a game for `rlsup status`: the newest mirrored
        checkpoint and how long ago it was committed locally."""
        gm = self.games.get(name)
        if gm is None or gm.step is None:
            return None, None
        return gm.step, None if gm.created is None else max(0.0, now - gm.created)
