"""The tick's participants: the parts beside the games' lives that start with the supervisor,
act once a tick, follow a configuration reload and close at its exit. The preemption watch,
the alert hooks, the metrics export, the mirror's uploader and this host's spare worker are
each one; the daemon
lists them in one place (`Supervisor._participants`) and calls them in that order.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil  # type: ignore[import-untyped]
import structlog

from checkpoints.atomic import write_json_atomic
from supervisor.config import Config, GameSpec
from supervisor.launch.launcher import LauncherSeam
from supervisor.launch.spare import SpareWant, decide, spare_device
from supervisor.ledger import accounting, db
from supervisor.ledger.journal import Journal
from supervisor.ledger.recorder import Recorder
from supervisor.lifecycle.runtime import GameRuntime
from supervisor.lifecycle.states import TERMINAL
from supervisor.mirror.uploader import Uploader
from supervisor.observe import readonly
from supervisor.observe.hooks import HookRunner
from supervisor.observe.metrics import MetricsExporter
from supervisor.stability import modes
from supervisor.stability.policy import Vitals
from supervisor.stability.preemption import Notice, PreemptionWatcher
from training import protocol

log = structlog.get_logger("rlsup.supervisor")

log = structlog.get_logger("rlsup.supervisor")

HOOKS_CLOSE_WAIT_S = 5.0  # at shutdown, for the alerts of the last events to go out


class Participant(Protocol):
    def start(self) -> None: ...

    def tick(self, now: float, stopping: bool) -> None: ...

    def reconfigure(self, cfg: Config) -> None: ...

    def close(self) -> None: ...


@dataclass
class Started:
    """What exists from `start()` on, made there in one piece: the state database, its
    journal and recorder, the modes last read and the participants, in their order."""

    conn: sqlite3.Connection
    journal: Journal
    recorder: Recorder
    mode_view: modes.ModeView
    participants: list[Participant]
    spare: SpareTending
    hooks: HookAlerts
    uploads: MirrorUploads
    preemption: PreemptionWatch


class HookAlerts:
    """`[[hooks]]`: alert programs run on events (the Recorder hands them every event it
    records); a failed or dropped run becomes a `hook_failed` event."""

    def __init__(self, cfg: Config, recorder: Recorder) -> None:
        self.recorder = recorder
        self.runner: HookRunner | None = None
        self.reconfigure(cfg)  # before the first event: a host_reboot alert is one of them

    def start(self) -> None:
        pass

    def reconfigure(self, cfg: Config) -> None:
        """The runner of the configuration now in force (hooks of the old one still running
        finish on their own, bounded by their timeouts)."""
        if self.runner is not None:
            self.runner.close(wait_s=0.0, then_kill=False)
        self.runner = HookRunner(cfg.hooks, log_dir=cfg.logs_dir) if cfg.hooks else None
        self.recorder.on_event = self.runner.fire if self.runner is not None else None

    def tick(self, now: float, stopping: bool) -> None:
        if self.runner is None:
            return
        results, dropped = self.runner.drain()
        for r in results:
            if r.failed and r.hook < len(self.runner.hooks):
                self.recorder.event("hook_failed", r.game, r.detail(self.runner.hooks[r.hook]))
        if dropped:
            self.recorder.event("hook_failed", None, {"dropped": dropped, "error": "queue full"})

    def close(self) -> None:
        if self.runner is not None:
            # Alerts of the last events (supervisor_stop, a FATAL) get a moment to go out.
            self.runner.close(wait_s=HOOKS_CLOSE_WAIT_S)


class TimeLedger:
    """Each game's time split and money (ledger/accounting.py), written to
    `<state_dir>/accounting.json` at start, every SNAPSHOT_EVERY_S by its own thread and once
    more at the supervisor's exit: `rlsup status` reads it and carries each game's current part
    on to now. The split is a fold kept in memory and brought up to date with the events after
    the last one folded (a tick reads only what is new); the file keeps the fold too, so a
    restart folds only the tail (a fold there that does not validate is folded anew)."""

    def __init__(self, cfg: Config, steady: Callable[[], float] | None = None) -> None:
        self.cfg = cfg
        self.steady = steady  # the supervisor's step-free clock: the events' `mono`
        self.rows_read = 0  # by the last write: the new events only, after the first
        self._fold: accounting.Fold | None = None
        self._lock = threading.Lock()  # the thread's writes and the one at close
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rlsup-accounting", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.write()  # at once: status has a fresh split (and the fold) from the start
        while not self._stop.wait(accounting.SNAPSHOT_EVERY_S):
            self.write()

    def write(self) -> None:
        with self._lock:
            conn = readonly.connect_readonly(self.cfg.db_path)
            if conn is None:
                return
            try:
                self._write(conn)
            except (sqlite3.Error, OSError, ValueError) as exc:  # status folds the tail meanwhile
                log.warning("accounting_snapshot_failed", error=str(exc))
            finally:
                conn.close()

    def _write(self, conn: sqlite3.Connection) -> None:
        cfg = self.cfg
        names = [g.name for g in cfg.games]
        fold = self._fold
        if fold is None or set(fold.games) != set(names):  # the first, or games (re)configured
            snap = accounting.read_snapshot(cfg.state_dir, self._bad)
            fold = accounting.resume_fold(conn, snap, names, self._bad)
            if fold is not None and set(fold.games) != set(names):
                fold = None
            fold = fold or accounting.Fold(names)
        fold.gpus = accounting.host_gpus(conn)
        # Chunks with a pause between: a first fold of a big ledger must not starve the tick.
        self.rows_read = accounting.catch_up(conn, fold, accounting.CHUNK_PAUSE_S)
        self._fold = fold
        steps = {}
        for name in names:
            hb = protocol.read_heartbeat(cfg.run_dir(name))
            if hb is not None:
                steps[name] = hb.global_step
        now = time.time()
        steady = self.steady() if self.steady is not None else None
        t_now = fold.t_at(now, steady, os.getpid())
        rate, share = float(cfg.cost_per_hour or 0.0), cfg.gpu_cost_share
        times = fold.result(now, rate, share, steps, t_now=t_now)
        rates = fold.money_rates(rate, share)
        snap = accounting.snapshot(times, now, rate, share, rates, fold)
        write_json_atomic(cfg.state_dir / accounting.SNAPSHOT_FILE, snap, durable=False)

    @staticmethod
    def _bad(key: str, value: Any, want: str) -> None:
        shown = repr(value)[:80]
        log.warning("accounting_fold_rebuilt", key=key, value=shown, expected=want,
                    action="folded again from the ledger's start")  # fmt: skip

    def tick(self, now: float, stopping: bool) -> None:
        pass

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg  # games added or removed: the next write folds them anew

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        self.write()  # the split up to the stop: status carries it on as "paused"


class MetricsExport:
    """`[metrics]`: the Prometheus export (a listener and/or a textfile), refreshed by its own
    thread; its failures become `metrics_failed` events."""

    def __init__(self, cfg: Config, recorder: Recorder) -> None:
        self.cfg, self.recorder = cfg, recorder
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

    def tick(self, now: float, stopping: bool) -> None:
        if self.exporter is not None:
            for failure in self.exporter.drain():
                self.recorder.event("metrics_failed", None, failure)

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.stop()


class MirrorUploads:
    """`[mirror]`: the uploader process (this host's games; on several hosts, each host
    mirrors its own and this only turns mirror.json's changes into events)."""

    def __init__(self, cfg: Config, recorder: Recorder, *, local: bool) -> None:
        self.uploader = Uploader(cfg, recorder.event, local)

    def start(self) -> None:
        pass

    def tick(self, now: float, stopping: bool) -> None:
        if not stopping:
            self.uploader.tick(now)

    def reconfigure(self, cfg: Config) -> None:
        self.uploader.reconfigure(cfg)

    def close(self) -> None:
        self.uploader.stop()


class SpareTending:
    """`[spare]`: keep this host's pre-warmed spare worker (or drop it) as the policy says,
    and its row for `rlsup status`."""

    def __init__(
        self,
        cfg: Config,
        recorder: Recorder,
        launcher: LauncherSeam,
        conn: sqlite3.Connection,
        *,
        games: Callable[[], Iterable[GameRuntime]],
        view: Callable[[], modes.ModeView],
        latest: Callable[[], Vitals | None],
        wall: Callable[[], float],
        held: Callable[[], bool] = lambda: False,
        placed: Callable[[GameSpec], bool] = lambda spec: False,
    ) -> None:
        self.cfg, self.recorder, self.launcher, self.conn = cfg, recorder, launcher, conn
        self.games, self.view, self.latest, self.wall = games, view, latest, wall
        self.held = held  # a preemption notice stands: nothing new is warmed
        self.placed = placed  # the game's workers start placed on a GPU: never from a spare
        self._row: dict[str, Any] | None = None  # the spare's row last written
        self._ram_total_mb = psutil.virtual_memory().total / 2**20
        self._host_mode_reason = ""  # why the host runs its mode (modes.reason), last read

    def start(self) -> None:
        pass

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg

    def tick(self, now: float, stopping: bool) -> None:
        if not stopping:
            self.tend(self.want(), now)

    def close(self) -> None:
        pass  # the launcher closes the spare with itself: no spare outlives the supervisor

    def tend(self, want: SpareWant, now: float) -> None:
        for kind, game, detail in self.launcher.tend_spare(want, now):
            self.recorder.event(kind, game, detail)
        row = self.launcher.spare_row()
        if row is not None and row != self._row:
            self._row = row
            self.recorder.spare({**row, "updated": self.wall()})

    def want(self) -> SpareWant:
        """Whether this host keeps a spare now ([spare] enabled; "auto": not under memory
        pressure, not where the policy stepped the host down to its lowest mode, not when no
        game is left to start), for which device, with its log."""
        cfg = self.cfg
        # A spare is rlsup's own worker, pre-warmed: it never serves a command game, nor a
        # game placed on a GPU (its worker starts cold, with that GPU's CUDA_VISIBLE_DEVICES).
        servable = [g for g in cfg.games if g.command is None and not self.placed(g)]
        device = spare_device([g.device for g in servable] or ["cpu"])
        log_path, cwd = cfg.logs_dir / "spare.log", cfg.state_dir
        if all(rt.state in TERMINAL or rt.spec.command is not None for rt in self.games()):
            return SpareWant(False, "no game left to start", device, log_path, cwd)
        if not servable:
            why = "every game is placed on a GPU and starts cold: a spare could serve none"
            return SpareWant(False, why, device, log_path, cwd)
        if self.held():
            return SpareWant(False, "a preemption notice stands", device, log_path, cwd)
        row = self.launcher.spare_row() or {}
        latest = self.latest()
        want, reason = decide(
            cfg.spare.enabled,
            cfg.spare.min_ram_available_pct,
            ram_available_pct=latest.ram_available_pct if latest is not None else None,
            ram_total_mb=self._ram_total_mb,
            spare_rss_mb=row.get("rss_mb"),
            have_spare=row.get("state") in ("warming", "ready"),
            lowest_rung=self.lowest_rung(),
        )
        return SpareWant(want, reason, device, log_path, cwd)

    def lowest_rung(self) -> bool:
        """The host runs its lowest mode because the policy stepped it down there (or an
        operator pinned it): not merely because initial_mode names the lowest rung."""
        names, view = self.cfg.mode_names, self.view()
        if len(names) < 2 or view.host.name != names[0]:
            return False
        if modes.HOST in view.pinned:
            return True
        with contextlib.suppress(sqlite3.Error):
            row = db.get_mode(self.conn, modes.HOST)
            self._host_mode_reason = str(row[2] or "") if row else ""
        return self._host_mode_reason != "initial_mode"


# A notice whose deadline passed this long ago while this supervisor still runs was not carried
# out (or the machine came back): starts resume.
PREEMPTION_LAPSE_S = 300.0
PREEMPTION_BUDGET_WINDOW_S = 86400.0
# A final checkpoint is asked for only where it comes at least this long after the notice's.
FINAL_CHECKPOINT_MIN_GAP_S = 5.0


def write_checkpoint_request(run_dir: Path, notice: Notice, *, final: bool = False) -> bool:
    """`<run_dir>/checkpoint.request` replaced atomically by the notice's JSON (a fresh
    mtime: a new request, for readers that look only at that); False when the game has no
    run dir yet. `final`: the last one before the deadline (`"final": true`)."""
    if not run_dir.is_dir():
        return False
    body: dict[str, Any] = {
        "reason": protocol.PREEMPTION_REASON,
        "deadline": notice.deadline,
        "provider": notice.provider,
    }
    if final:
        body["final"] = True
    write_json_atomic(run_dir / protocol.CHECKPOINT_REQUEST_FILE, body, durable=False)
    return True


class PreemptionWatch:
    """`[preemption]`: the cloud's notice that it takes this machine. On one: a
    `preemption_notice` event (and its alerts), every game asked to checkpoint now (its run
    dir's checkpoint.request), and `holding()` true: no game starts, no spare is warmed, and a
    worker that dies meanwhile is requeued without counting against its restart budget (as
    long as the day's notices stay within `max_preemptions`)."""

    def __init__(
        self,
        cfg: Config,
        recorder: Recorder,
        conn: sqlite3.Connection,
        boot_id: Callable[[], str],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.recorder, self.conn = cfg, recorder, conn
        self.boot_id, self.wall = boot_id, wall
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

    def worker_env(self, env: dict[str, str] | None) -> dict[str, str] | None:
        """A new worker's environment, with the deadline while a notice stands."""
        if self.standing is None:
            return env
        return {**(env or {}), protocol.PREEMPTION_DEADLINE_ENV: f"{self.standing.deadline:.3f}"}

    def holding(self) -> bool:
        return self.standing is not None

    def excuses_deaths(self) -> bool:
        """Deaths now are the preemption's, not the game's (within the day's budget)."""
        return self.standing is not None and self.counted

    def tick(self, now: float, stopping: bool) -> None:
        for report in self.watcher.drain():
            if report.kind == "notice" and report.notice is not None:
                self.notice(report.notice)
            elif report.kind == "cleared" and self.standing is not None:
                self.clear("the metadata service no longer posts it")
            elif report.kind == "failed":
                self.recorder.event("preemption_watch_failed", None, report.detail or {})
            elif report.kind == "recovered":
                log.info("preemption_watch_recovered", **(report.detail or {}))
            elif report.kind == "detected":
                log.info("preemption_watch", **(report.detail or {}))
        notice = self.standing
        if notice is not None and self.final_due is not None and self.wall() >= self.final_due:
            self.final_due = None
            self.ask_final(notice)
        if notice is not None and self.wall() > notice.deadline + PREEMPTION_LAPSE_S:
            self.clear(f"its deadline passed {PREEMPTION_LAPSE_S:g} s ago and this host runs on")

    def notice(self, notice: Notice) -> None:
        if self.standing is not None and self.standing.deadline == notice.deadline:
            return
        self.standing = notice
        since, earlier = self.wall() - PREEMPTION_BUDGET_WINDOW_S, 0
        with contextlib.suppress(sqlite3.Error):
            earlier = len(db.events(self.conn, since=since, kind="preemption_notice"))
        self.counted = earlier < self.cfg.preemption.max_preemptions
        asked, failed = [], {}
        for g in self.cfg.games:
            try:
                if write_checkpoint_request(self.cfg.run_dir(g.name), notice):
                    asked.append(g.name)
            except OSError as exc:  # a full disk: the others are still asked
                failed[g.name] = str(exc)
        detail = {
            **notice.as_dict(),
            "boot_id": self.boot_id(),
            "in_s": round(notice.deadline - self.wall(), 3),
            "checkpoint_requested": asked,
            **({"request_failed": failed} if failed else {}),
            "counted": self.counted,
            "max_preemptions": self.cfg.preemption.max_preemptions,
        }
        self.recorder.event("preemption_notice", None, detail)
        # One more checkpoint just before the deadline, unless the notice came too late for
        # a second one to be worth it (its own checkpoint is then the last).
        lead = self.cfg.preemption.final_checkpoint_s
        due = notice.deadline - lead
        worth_it = lead > 0 and due - self.wall() >= FINAL_CHECKPOINT_MIN_GAP_S
        self.final_due = due if worth_it else None

    def ask_final(self, notice: Notice) -> None:
        asked, failed = [], {}
        for g in self.cfg.games:
            try:
                if write_checkpoint_request(self.cfg.run_dir(g.name), notice, final=True):
                    asked.append(g.name)
            except OSError as exc:
                failed[g.name] = str(exc)
        detail = {
            **notice.as_dict(),
            "boot_id": self.boot_id(),
            "in_s": round(notice.deadline - self.wall(), 3),
            "checkpoint_requested": asked,
            **({"request_failed": failed} if failed else {}),
        }
        self.recorder.event("preemption_final_checkpoint", None, detail)

    def clear(self, why: str) -> None:
        notice, self.standing, self.final_due = self.standing, None, None
        detail = {**(notice.as_dict() if notice else {}), "boot_id": self.boot_id(), "why": why}
        self.recorder.event("preemption_cleared", None, detail)
