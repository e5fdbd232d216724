"""The bridge's position in each run, per sink: `<state_dir>/tracking/state.json`, private to
the supervisor (0600 in a 0700 directory), written atomically after each pass that moved, so a
supervisor restart or a host reboot continues where it was.

Per sink and run: `offset`/`inode` (progress.csv read up to there), `step` (the newest step
sent), `eval_id` (the newest `evaluation` event handled), `eval_step`, `run_id` (the sink's own
run, e.g. MLflow's), `key` (a random key tagged on that run, to find it again if the supervisor
died between creating it and saving its id), `params` (parameters logged), `done` (the final
checkpoint told), `skipped_life` (the last life whose redone steps an event reported).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from checkpoints.atomic import write_json_atomic
from supervisor.files import make_private_dir

STATE_DIR = "tracking"
STATE_FILE = "state.json"
VERSION = 1


class TrackingState:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / STATE_DIR
        self.path = self.dir / STATE_FILE
        self.sinks: dict[str, dict[str, dict[str, Any]]] = {}
        self.dirty = False
        self.load_error: str | None = None

    def load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # Unreadable: start over (steps already sent are then skipped by the sinks' own
            # checks where they have one) and say so once.
            self.load_error = f"{self.path}: {exc}"
            return
        sinks = data.get("sinks") if isinstance(data, dict) else None
        if isinstance(sinks, dict):
            self.sinks = {
                str(sink): {str(g): dict(v) for g, v in runs.items() if isinstance(v, dict)}
                for sink, runs in sinks.items()
                if isinstance(runs, dict)
            }

    def run(self, sink: str, game: str) -> dict[str, Any]:
        return self.sinks.setdefault(sink, {}).setdefault(game, {})

    def update(self, sink: str, game: str, **values: Any) -> None:
        self.run(sink, game).update(values)
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        make_private_dir(self.dir)
        write_json_atomic(self.path, {"version": VERSION, "sinks": self.sinks}, mode=0o600)
        self.dirty = False

    def save_quietly(self) -> str | None:
        """Save; the error's text if it failed (kept dirty: retried next pass)."""
        try:
            self.save()
        except (OSError, TypeError, ValueError) as exc:
            return f"cannot write {self.path}: {exc}"
        return None
