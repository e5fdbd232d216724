"""`[spare]`: keep this host's pre-warmed spare worker (or drop it) as the policy says, and
its row for `rlsup status`."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import psutil  # type: ignore[import-untyped]

from supervisor.config import Config
from supervisor.launch.launcher import LauncherSeam
from supervisor.launch.spare import SpareWant, decide, spare_device
from supervisor.ledger import db
from supervisor.ledger.recorder import Recorder
from supervisor.lifecycle.states import TERMINAL
from supervisor.participants.tick import Event, TickView
from supervisor.stability import modes


class SpareTending:
    def __init__(
        self, cfg: Config, recorder: Recorder, launcher: LauncherSeam, conn: sqlite3.Connection
    ) -> None:
        self.cfg, self.recorder, self.launcher, self.conn = cfg, recorder, launcher, conn
        self._row: dict[str, Any] | None = None  # the spare's row last written
        self._ram_total_mb = psutil.virtual_memory().total / 2**20
        self._host_mode_reason = ""  # why the host runs its mode (modes.reason), last read

    def start(self) -> None:
        pass

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg

    def tick(self, view: TickView) -> list[Event]:
        if view.stopping:
            return []
        return self.tend(self.want(view), view.now, view.wall)

    def close(self) -> None:
        pass  # the launcher closes the spare with itself: no spare outlives the supervisor

    def tend(self, want: SpareWant, now: float, wall: float) -> list[Event]:
        """Keep the spare as `want` says; the events it made. The spare's row (a keyed row,
        like a worker's) is written when it changes."""
        told = list(self.launcher.tend_spare(want, now))
        row = self.launcher.spare_row()
        if row is not None and row != self._row:
            self._row = row
            self.recorder.spare({**row, "updated": wall})
        return told

    def want(self, view: TickView) -> SpareWant:
        """Whether this host keeps a spare now ([spare] enabled; "auto": not under memory
        pressure, not where the policy stepped the host down to its lowest mode, not when no
        game is left to start), for which device, with its log."""
        cfg = self.cfg
        # A spare is rlsup's own worker, pre-warmed: it never serves a command game, nor a
        # game placed on a GPU (its worker starts cold, with that GPU's CUDA_VISIBLE_DEVICES).
        servable = [g for g in cfg.games if g.command is None and g.name not in view.placed]
        device = spare_device([g.device for g in servable] or ["cpu"])
        log_path, cwd = cfg.logs_dir / "spare.log", cfg.state_dir
        if all(rt.state in TERMINAL or rt.spec.command is not None for rt in view.games):
            return SpareWant(False, "no game left to start", device, log_path, cwd)
        if not servable:
            why = "every game is placed on a GPU and starts cold: a spare could serve none"
            return SpareWant(False, why, device, log_path, cwd)
        if view.hold.holding:  # the machine goes soon: nothing new is warmed
            return SpareWant(False, "a preemption notice stands", device, log_path, cwd)
        row = self.launcher.spare_row() or {}
        want, reason = decide(
            cfg.spare.enabled,
            cfg.spare.min_ram_available_pct,
            ram_available_pct=view.vitals.ram_available_pct if view.vitals is not None else None,
            ram_total_mb=self._ram_total_mb,
            spare_rss_mb=row.get("rss_mb"),
            have_spare=row.get("state") in ("warming", "ready"),
            lowest_rung=self.lowest_rung(view),
        )
        return SpareWant(want, reason, device, log_path, cwd)

    def lowest_rung(self, view: TickView) -> bool:
        """The host runs its lowest mode because the policy stepped it down there (or an
        operator pinned it): not merely because initial_mode names the lowest rung."""
        names = self.cfg.mode_names
        if len(names) < 2 or view.modes.host.name != names[0]:
            return False
        if modes.HOST in view.modes.pinned:
            return True
        with contextlib.suppress(sqlite3.Error):
            row = db.get_mode(self.conn, modes.HOST)
            self._host_mode_reason = str(row[2] or "") if row else ""
        return self._host_mode_reason != "initial_mode"
