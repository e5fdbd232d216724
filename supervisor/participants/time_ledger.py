"""Each game's time split and money (ledger/accounting.py), kept in `<state_dir>/accounting.json`
for `rlsup status`."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from checkpoints.atomic import write_json_atomic
from supervisor.config import Config
from supervisor.ledger import accounting
from supervisor.observe import readonly
from supervisor.participants.tick import Event, TickView
from training import protocol

log = structlog.get_logger("rlsup.supervisor")


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

    def tick(self, view: TickView) -> list[Event]:
        return []  # its own thread writes

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg  # games added or removed: the next write folds them anew

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        self.write()  # the split up to the stop: status carries it on as "paused"
