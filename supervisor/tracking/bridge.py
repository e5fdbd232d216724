"""The tracking bridge: a thread of the supervisor that sends each run's progress rows and
evaluations to the configured sinks, only up to what no resume can redo (progress.py), never
a step twice or backwards, and never in the daemon's tick.

The tick hands it one snapshot of the runs (`post`: the newest replaces the last, so nothing
queues); the thread wakes at most once per PASS_S, reads what is new in each run's
progress.csv (at most progress.MAX_ROWS rows per pass: what waits stays on disk, where the
offset stopped) and its `evaluation` events (the state database, read-only), sends what is
final, then records its position (state.py). A sink that raises is down: `tracking_failed`
once, retried after a backoff (1 s doubling to BACKOFF_MAX_S) from the same position, and
`tracking_ok` once it works again. Training never waits on any of it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from checkpoints.names import ckpt_name, ckpt_step
from supervisor.tracking import progress
from supervisor.tracking.progress import Lives, Row
from supervisor.tracking.sinks import EVAL_PREFIX, Evaluation, RunFacts, Sink
from supervisor.tracking.state import TrackingState
from training.protocol import CHECKPOINT_DIR

log = structlog.get_logger("rlsup.tracking")

PASS_S = 1.0  # at most one pass a second
BACKOFF_MAX_S = 300.0
EVALS_PER_PASS = 500
Event = tuple[str, str | None, dict[str, Any]]


@dataclass
class SinkHealth:
    down_since: float | None = None  # wall clock of the first failure of this outage
    failures: int = 0
    retry_at: float = 0.0  # monotonic
    error: str = ""


class TrackingBridge:
    def __init__(
        self,
        state_dir: Path,
        db_path: Path,
        sinks: Sequence[Sink],
        *,
        pass_s: float = PASS_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sinks = list(sinks)
        self.db_path = db_path
        self.state = TrackingState(state_dir)
        self.pass_s = pass_s
        self.clock = clock
        self.health = {s.name: SinkHealth() for s in self.sinks}
        self.passes = 0  # completed passes (tests, benchmarks)
        self._runs: tuple[RunFacts, ...] = ()
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._db: sqlite3.Connection | None = None

    # ---- the tick's side: never blocks ----------------------------------------------------
    def start(self) -> None:
        if self._thread is None and self.sinks:
            self._thread = threading.Thread(target=self._run, name="tracking", daemon=True)
            self._thread.start()

    def post(self, runs: tuple[RunFacts, ...]) -> None:
        with self._lock:
            self._runs = runs
        self._wake.set()

    def drain(self) -> list[Event]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    # ---- the thread ----------------------------------------------------------------------
    def _tell(self, kind: str, game: str | None, detail: dict[str, Any]) -> None:
        with self._lock:
            self._events.append((kind, game, detail))

    def _run(self) -> None:
        self.state.load()
        if self.state.load_error:
            self._tell("tracking_failed", None, {"sink": "state", "error": self.state.load_error})
        try:
            while not self._stop.is_set():
                began = self.clock()
                self.pass_once()
                self._wake.wait(max(0.0, self.pass_s - (self.clock() - began)))
                self._wake.clear()
            # One last pass on the last runs posted (a game that just finished: its last rows,
            # its final checkpoint), within close()'s timeout.
            self.pass_once()
        finally:
            for sink in self.sinks:
                try:
                    sink.close()
                except Exception:
                    log.exception("tracking_close_failed", sink=sink.name)
            if self._db is not None:
                self._db.close()

    def pass_once(self) -> None:
        with self._lock:
            runs = self._runs
        checkpoints = {run.name: _checkpoints(run.run_dir) for run in runs}
        for sink in self.sinks:
            health = self.health[sink.name]
            if self.clock() < health.retry_at:
                continue
            sent = 0
            try:
                for run in runs:
                    if sink.wants(run):
                        sent += self._pass_run(sink, run, checkpoints[run.name])
            except Exception as exc:
                self._failed(sink, health, exc)
            else:
                if health.down_since is not None:
                    self._tell("tracking_ok", None, {
                        "sink": sink.name, "down_s": round(time.time() - health.down_since, 1),
                        "retries": health.failures, "points": sent,
                    })  # fmt: skip
                    log.info("tracking_ok", sink=sink.name)
                self.health[sink.name] = SinkHealth()
            finally:
                error = self.state.save_quietly()
                if error and health.down_since is None:
                    self._failed(sink, health, OSError(error))
        self.passes += 1

    def _failed(self, sink: Sink, health: SinkHealth, exc: BaseException) -> None:
        delay = min(BACKOFF_MAX_S, 2.0**health.failures)
        health.failures += 1
        health.retry_at = self.clock() + delay
        health.error = f"{type(exc).__name__}: {exc}"[:2000]
        if health.down_since is None:
            health.down_since = time.time()
            self._tell("tracking_failed", None, {
                "sink": sink.name, "error": health.error, "retry_s": delay,
            })  # fmt: skip
            log.warning("tracking_failed", sink=sink.name, error=health.error, retry_s=delay)

    def _pass_run(self, sink: Sink, run: RunFacts, checkpoints: tuple[int, ...]) -> int:
        """One run for one sink: what became final since the last pass. Points sent."""
        st = self.state.run(sink.name, run.name)

        def save(**values: Any) -> None:
            self.state.update(sink.name, run.name, **values)
            self.state.save()  # a run id must be kept before anything is logged to it

        committed = run.committed
        if committed is None or run.life is None:
            committed = checkpoints[-1] if checkpoints else None
        lives = Lives(committed, run.life, run.resumed_from, checkpoints)
        read = progress.read_rows(run.run_dir, int(st.get("offset", 0)), st.get("inode"))
        decided = progress.decide(read.rows, lives) if read else []
        evals = self._evaluations(run, st, committed)
        if not decided and not evals[0] and not (run.done and not st.get("done")):
            return 0
        sink.open_run(run, st, save)
        log_params = getattr(sink, "log_params", None)
        if log_params is not None and not st.get("params") and log_params(run, st):
            self.state.update(sink.name, run.name, params=True)
        step = int(st.get("step", -1))
        rows: list[Row] = []
        skipped: list[Row] = []
        for row, final in decided:
            if not final or not row.values:
                continue
            if row.step > step:
                rows.append(row)
                step = row.step
            elif row.step < step:
                skipped.append(row)
        eval_step = int(st.get("eval_step", -1))
        to_send: list[Evaluation] = []
        for ev in evals[0]:
            if ev.step > eval_step:
                to_send.append(ev)
                eval_step = ev.step
        if rows or to_send:
            sink.send(run, st, rows, to_send)
        updates: dict[str, Any] = {"step": step, "eval_step": eval_step, "eval_id": evals[1]}
        if read is not None and decided:
            updates.update(offset=decided[-1][0].end, inode=read.inode)
        self.state.update(sink.name, run.name, **updates)
        if skipped and st.get("skipped_life") != skipped[-1].life:
            self.state.update(sink.name, run.name, skipped_life=skipped[-1].life)
            self._tell("tracking_skipped", run.name, {
                "sink": sink.name, "points": len(skipped), "from_step": skipped[0].step,
                "to_step": skipped[-1].step, "sent_through": step,
                "reason": "the run resumed from before steps already sent (its newest "
                "checkpoint could not be used): their new values are not sent",
            })  # fmt: skip
        caught_up = read is None or (len(decided) == len(read.rows) < progress.MAX_ROWS)
        if run.done and not run.live and caught_up and not st.get("done"):
            ckpt = (
                run.run_dir / CHECKPOINT_DIR / ckpt_name(checkpoints[-1]) if checkpoints else None
            )
            sink.finish(run, st, ckpt)
            self.state.update(sink.name, run.name, done=True)
        return len(rows) + len(to_send)

    def _evaluations(
        self, run: RunFacts, st: dict[str, Any], committed: int | None
    ) -> tuple[list[Evaluation], int]:
        """The run's `evaluation` events after the last handled, up to the first one past the
        committed step (it waits); and the id handled through."""
        after = int(st.get("eval_id", 0))
        conn = self._connection()
        if conn is None:
            return [], after
        try:
            found = conn.execute(
                "SELECT id, ts, detail FROM events WHERE kind = 'evaluation' AND game = ? "
                "AND id > ? ORDER BY id LIMIT ?",
                (run.name, after, EVALS_PER_PASS),
            ).fetchall()
            # The current worker's start: an earlier life's evaluation past the step this one
            # resumed from was redone (superseded), never sent.
            started = 0
            if found and run.resumed_from is not None:
                started = conn.execute(
                    "SELECT COALESCE(MAX(id), 0) FROM events WHERE kind = 'worker_start' "
                    "AND game = ?",
                    (run.name,),
                ).fetchone()[0]
        except sqlite3.Error:
            return [], after
        out: list[Evaluation] = []
        for event_id, ts, text in found:
            ev = _evaluation(ts, text)
            superseded = ev is not None and event_id < started and ev.step > (run.resumed_from or 0)
            if ev is not None and not superseded:
                if committed is None or ev.step > committed:
                    break
                out.append(ev)
            after = event_id
        return out, after

    def _connection(self) -> sqlite3.Connection | None:
        if self._db is None and self.db_path.exists():
            uri = "file:" + urllib.parse.quote(str(self.db_path.absolute())) + "?mode=ro"
            try:
                self._db = sqlite3.connect(uri, uri=True, timeout=2.0, check_same_thread=False)
            except sqlite3.Error:
                return None
        return self._db


def _evaluation(ts: float, text: str) -> Evaluation | None:
    try:
        detail = json.loads(text)
    except ValueError:
        return None
    step = detail.get("step") if isinstance(detail, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    values: dict[str, float] = {}
    for key, value in detail.items():
        if key in ("step", "time", "pid") or isinstance(value, bool):
            continue
        if isinstance(value, int | float) and value == value and abs(value) != float("inf"):
            values[EVAL_PREFIX + ("mean_return" if key == "mean" else key)] = float(value)
    at = detail.get("time")
    return Evaluation(step, float(at) if isinstance(at, int | float) else float(ts), values)


def _checkpoints(run_dir: Path) -> tuple[int, ...]:
    try:
        names = [entry.name for entry in (run_dir / CHECKPOINT_DIR).iterdir()]
    except OSError:
        return ()
    return tuple(sorted(s for n in names if (s := ckpt_step(n)) is not None))
