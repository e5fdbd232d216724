"""`[preemption]`'s part in the tick: the life of a notice, from its first sighting to its end.

On a notice: a `preemption_notice` event, every game asked to checkpoint now (its run dir's
checkpoint.request), and a `Hold` that holds: no game starts, no spare is warmed, and a worker
that dies meanwhile is requeued without counting against its restart budget (as long as the
day's notices stay within `max_preemptions`). Just before the deadline, one more checkpoint is
asked for; a notice the metadata service withdraws, or whose deadline passed long ago while
this host runs on, is cleared. The daemon reads it first in each tick (`watch()`: a notice is
news from outside, like an exit) and hands its one `hold()` to the lifecycle and the view.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import structlog

from supervisor.config import Config
from supervisor.ledger import db
from supervisor.preemption.notice import NO_HOLD, Hold, Notice, write_checkpoint_request
from supervisor.preemption.watcher import PreemptionWatcher

log = structlog.get_logger("rlsup.supervisor")

# (kind, game, detail): an event for the daemon to record (the Recorder is the one writer).
Event = tuple[str, str | None, dict[str, Any]]

# A notice whose deadline passed this long ago while this supervisor still runs was not carried
# out (or the machine came back): starts resume.
PREEMPTION_LAPSE_S = 300.0
PREEMPTION_BUDGET_WINDOW_S = 86400.0
# A final checkpoint is asked for only where it comes at least this long after the notice's.
FINAL_CHECKPOINT_MIN_GAP_S = 5.0


class PreemptionWatch:
    """The watcher thread and the standing notice: `watch()` once a tick returns the events of
    the notice's life; `hold()` is what it means for that tick."""

    def __init__(
        self,
        cfg: Config,
        conn: sqlite3.Connection,
        boot_id: str,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.conn, self.boot_id, self.wall = cfg, conn, boot_id, wall
        self.watcher = PreemptionWatcher(cfg.preemption, wall=wall)
        self.standing: Notice | None = None
        self.counted = False  # the standing notice is within the day's max_preemptions
        self.final_due: float | None = None  # when the final checkpoint is asked for (Unix s)

    def start(self) -> None:
        self.watcher.start()

    def reconfigure(self, cfg: Config) -> None:
        old, self.cfg = self.cfg.preemption, cfg
        if cfg.preemption != old:
            self.watcher.stop()
            self.watcher = PreemptionWatcher(cfg.preemption, wall=self.wall)
            self.watcher.start()

    def close(self) -> None:
        self.watcher.stop()

    def tick(self, view: object) -> list[Event]:
        """Nothing at the participants' turn: its news came first in the tick (`watch()`)."""
        return []

    def hold(self) -> Hold:
        return Hold(self.standing, self.counted) if self.standing is not None else NO_HOLD

    def holding(self) -> bool:
        return self.hold().holding

    def excuses_deaths(self) -> bool:
        """Deaths now are the preemption's, not the game's (within the day's budget)."""
        return self.hold().excuses_deaths

    def watch(self) -> list[Event]:
        """What the watcher thread learned since the last tick, and the standing notice's
        due steps (its final checkpoint, its lapse): the events they make."""
        out: list[Event] = []
        for report in self.watcher.drain():
            if report.kind == "notice" and report.notice is not None:
                out += self.notice(report.notice)
            elif report.kind == "cleared" and self.standing is not None:
                out.append(self.clear("the metadata service no longer posts it"))
            elif report.kind == "failed":
                out.append(("preemption_watch_failed", None, report.detail or {}))
            elif report.kind == "recovered":
                log.info("preemption_watch_recovered", **(report.detail or {}))
            elif report.kind == "detected":
                log.info("preemption_watch", **(report.detail or {}))
        notice = self.standing
        if notice is not None and self.final_due is not None and self.wall() >= self.final_due:
            self.final_due = None
            out.append(self.ask_final(notice))
        if notice is not None and self.wall() > notice.deadline + PREEMPTION_LAPSE_S:
            why = f"its deadline passed {PREEMPTION_LAPSE_S:g} s ago and this host runs on"
            out.append(self.clear(why))
        return out

    def notice(self, notice: Notice) -> list[Event]:
        if self.standing is not None and self.standing.deadline == notice.deadline:
            return []
        self.standing = notice
        since, earlier = self.wall() - PREEMPTION_BUDGET_WINDOW_S, 0
        with contextlib.suppress(sqlite3.Error):
            earlier = len(db.events(self.conn, since=since, kind="preemption_notice"))
        self.counted = earlier < self.cfg.preemption.max_preemptions
        detail = {
            **self._ask(notice, final=False),
            "counted": self.counted,
            "max_preemptions": self.cfg.preemption.max_preemptions,
        }
        # One more checkpoint just before the deadline, unless the notice came too late for
        # a second one to be worth it (its own checkpoint is then the last).
        lead = self.cfg.preemption.final_checkpoint_s
        due = notice.deadline - lead
        worth_it = lead > 0 and due - self.wall() >= FINAL_CHECKPOINT_MIN_GAP_S
        self.final_due = due if worth_it else None
        return [("preemption_notice", None, detail)]

    def ask_final(self, notice: Notice) -> Event:
        return "preemption_final_checkpoint", None, self._ask(notice, final=True)

    def _ask(self, notice: Notice, *, final: bool) -> dict[str, Any]:
        """Every game asked to checkpoint (a full disk fails one game's request, not the
        others'): the detail of the event that says so."""
        asked, failed = [], {}
        for g in self.cfg.games:
            try:
                if write_checkpoint_request(self.cfg.run_dir(g.name), notice, final=final):
                    asked.append(g.name)
            except OSError as exc:
                failed[g.name] = str(exc)
        return {
            **notice.as_dict(),
            "boot_id": self.boot_id,
            "in_s": round(notice.deadline - self.wall(), 3),
            "checkpoint_requested": asked,
            **({"request_failed": failed} if failed else {}),
        }

    def clear(self, why: str) -> Event:
        notice, self.standing, self.final_due = self.standing, None, None
        detail = {**(notice.as_dict() if notice else {}), "boot_id": self.boot_id, "why": why}
        return "preemption_cleared", None, detail
