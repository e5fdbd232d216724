"""The supervisor's main loop: spawn workers, watch them, restart from checkpoints.

"Monitor returns, loop decides": signal handlers only set flags; one `tick()` (with an
injected monotonic clock) reads exits, heartbeats and the desired mode, then decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import random
import selectors
import signal
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import structlog

from supervisor import db, modes, scaling, vitals
from supervisor.config import (
    Config,
    ConfigError,
    GameSpec,
    ModeSpec,
    check_runs_match,
    load_config,
    worker_config,
)
from supervisor.gpugate import GateConfig, GpuGate, NvmlLike, need_mb, worker_env
from supervisor.journal import Journal
from supervisor.launcher import (
    Launcher,
    WorkerProcess,
    find_leftover,
    start_ticks,
    stop_leftovers,
)
from supervisor.oomwatch import KernelOomWatch, OomVerdict
from supervisor.restart import (
    ExitInfo,
    ExitKind,
    backoff_delay_s,
    budget_exhausted,
    classify_exit,
    consecutive_after_exit,
    failures_in_window,
)
from supervisor.sdnotify import Notifier
from supervisor.states import ACTIVE, ALIVE, TERMINAL, Transition, WorkerState, transition
from training import protocol

log = structlog.get_logger("rlsup.supervisor")
S = WorkerState
VITALS_EVERY_S = 5.0
SAMPLES_EVERY_S = 60.0
SAMPLES_KEEP_S = 7 * 24 * 3600.0
SAMPLES_MAX_ROWS = 10_080  # a week at one row a minute


class LockHeld(RuntimeError):
    """Another supervisor holds the state directory."""


class StartFailed(RuntimeError):
    """The supervisor could not start (its state database could not be opened or read)."""


def acquire_lock(state_dir: Path) -> int:
    """Exclusive flock on <state_dir>/supervisor.lock; returns the fd (kept open)."""
    path = state_dir / "supervisor.lock"
    # O_NOFOLLOW: a symlink planted as the lock must not make us write through it.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LockHeld(
            f"another rlsup supervisor (pid {holder}) already runs on {state_dir} (it holds {path})"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@dataclass
class GameRuntime:
    """What the loop knows about one game's worker."""

    spec: GameSpec
    state: WorkerState = S.STOPPED
    reason: str = ""
    state_since: float = 0.0  # wall clock, for the DB
    proc: WorkerProcess | None = None
    mode: ModeSpec | None = None  # the sizes the current worker was started with
    restarts: int = 0
    failures: list[float] = field(default_factory=list)  # monotonic times, budget window
    consecutive: int = 0  # backoff exponent
    backoff_until: float = 0.0
    stop_reason: str | None = None
    kill_at: float | None = None
    # liveness, by our own monotonic clock
    heartbeat: protocol.Heartbeat | None = None
    seq_at: float = 0.0
    step_at: float = 0.0
    phase_at: float = 0.0
    first_step: int | None = None
    progressed: bool = False
    seen_quarantined: set[str] = field(default_factory=set)
    spawn_wall: float = 0.0
    gpu_wait_since: float | None = None  # monotonic; waiting for free GPU memory
    gpu_peak_mb: dict[tuple[int, int | str, int], float] = field(default_factory=dict)
    checkpoint_failures: int = 0  # the current worker's heartbeat counter, as last seen
    killed: bool = False  # the supervisor sent the current worker SIGKILL
    seen_replay_damage: int = 0  # entries of the current worker's heartbeat replay_damage seen
    seen_write_failures: dict[str, int] = field(default_factory=dict)  # as last reported


@dataclass
class Flags:
    stop: bool = False
    reload: bool = False


# The stability policy's seam: called once a tick (before modes are applied) with the state
# connection, the config and the wall clock; it changes modes via modes.set_auto_mode().
# Default: scaling.StabilityPolicy. An optional `request()` makes it run at its next call.
PolicyStep = Callable[[sqlite3.Connection, Config, float], None]
_DEFAULT = "default"


def gate_config(cfg: Config) -> GateConfig:
    return GateConfig(
        min_free_mb=cfg.gpu.min_free_mb, poll_s=cfg.gpu.poll_s, timeout_s=cfg.gpu.timeout_s
    )


class Supervisor:
    def __init__(
        self,
        cfg: Config,
        *,
        launcher: Launcher | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        exit_when_done: bool = False,
        notifier: Notifier | None = None,
        cores: int | None = None,
        gpu_probe: NvmlLike | None = None,
        policy: PolicyStep | str | None = _DEFAULT,
        sampler: vitals.VitalsSampler | None = None,
        oom_watch: KernelOomWatch | None = None,
    ) -> None:
        self.cfg = cfg
        self.launcher = launcher or Launcher()
        self.clock = clock
        self.wall = wall
        # The step-free clock: the wall clock once, then monotonic. Incident windows,
        # cooldowns (events.mono, modes.since) and vitals run on it, so a wall-clock step of
        # minutes neither hides an incident nor delays a step down; `ts` stays the wall clock.
        self._anchor = (wall(), clock())
        self.oom_watch = oom_watch or KernelOomWatch()
        self.exit_when_done = exit_when_done
        self.notifier = notifier or Notifier()
        self.cores = cores or len(os.sched_getaffinity(0))
        self.flags = Flags()
        # One NVML probe: the vitals sampler's GPU readings and the GPU gate's free memory.
        self.probe: NvmlLike = gpu_probe if gpu_probe is not None else vitals.NvmlProbe()
        self.sampler = sampler or vitals.VitalsSampler(
            cfg.state_dir,
            VITALS_EVERY_S,
            probe=self.probe if isinstance(self.probe, vitals.NvmlProbe) else None,
            clock=self.steady,
        )
        self.gate = GpuGate(self.probe, gate_config(cfg))
        # policy: the stability policy by default; None turns automatic scaling off.
        self.policy: PolicyStep | None = (
            scaling.StabilityPolicy(self.sampler.latest) if isinstance(policy, str) else policy
        )
        self._next_sample = 0.0
        self._last_sample_ts: float | None = None
        self.games: dict[str, GameRuntime] = {g.name: GameRuntime(g) for g in cfg.games}
        self.removed: dict[str, GameRuntime] = {}
        self.conn: sqlite3.Connection | None = None
        self.journal: Journal | None = None
        self.mode_view: modes.ModeView | None = None
        self.boot_id = ""
        self.stopping = False
        self.stop_deadline = 0.0
        self.finished = False
        self.rng = random.Random()
        self.selector = selectors.DefaultSelector()
        self._wake_r = self._wake_w = -1
        self._next_watchdog = 0.0
        self._tick_errors = 0
        self._last_status = ""

    # ---- lifecycle ----------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.start()
        except (OSError, sqlite3.Error) as exc:
            # Before the loop the state database must open and be read (the boot ledger, the
            # leftovers to stop): say so plainly; every write after that is journaled.
            self.close()
            where = self.cfg.state_dir
            raise StartFailed(f"cannot open the state database in {where}: {exc}") from exc
        try:
            while not self.finished:
                self.safe_tick()
                if not self.finished:
                    self.wait(min(self.cfg.tick_s, self.notifier.watchdog_s or self.cfg.tick_s))
        finally:
            self.close()
        return 0

    def steady(self) -> float:
        """Seconds since the epoch, read from the wall clock once and then kept by the
        monotonic clock: immune to wall-clock steps for this supervisor's life."""
        wall0, mono0 = self._anchor
        return wall0 + (self.clock() - mono0)

    def start(self) -> None:
        self._install_signals()
        self.conn = db.connect(
            self.cfg.state_dir, busy_timeout_ms=db.SUPERVISOR_BUSY_TIMEOUT_MS, owner=True
        )
        self.journal = Journal(self.conn, clock=self.clock, wall=self.wall, rng=self.rng)
        now_wall = self.wall()
        self.boot_id = db.read_boot_id()
        outcome = db.classify_boot(self.conn, self.boot_id, now_wall)
        boot_time = psutil.boot_time()
        self.journal.write(lambda c: db.apply_boot(c, outcome, now_wall, boot_time))
        if outcome.same_boot:
            # Draining leftovers can outlast systemd's start timeout: ask for the time.
            self.notifier.extend_timeout(self.cfg.stop_grace_s + 30, "stopping leftover workers")
        leftovers = self._stop_leftovers() if outcome.same_boot else []
        host_mode = modes.resume_host_mode(
            self.conn, self.cfg, self.steady(), write=self.journal.write
        )
        if any(g.device != "cpu" for g in self.cfg.games):
            # CUDA workers: expandable segments (less fragmentation) unless the operator chose.
            # The launcher passes the supervisor's environment on.
            os.environ.update(worker_env(os.environ))
        self.sampler.start()
        me = psutil.Process()
        supervisor_row = {
            "pid": os.getpid(),
            "pid_create_time": me.create_time(),
            "pid_start_ticks": start_ticks(os.getpid()),
            "boot_id": self.boot_id,
            "started": now_wall,
            "last_tick": now_wall,
            "config_path": str(self.cfg.path),
            "state": "running",
            "systemd_unit": systemd_unit(os.environ),
        }
        self.journal.write(lambda c: db.set_supervisor(c, **supervisor_row))
        if outcome.kind == "host_reboot":
            self.event(
                "host_reboot",
                None,
                {
                    "boot_id": self.boot_id,
                    "previous_boot_id": outcome.previous_boot_id,
                    "downtime_s": outcome.downtime_s,
                    "unexpected": True,
                },
            )
        self.event(
            "supervisor_start",
            None,
            {
                "pid": os.getpid(),
                "boot_id": self.boot_id,
                "after": outcome.kind,
                "downtime_s": outcome.downtime_s,
                "leftover_workers_stopped": leftovers,
                "config": str(self.cfg.path),
                "host_mode": host_mode,
            },
        )
        log.info(
            "supervisor_start",
            after=outcome.kind,
            boot_id=self.boot_id,
            downtime_s=outcome.downtime_s,
            leftovers=leftovers,
            games=list(self.games),
        )
        self._restore_states()
        self.refresh_modes()
        now = self.clock()
        for rt in self.games.values():
            if rt.state is S.STOPPED:
                self._set(rt, S.WAITING, "queued")
        self.notifier.ready(self.summary())
        self._next_watchdog = now

    def _stop_leftovers(self) -> list[int]:
        """Same boot, new supervisor: stop any worker of ours still alive BEFORE starting one."""
        assert self.conn is not None
        procs = [
            p
            for row in db.workers(self.conn)
            if (p := find_leftover(row["pid"], row.get("pid_start_ticks"), row["pid_create_time"]))
            is not None
        ]
        if not procs:
            return []
        log.warning("leftover_workers", pids=[p.pid for p in procs])
        return stop_leftovers(procs, self.cfg.stop_grace_s)

    def _restore_states(self) -> None:
        """A game recorded DONE whose checkpoints reached total_steps stays done."""
        assert self.conn is not None
        rows = {r["game"]: r for r in db.workers(self.conn)}
        for name, rt in self.games.items():
            row = rows.get(name)
            rt.restarts = row["restarts"] if row else 0
            if (
                row
                and row["state"] == S.DONE
                and latest_checkpoint_step(self.cfg.run_dir(name)) >= rt.spec.total_steps
            ):
                rt.state = S.DONE
                rt.reason = row["reason"] or "done"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            signal.set_wakeup_fd(-1)
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.selector.close()
        self.notifier.close()
        self.sampler.stop()
        if self.journal is not None and not self.journal.flush(force=True):
            log.error(
                "state_db_unflushed",
                pending=self.journal.pending,
                reason="the state database still fails; these writes are lost",
            )
        if self.conn is not None:
            self.conn.close()

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, None)

        def on_stop(signum: int, frame: Any) -> None:
            self.flags.stop = True

        def on_hup(signum: int, frame: Any) -> None:
            self.flags.reload = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)

    def wait(self, timeout: float) -> None:
        """Sleep until a worker exits (its pidfd turns readable), a signal arrives, or timeout."""
        for key, _ in self.selector.select(timeout):
            if key.fd == self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_r, 512):
                        pass

    # ---- the tick -------------------------------------------------------------------------

    def safe_tick(self) -> None:
        try:
            self.tick()
            self._tick_errors = 0
        except Exception:
            self._tick_errors += 1
            log.exception("tick_failed", consecutive=self._tick_errors)
            if self._tick_errors >= 30:
                raise

    def tick(self) -> None:
        now = self.clock()
        if not self.stopping and self._stop_requested():
            self.begin_shutdown(now, "rlsup stop (a request in the state database)")
        if self.flags.stop and not self.stopping:
            self.begin_shutdown(now, "signal")
        if self.flags.reload:
            self.flags.reload = False
            self.reload(now)
        self.reap(now)
        if not self.stopping:
            self.observe(now)
            self.record_vitals(now)
            self.run_policy()
            self.refresh_modes()
            self.apply_modes(now)
            self.schedule(now)
        self.escalate(now)
        self.persist()
        self.notify(now)
        if self.stopping and not any(rt.proc for rt in self._all()):
            self.finish_shutdown()
        elif (
            self.exit_when_done
            and not self.stopping
            and all(rt.state in TERMINAL for rt in self.games.values())
        ):
            self.begin_shutdown(now, "all games done or fatal")

    def _stop_requested(self) -> bool:
        """`rlsup stop` by an operator who may not signal us (the service runs as another
        user) leaves a request in the database; a request older than this start is stale."""
        assert self.conn is not None and self.journal is not None
        try:
            request = db.pending_request(self.conn, db.STOP_REQUEST)
        except sqlite3.Error:
            return False
        if request is None:
            return False
        self.journal.write(lambda c: db.clear_request(c, db.STOP_REQUEST))
        if request[1] < self._anchor[0]:
            return False
        log.info("stop_requested", by=request[0])
        return True

    def run_policy(self) -> None:
        if self.policy is None:
            return
        assert self.conn is not None and self.journal is not None
        if not self.journal.healthy:
            # Its decisions must persist (they survive reboots): automatic scaling waits for
            # the state database to take writes again; supervision goes on.
            return
        try:
            self.policy(self.conn, self.cfg, self.steady())
        except sqlite3.Error as exc:
            log.warning("policy_skipped", reason=f"state database: {exc}")
        except Exception:
            # A policy bug must not stop supervision: keep the modes as they are.
            log.exception("policy_failed")

    def refresh_modes(self) -> None:
        """Read the modes in force once a tick (operators' pins arrive through the database);
        when the database cannot be read, keep supervising with the last view."""
        assert self.conn is not None
        try:
            self.mode_view = modes.view(self.conn, self.cfg)
        except sqlite3.Error as exc:
            if self.mode_view is None:
                raise
            log.warning("modes_unreadable", error=str(exc), kept="the modes last read")

    @property
    def view(self) -> modes.ModeView:
        assert self.mode_view is not None
        return self.mode_view

    def _poke_policy(self) -> None:
        request = getattr(self.policy, "request", None)
        if callable(request):
            request()

    def record_vitals(self, now: float) -> None:
        """The sampler's latest reading into `samples` about once a minute; keep a week."""
        if now < self._next_sample:
            return
        latest = self.sampler.latest()
        if latest is None or latest.ts == self._last_sample_ts:
            return
        self._next_sample = now + SAMPLES_EVERY_S
        self._last_sample_ts = latest.ts
        assert self.journal is not None
        data = json.dumps(vitals.to_json(latest), allow_nan=False)

        def write_sample(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO samples(ts, data) VALUES (?, ?)", (latest.ts, data))
            c.execute(vitals.prune_older_sql(), (latest.ts - SAMPLES_KEEP_S,))
            c.execute(vitals.prune_sql(SAMPLES_MAX_ROWS))

        # Keyed: while the database fails, only the newest sample waits (samples are history).
        self.journal.write(write_sample, key="samples")

    def _all(self) -> list[GameRuntime]:
        return [*self.games.values(), *self.removed.values()]

    # ---- state changes --------------------------------------------------------------------

    def _set(self, rt: GameRuntime, target: WorkerState, reason: str, **detail: Any) -> Transition:
        pid = rt.proc.pid if rt.proc else None
        tr = transition(
            rt.spec.name, rt.state, target, reason, pid=pid, restarts=rt.restarts, **detail
        )
        rt.state, rt.reason, rt.state_since = target, reason, self.wall()
        if target in (S.EXITED, S.STOPPED, S.FATAL, S.DONE):
            self.gate.clear(rt.spec.name)  # the worker is gone or its wait is abandoned
            rt.gpu_wait_since = None
        if tr.kind != "worker_state":
            self.event(
                tr.kind,
                rt.spec.name,
                {
                    "from": str(tr.source),
                    "to": str(target),
                    "reason": reason,
                    "pid": pid,
                    "restarts": rt.restarts,
                    **detail,
                },
            )
        self._write_worker(rt)
        return tr

    def event(self, kind: str, game: str | None, detail: dict[str, Any]) -> None:
        assert self.journal is not None
        ts, mono = self.wall(), self.steady()
        self.journal.write(lambda c: db.add_event(c, kind, game, detail, ts, mono))

    # ---- exits ----------------------------------------------------------------------------

    def reap(self, now: float) -> None:
        for rt in self._all():
            if rt.proc is None:
                continue
            rc = rt.proc.poll()
            if rc is not None:
                self.on_exit(rt, classify_exit(rc), now)
        for name in [n for n, rt in self.removed.items() if rt.proc is None]:
            del self.removed[name]

    def on_exit(self, rt: GameRuntime, info: ExitInfo, now: float) -> None:
        assert rt.proc is not None
        proc, uptime = rt.proc, now - rt.proc.started_mono
        self._observe_heartbeat(rt, now)  # the last words: quarantined checkpoints, step
        error = self._read_error(rt)
        detail: dict[str, Any] = {
            "returncode": info.returncode,
            "exit": str(info.kind),
            "uptime_s": round(uptime, 3),
        }
        oom: OomVerdict | None = None
        if rt.killed:
            detail["killed_by_supervisor"] = True
        elif info.returncode == -signal.SIGKILL:
            # Not ours. An OOM kill only on the kernel's word (its log, or a cgroup counter).
            oom = self.oom_watch.verdict(proc.pid, proc.start_ticks)
            detail["kernel_oom"], detail["oom_evidence"] = oom.killed, oom.evidence
        if rt.heartbeat is not None:
            detail["global_step"] = rt.heartbeat.global_step
            detail["last_checkpoint_step"] = rt.heartbeat.last_checkpoint_step
        if error:
            detail["error"] = {k: error.get(k) for k in ("kind", "message", "step")}
        self._set(rt, S.EXITED, info.description, **detail)
        self._checkpoint_events(rt, error)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(proc.pidfd)
        proc.close()
        rt.proc, rt.kill_at = None, None
        stop_reason, rt.stop_reason = rt.stop_reason, None
        self._after_exit(rt, info, error, stop_reason, uptime, now, oom)
        rt.killed = False

    def _after_exit(
        self,
        rt: GameRuntime,
        info: ExitInfo,
        error: dict[str, Any] | None,
        stop_reason: str | None,
        uptime: float,
        now: float,
        oom: OomVerdict | None = None,
    ) -> None:
        name = rt.spec.name
        if info.kind is ExitKind.DONE:
            self._set(rt, S.DONE, "total_steps reached")
        elif rt.spec.name in self.removed:
            self._set(rt, S.STOPPED, "removed from the configuration")
        elif info.kind is ExitKind.CONFIG:
            msg = (error or {}).get("message") or "configuration error (exit 78)"
            self._set(rt, S.FATAL, f"configuration error: {msg}")
        elif self.stopping:
            self._set(rt, S.STOPPED, "supervisor shutdown")
        elif stop_reason in ("mode_change", "slots", "readded") or (
            info.kind is ExitKind.STOPPED and stop_reason != "hang"
        ):
            # Asked to stop (or stopped by someone else after a checkpoint): not a failure.
            self._set(rt, S.WAITING, stop_reason or "stopped after a checkpoint (exit 75)")
        else:
            cause = "hang" if stop_reason == "hang" else str(info.kind)
            kernel_oom = oom is not None and oom.killed is True
            if kernel_oom:
                cause = "kernel OOM kill"
            if stop_reason != "hang":
                oomed = info.kind is ExitKind.OOM or kernel_oom
                self.event(
                    "worker_oom" if oomed else "worker_crash",
                    name,
                    {
                        "returncode": info.returncode,
                        "description": info.description,
                        "error_kind": (error or {}).get("kind"),
                        "message": (error or {}).get("message"),
                        "traceback": (error or {}).get("traceback"),
                        "uptime_s": round(uptime, 3),
                        **({"killed_by_supervisor": True} if rt.killed else {}),
                        **(
                            {"kernel_oom": oom.killed, "oom_evidence": oom.evidence}
                            if oom is not None
                            else {}
                        ),
                    },
                )
            # A crash right after a resume is no evidence against the checkpoint (an env that
            # failed to build, a signal from outside, an error in evaluation): the next start
            # resumes from the same newest one, and the budget ends a real crash loop.
            self._poke_policy()  # an OOM right after start steps down before the restart
            self._failure(rt, f"{cause}: {info.description}", uptime, now)

    def _failure(self, rt: GameRuntime, why: str, uptime: float, now: float) -> None:
        r = self.cfg.restart
        rt.failures = failures_in_window([*rt.failures, now], now, r.budget_window_s)
        rt.consecutive = consecutive_after_exit(rt.consecutive, uptime, r.stable_after_s)
        if budget_exhausted(rt.failures, now, r.budget_window_s, r.budget):
            self._set(
                rt,
                S.FATAL,
                f"restart budget spent: {len(rt.failures)} failures in "
                f"{r.budget_window_s:g} s (budget {r.budget}); last: {why}",
            )
            return
        delay = backoff_delay_s(
            rt.consecutive, r.backoff_base_s, r.backoff_max_s, self.rng.random()
        )
        rt.backoff_until = now + delay
        self._set(
            rt, S.BACKOFF, why, delay_s=round(delay, 3), failures=len(rt.failures), budget=r.budget
        )

    def _checkpoint_events(self, rt: GameRuntime, error: dict[str, Any] | None) -> None:
        """The worker's error.json, when it is about checkpoints, becomes its own event."""
        kind = str((error or {}).get("kind") or "")
        if kind in ("no_valid_checkpoint", "checkpoint_corrupt"):
            event = "checkpoint_corrupt"
        elif kind == "checkpoint_unreadable":
            event = "checkpoint_unreadable"
        elif kind.startswith("checkpoint") and kind != "checkpoint_mismatch":
            event = "checkpoint_failed"
        else:
            return
        self.event(
            event,
            rt.spec.name,
            {"error_kind": kind, "message": error.get("message") if error else None},
        )

    def _read_error(self, rt: GameRuntime) -> dict[str, Any] | None:
        """The exited worker's error.json: the one it wrote itself (by pid, not by file time,
        which a wall-clock step makes meaningless); a leftover of another run is ignored."""
        error = protocol.read_json_file(self.cfg.run_dir(rt.spec.name) / protocol.ERROR_FILE)
        if error is None or rt.proc is None or error.get("pid") != rt.proc.pid:
            return None
        return error

    # ---- heartbeats and hangs -------------------------------------------------------------

    def observe(self, now: float) -> None:
        for rt in self.games.values():
            if rt.proc is None or rt.state not in (S.STARTING, S.RUNNING):
                continue
            self._observe_heartbeat(rt, now)
            if rt.state is S.STARTING and rt.heartbeat is not None:
                self._set(
                    rt,
                    S.RUNNING,
                    "first heartbeat",
                    resumed_from_step=rt.heartbeat.resumed_from_step,
                )
            hang = self._hang_reason(rt, now)
            if hang:
                hb = rt.heartbeat
                self.event(
                    "worker_hang",
                    rt.spec.name,
                    {
                        "reason": hang,
                        "pid": rt.proc.pid,
                        "phase": hb.phase if hb else None,
                        "global_step": hb.global_step if hb else None,
                    },
                )
                log.warning("worker_hang", game=rt.spec.name, reason=hang, pid=rt.proc.pid)
                self.request_stop(rt, "hang", now + self.cfg.watchdog.kill_grace_s)

    def _observe_heartbeat(self, rt: GameRuntime, now: float) -> None:
        if rt.proc is None:
            return
        hb = protocol.read_heartbeat(self.cfg.run_dir(rt.spec.name))
        if hb is None or hb.pid != rt.proc.pid:
            return
        old = rt.heartbeat
        if old is None or hb.seq != old.seq:
            rt.seq_at = now
        if old is None or hb.global_step != old.global_step:
            rt.step_at = now
        if old is None or hb.phase != old.phase:
            rt.phase_at = now
        if rt.first_step is None:
            rt.first_step = hb.global_step
        elif hb.global_step > rt.first_step:
            rt.progressed = True
        for name in hb.quarantined:
            if name not in rt.seen_quarantined:
                rt.seen_quarantined.add(name)
                self.event("checkpoint_corrupt", rt.spec.name, {"checkpoint": name})
        if hb.checkpoint_failures > rt.checkpoint_failures:
            rt.checkpoint_failures = hb.checkpoint_failures
            self.event(
                "checkpoint_failed",
                rt.spec.name,
                {
                    "error": hb.last_checkpoint_error,
                    "step": hb.global_step,
                    "failures": hb.checkpoint_failures,
                    "last_checkpoint_step": hb.last_checkpoint_step,
                },
            )
            log.warning("checkpoint_failed", game=rt.spec.name, error=hb.last_checkpoint_error)
        for kind, failures in sorted(hb.write_failures.items()):
            if failures and not rt.seen_write_failures.get(kind):
                # The first failed write of its kind in this worker's life (a full disk under
                # the run dir or the log): survived by the worker, reported once here.
                self.event("write_failed", rt.spec.name, {"file": kind, "failures": failures})
                log.warning("worker_write_failed", game=rt.spec.name, file=kind)
            rt.seen_write_failures[kind] = failures
        for damage in hb.replay_damage[rt.seen_replay_damage :]:
            self.event("replay_damaged", rt.spec.name, dict(damage))
            log.warning("replay_damaged", game=rt.spec.name, **damage)
        rt.seen_replay_damage = max(rt.seen_replay_damage, len(hb.replay_damage))
        if hb.gpu_mem_mb is not None and rt.mode is not None:
            sizes = rt.mode.sizes()
            rt.gpu_peak_mb[sizes] = max(rt.gpu_peak_mb.get(sizes, 0.0), hb.gpu_mem_mb)
            self.gate.clear(rt.spec.name)  # its memory is now visible to NVML
        rt.heartbeat = hb

    def _hang_reason(self, rt: GameRuntime, now: float) -> str | None:
        """Hung = a frozen process, or no step progress past the phase's deadline.

        The heartbeat thread publishes about once a second whatever the worker is doing, so a
        `seq` that stops means the process is frozen (SIGSTOP, the GIL held): the configured
        limit applies. Step progress may legitimately pause longer (a big PPO update, loading a
        large replay buffer, an evaluation): then the worker's own `phase_deadline_s`, measured
        from its iterations, extends the limit.
        """
        wd, hb = self.cfg.watchdog, rt.heartbeat
        limit = wd.hang_timeout_s if rt.progressed else wd.startup_grace_s
        seq_idle = now - rt.seq_at
        if hb is None and seq_idle > limit:
            return f"no heartbeat within {limit:g} s of start"
        if seq_idle > limit:
            return f"heartbeat seq unchanged for {seq_idle:.1f} s (limit {limit:g} s)"
        step_limit = limit
        if hb is not None and hb.phase != "starting":
            step_limit = max(limit, float(hb.phase_deadline_s or 0))
        step_idle = now - max(rt.step_at, rt.phase_at)
        if step_idle > step_limit:
            return (
                f"global_step stuck at {hb.global_step if hb else None} for {step_idle:.1f} s "
                f"in phase {hb.phase if hb else None} (limit {step_limit:g} s)"
            )
        return None

    # ---- stopping -------------------------------------------------------------------------

    def request_stop(self, rt: GameRuntime, reason: str, kill_at: float) -> None:
        if rt.proc is None:
            return
        if rt.state is not S.STOPPING:
            self._set(rt, S.STOPPING, reason)
            rt.stop_reason = reason
        self.launcher.terminate(rt.proc)
        rt.kill_at = kill_at if rt.kill_at is None else min(rt.kill_at, kill_at)

    def escalate(self, now: float) -> None:
        for rt in self._all():
            if rt.proc is not None and rt.kill_at is not None and now >= rt.kill_at:
                log.warning(
                    "worker_kill",
                    game=rt.spec.name,
                    pid=rt.proc.pid,
                    reason=f"no exit within the grace after SIGTERM ({rt.stop_reason})",
                )
                self.launcher.kill(rt.proc)
                rt.killed = True
                rt.kill_at = now + 3600  # once

    def begin_shutdown(self, now: float, why: str) -> None:
        self.stopping = True
        self.stop_deadline = now + self.cfg.stop_grace_s
        log.info("supervisor_stopping", reason=why, grace_s=self.cfg.stop_grace_s)
        self.notifier.stopping("stopping: " + why)
        for rt in self._all():
            if rt.proc is not None:
                self.request_stop(rt, "shutdown", self.stop_deadline)
            elif rt.state in (S.WAITING, S.BACKOFF):
                self._set(rt, S.STOPPED, "supervisor shutdown")

    def finish_shutdown(self) -> None:
        assert self.journal is not None
        now, boot_id = self.wall(), self.boot_id

        def stopped(c: sqlite3.Connection) -> None:
            db.mark_clean_stop(c, boot_id, now)
            db.set_supervisor(c, state="stopped", last_tick=now)

        self.journal.write(stopped)
        self.event("supervisor_stop", None, {"pid": os.getpid(), "clean": True})
        self.journal.flush(force=True)  # close() tries once more and says what was lost
        log.info("supervisor_stop", clean=True)
        self.finished = True

    # ---- modes and scheduling -------------------------------------------------------------

    def apply_modes(self, now: float) -> None:
        """Restart workers whose effective mode changed; stop the ones over the cap."""
        for rt in self.games.values():
            if rt.state in (S.STARTING, S.RUNNING) and rt.mode is not None:
                want = self.view.game(rt.spec.name)
                if want.sizes() != rt.mode.sizes():
                    log.info("mode_change", game=rt.spec.name, old=rt.mode.name, new=want.name)
                    self.request_stop(rt, "mode_change", now + self.cfg.stop_grace_s)
        cap = self.view.host.max_concurrent
        holding = [
            rt
            for rt in self.games.values()
            if rt.state in ACTIVE and rt.stop_reason not in ("mode_change", "slots")
        ]
        for rt in reversed(holding[cap:]):
            if rt.state is S.BACKOFF:
                self._set(rt, S.WAITING, "over max_concurrent")
            else:
                self.request_stop(rt, "slots", now + self.cfg.stop_grace_s)

    def schedule(self, now: float) -> None:
        cap = self.view.host.max_concurrent
        active = sum(1 for rt in self.games.values() if rt.state in ACTIVE)
        due = [
            rt for rt in self.games.values() if rt.state is S.BACKOFF and now >= rt.backoff_until
        ]
        waiting = [rt for rt in self.games.values() if rt.state is S.WAITING]
        starters = due + waiting[: max(0, cap - active)]
        gated = [rt for rt in starters if self._gpu_gate(rt, now)]
        if not gated:
            return
        planned = sum(1 for rt in self.games.values() if rt.state in ALIVE) + len(gated)
        threads = max(1, self.cores // max(1, planned))
        for rt in gated:
            self.spawn(rt, threads, now)

    def _gpu_gate(self, rt: GameRuntime, now: float) -> bool:
        """May this game's worker start now? CPU games always. CUDA (or auto) games once the
        GPU's free memory covers their need (the observed peak at this mode plus a margin,
        else gpu.min_free_mb), or past gpu.timeout_s at one rung lower. Without an NVIDIA
        driver the gate always says start."""
        if rt.spec.device == "cpu":
            return True
        assert self.conn is not None and self.journal is not None
        name = rt.spec.name
        current = self.view.game(name)
        lighter = modes.one_rung_lower(self.cfg, current)
        pinned = bool({name, modes.HOST} & self.view.pinned)
        need = need_mb(self.gate.cfg, rt.gpu_peak_mb.get(current.sizes()))
        result = self.gate.check(name, need, now, at_floor=lighter is None or pinned)
        if result.action == "start":
            if rt.gpu_wait_since is not None:
                log.info("gpu_ready", game=name, reason=result.reason)
            rt.gpu_wait_since = None
            return True
        if result.action == "wait":
            if rt.gpu_wait_since is None:
                rt.gpu_wait_since = now
                self.event(
                    "gpu_wait",
                    name,
                    {
                        "reason": result.reason,
                        "free_mb": _round(result.free_mb),
                        "need_mb": round(result.need_mb),
                        "mode": current.name,
                    },
                )
                log.info("gpu_wait", game=name, reason=result.reason)
            return False
        # fallback: one rung lower, now
        assert lighter is not None
        self.event(
            "gpu_wait",
            name,
            {
                "timed_out": True,
                "reason": result.reason,
                "free_mb": _round(result.free_mb),
                "need_mb": round(result.need_mb),
                "from": current.name,
                "to": lighter.name,
            },
        )
        modes.set_auto_mode(
            self.conn, self.cfg, name, lighter.name, [result.reason], self.steady(),
            write=self.journal.write,
        )  # fmt: skip
        self.mode_view = dataclasses.replace(
            self.view, games={**self.view.games, name: lighter}
        )  # in force now, whether or not the database has taken it yet
        rt.gpu_wait_since = None
        return True

    def spawn(self, rt: GameRuntime, threads: int, now: float) -> None:
        name = rt.spec.name
        mode = self.view.game(name)
        restarting = rt.state is S.BACKOFF
        try:
            proc = self._launch(rt, mode, threads, now)
        except OSError as exc:
            # A full disk, a full process table, a failed pidfd: no child is left running
            # (the launcher kills what it cannot track); retried after a backoff.
            self._failure(rt, f"cannot spawn the worker: {exc}", 0.0, now)
            return
        if restarting:
            rt.restarts += 1
        rt.proc, rt.mode, rt.heartbeat = proc, mode, None
        rt.seq_at = rt.step_at = rt.phase_at = now
        rt.first_step, rt.progressed, rt.stop_reason, rt.kill_at = None, False, None, None
        rt.checkpoint_failures, rt.killed, rt.seen_replay_damage = 0, False, 0
        rt.seen_write_failures = {}
        rt.spawn_wall = self.wall()
        self._set(
            rt,
            S.STARTING,
            "restart after backoff" if restarting else "slot free",
            mode=mode.name,
            num_envs=mode.num_envs,
            batch_size=mode.batch_size,
            n_steps=mode.n_steps,
            threads=threads,
        )

    def _launch(self, rt: GameRuntime, mode: ModeSpec, threads: int, now: float) -> WorkerProcess:
        name = rt.spec.name
        run_dir = db.make_private_dir(self.cfg.run_dir(name))
        logs_dir = db.make_private_dir(self.cfg.logs_dir)
        rotate_log(logs_dir / f"{name}.log")
        wcfg = worker_config(rt.spec, mode, run_dir, self.cfg.checkpoint_every_s, threads)
        with contextlib.suppress(FileNotFoundError):
            (run_dir / protocol.HEARTBEAT_FILE).unlink()
        proc = self.launcher.spawn(wcfg.to_argv(), logs_dir / f"{name}.log", now, cwd=run_dir)
        try:
            self.selector.register(proc.pidfd, selectors.EVENT_READ, name)
        except (OSError, ValueError) as exc:
            self.launcher.kill(proc)
            proc.popen.wait()
            proc.close()
            raise OSError(f"cannot watch the new worker's pidfd: {exc}") from exc
        return proc

    # ---- reload -----------------------------------------------------------------------------

    def reload(self, now: float) -> None:
        self.notifier.reloading()
        try:
            self._reload(now)
        finally:
            self.notifier.ready(self.summary())

    def _reload(self, now: float) -> None:
        try:
            new = load_config(self.cfg.path)
            check_runs_match(_replace_state_dir(new, self.cfg.state_dir))
        except ConfigError as exc:
            log.error("config_error", error=str(exc), kept="previous configuration")
            self.event("config_error", None, {"message": str(exc), "kept": "previous"})
            return
        if new.state_dir != self.cfg.state_dir:
            log.warning("config_reload_state_dir_ignored", old=str(self.cfg.state_dir))
            new = _replace_state_dir(new, self.cfg.state_dir)
        old_names = set(self.games)
        self.cfg = new
        self.gate.cfg = gate_config(new)
        for g in new.games:
            if g.name in self.games:
                self.games[g.name].spec = g
            elif g.name in self.removed:
                # Re-added while its old worker still stops: the same runtime takes it back,
                # so its next worker starts only once this one has exited (never two).
                rt = self.games[g.name] = self.removed.pop(g.name)
                rt.spec, rt.stop_reason = g, "readded"
            else:
                self.games[g.name] = GameRuntime(g, state_since=self.wall())
                self._set(self.games[g.name], S.WAITING, "added by config reload")
        for name in old_names - {g.name for g in new.games}:
            rt = self.games.pop(name)
            if rt.proc is not None:
                self.removed[name] = rt
                self.request_stop(rt, "removed", now + new.stop_grace_s)
        self.games = {g.name: self.games[g.name] for g in new.games}
        assert self.conn is not None and self.journal is not None
        modes.resume_host_mode(self.conn, new, self.steady(), write=self.journal.write)
        self.refresh_modes()
        self.event("config_reload", None, {"path": str(new.path), "games": list(self.games)})
        log.info("config_reload", games=list(self.games))

    # ---- persistence and systemd ------------------------------------------------------------

    def _write_worker(self, rt: GameRuntime, *, flush: bool = True) -> None:
        assert self.journal is not None
        hb = rt.heartbeat
        row = {
            "state": str(rt.state),
            "pid": rt.proc.pid if rt.proc else None,
            "pid_create_time": rt.proc.create_time if rt.proc else None,
            "pid_start_ticks": rt.proc.start_ticks if rt.proc else None,
            "mode": rt.mode.name if rt.mode else None,
            "num_envs": rt.mode.num_envs if rt.mode else None,
            "batch_size": (
                rt.mode.batch_size
                if rt.mode and isinstance(rt.mode.batch_size, int)
                else (hb.batch_size if hb else None)
            ),
            "restarts": rt.restarts,
            "state_since": rt.state_since,
            "reason": rt.reason,
            "heartbeat": json.dumps(hb.to_json()) if hb else None,
            "updated": self.wall(),
        }
        name = rt.spec.name
        # Keyed: while the database fails, only a game's newest row waits to be written.
        self.journal.write(
            lambda c: db.upsert_worker(c, name, **row), key=f"worker:{name}", flush=flush
        )

    def persist(self) -> None:
        """Every worker's row and the tick, in one transaction (and, after an outage's
        backoff, whatever is still queued before them)."""
        assert self.journal is not None
        for rt in self._all():
            self._write_worker(rt, flush=False)
        now, boot_id = self.wall(), self.boot_id

        def ticked(c: sqlite3.Connection) -> None:
            db.touch_boot(c, boot_id, now)
            db.set_supervisor(c, last_tick=now)

        self.journal.write(ticked, key="tick", flush=False)
        self.journal.flush()

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for rt in self.games.values():
            counts[str(rt.state)] = counts.get(str(rt.state), 0) + 1
        return "rlsup: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))

    def notify(self, now: float) -> None:
        if self.notifier.watchdog_s and now >= self._next_watchdog and self._tick_errors == 0:
            self.notifier.watchdog()
            self._next_watchdog = now + self.notifier.watchdog_s
        text = self.summary()
        if text != self._last_status:
            self.notifier.status(text)
            self._last_status = text


def _round(x: float | None) -> int | None:
    return None if x is None else round(x)


def _replace_state_dir(cfg: Config, state_dir: Path) -> Config:
    return dataclasses.replace(cfg, state_dir=state_dir)


def systemd_unit(env: Mapping[str, str]) -> str | None:
    """The systemd unit running this process (from its cgroup), when systemd started it."""
    if not env.get("INVOCATION_ID"):
        return None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith(".service"):
                return part
    return None


def latest_checkpoint_step(run_dir: Path) -> int:
    """Step of the newest committed checkpoint directory name (-1 when there is none)."""
    best = -1
    with contextlib.suppress(OSError):
        for entry in os.scandir(run_dir / protocol.CHECKPOINT_DIR):
            if entry.name.startswith("ckpt-") and entry.name[5:].isdigit():
                best = max(best, int(entry.name[5:]))
    return best


LOG_ROTATE_BYTES = 64 << 20


def rotate_log(path: Path, limit: int = LOG_ROTATE_BYTES) -> None:
    """Keep one previous worker log (`.1`) once the current one passes `limit` bytes."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > limit:
            os.replace(path, path.with_name(path.name + ".1"))
