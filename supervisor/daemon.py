"""The supervisor: start-up, the tick, and shutdown.

"Monitor returns, loop decides": signal handlers only set flags; one `tick()` (with an injected
monotonic clock) reads exits, heartbeats and the desired modes, then decides. The decisions
are pure and live beside it: where an exit leads (`exits`), whether a worker hangs
(`liveness`), backoff and budget (`restart`), modes (`modes`, `stability`). What the loop holds
per game and per worker process is in `runtime`; every database write goes through `journal`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil  # type: ignore[import-untyped]
import structlog

from supervisor.config import (
    Config,
    ConfigError,
    ModeSpec,
    check_for_service,
    check_runs_match,
    load_config,
    mirror_reload_refusal,
    worker_config,
)
from supervisor.gpu import devices
from supervisor.gpu import place as gpuplace
from supervisor.gpu.gate import GateConfig, GpuGate, NvmlLike, need_mb, worker_env
from supervisor.gpu.moves import GpuMove, PlacedGame
from supervisor.gpu.nvml import GpuSnapshot, NvmlProbe
from supervisor.gpu.place import GpuId
from supervisor.launch.launcher import Launcher
from supervisor.launch.oomwatch import KernelOomWatch
from supervisor.launch.spare import SpareKeeper, SpareWant, decide, spare_device
from supervisor.launch.spawn import WORKER_MODULE, NoRoom, WorkerProcess, rotate_log
from supervisor.ledger import db
from supervisor.ledger.journal import Journal
from supervisor.ledger.recorder import Recorder
from supervisor.lifecycle.exits import StopReason, WorkerExit, route_exit
from supervisor.lifecycle.liveness import Liveness, hang_reason, new_reports
from supervisor.lifecycle.restart import (
    ExitInfo,
    ExitKind,
    backoff_delay_s,
    budget_exhausted,
    classify_exit,
    consecutive_after_exit,
    failures_in_window,
)
from supervisor.lifecycle.runtime import GameRuntime, WorkerLife, reconcile, summary
from supervisor.lifecycle.startup import (
    reboot_event,
    restore_states,
    start_event,
    stop_leftover_workers,
    supervisor_row,
    unrecorded_reports,
)
from supervisor.lifecycle.states import ACTIVE, ALIVE, TERMINAL, Transition, WorkerState, transition
from supervisor.lock import LockHeld, acquire_lock
from supervisor.mirror.uploader import Uploader
from supervisor.observe.hooks import HookRunner
from supervisor.observe.metrics import MetricsExporter
from supervisor.sdnotify import Notifier
from supervisor.stability import modes, scaling, vitals
from supervisor.waker import Waker
from training import protocol

__all__ = ["LockHeld", "StartFailed", "Supervisor", "acquire_lock"]

log = structlog.get_logger("rlsup.supervisor")
S = WorkerState
VITALS_EVERY_S = 5.0
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
HOOKS_CLOSE_WAIT_S = 5.0  # at shutdown, for the alerts of the last events to go out


# A tick's spawns stop once they have taken this long; the rest wait for the next tick.
SPAWN_BUDGET_S = 10.0


class StartFailed(RuntimeError):
    """The supervisor could not start (its state database could not be opened or read)."""


# The stability policy's seam: called once a tick (before modes are applied) with the state
# connection, the config and the step-free clock; it changes modes via modes.set_auto_mode().
# Default: scaling.StabilityPolicy. An optional `request()` makes it run at its next call.
PolicyStep = Callable[[sqlite3.Connection, Config, float], None]
_DEFAULT = "default"


def gate_config(cfg: Config) -> GateConfig:
    return GateConfig(
        min_free_mb=cfg.gpu.min_free_mb, poll_s=cfg.gpu.poll_s, timeout_s=cfg.gpu.timeout_s
    )


def cuda_visible_for(gpu: GpuId) -> str:
    """A worker's CUDA_VISIBLE_DEVICES: its GPU's UUID (inside, that GPU is cuda:0), or the
    index when NVML could not read the UUID."""
    return gpu.uuid or str(gpu.index)


def make_launcher(cfg: Config) -> Launcher:
    """The launcher of `[cluster] backend`: this host, or the hosts of a Ray cluster."""
    if cfg.cluster.backend == "ray":
        from supervisor.launch.ray import RayLauncher  # imports Ray: only for this backend

        return RayLauncher(cfg)
    keeper = SpareKeeper(
        sys.executable,
        WORKER_MODULE,
        warm_timeout_s=cfg.watchdog.startup_grace_s,
        silent_after_s=cfg.watchdog.hang_timeout_s,
    )
    return Launcher(spare=keeper)


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
        self.launcher = launcher or make_launcher(cfg)
        self.clock = clock
        self.wall = wall
        # The step-free clock (`steady`): the wall clock once, then monotonic. Incident
        # windows, cooldowns (events.mono, modes.since) and vitals run on it, so a wall-clock
        # step of minutes neither hides an incident nor delays a step down.
        self._anchor = (wall(), clock())
        self.oom_watch = oom_watch or KernelOomWatch()
        self.exit_when_done = exit_when_done
        self.notifier = notifier or Notifier()
        self.cores = cores or len(os.sched_getaffinity(0))
        self.waker = Waker()
        self.flags = self.waker.flags
        # One NVML probe: the vitals sampler's GPU readings and the GPU gate's free memory.
        self.probe: NvmlLike = gpu_probe if gpu_probe is not None else vitals.NvmlProbe()
        self.sampler = sampler or vitals.VitalsSampler(
            cfg.state_dir,
            VITALS_EVERY_S,
            probe=self.probe if isinstance(self.probe, vitals.NvmlProbe) else None,
            clock=self.steady,
        )
        self.gate = GpuGate(self.probe, gate_config(cfg))
        # GPU placement (this host): the GPUs the supervisor may use are those its own
        # CUDA_VISIBLE_DEVICES shows; each CUDA game's worker gets one of them.
        self.cuda_visible = os.environ.get(CUDA_VISIBLE)
        self.placed: dict[str, GpuId] = {}  # game → the GPU of its current worker
        self._chosen: dict[str, GpuId] = {}  # placed by the gate this tick, not spawned yet
        self._last_gpu: dict[str, GpuId] = {}  # game → the GPU its previous worker had
        self._place_waiting: dict[str, str] = {}  # game → why no GPU (its gpu_wait written)
        self._lost_gpus: set[str] = set()  # UUIDs reported lost (gpu_lost written)
        self._avoid: dict[str, dict[str, float]] = {}  # game → GPU UUID moved off → until (steady)
        self._driver_up: bool | None = None  # NVML answered at the last snapshot seen
        # The auto games that will train on the CPU (device_fallback), for the config read.
        self._cpu_fallback: tuple[Config | None, frozenset[str]] = (None, frozenset())
        # policy: the stability policy by default; None turns automatic scaling off.
        self.policy: PolicyStep | None = (
            scaling.StabilityPolicy(
                self.sampler.latest, gpu_games=self.gpu_games, on_move=self.move_gpu
            )
            if isinstance(policy, str)
            else policy
        )
        self.games: dict[str, GameRuntime] = {g.name: GameRuntime(g) for g in cfg.games}
        self.removed: dict[str, GameRuntime] = {}
        self.conn: sqlite3.Connection | None = None
        self.journal: Journal | None = None
        self.recorder: Recorder | None = None
        self.uploader: Uploader | None = None  # the mirror's, from start() on
        self.mode_view: modes.ModeView | None = None
        self.boot_id = ""
        self.stopping = False
        self.stop_deadline = 0.0
        self.finished = False
        self.rng = random.Random()
        self._tick_errors = 0
        self._no_room: set[str] = set()  # games told "no host has room" (once each)
        self._spare_row: dict[str, Any] | None = None  # the spare's row last written
        self._ram_total_mb = psutil.virtual_memory().total / 2**20
        self._host_mode_reason = ""  # why the host runs its mode (modes.reason), last read
        self.hooks: HookRunner | None = None  # [[hooks]]: alert programs run on events
        self.metrics: MetricsExporter | None = None  # [metrics]: the Prometheus export

    # ---- start-up ---------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.start()
        except StartFailed:
            self.close()
            raise
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
                    self.wait(self.sleep_s())
        finally:
            self.close()
        return 0

    def sleep_s(self) -> float:
        """Until the next tick: tick_s (or the systemd watchdog's interval), or sooner when a
        game's backoff ends (a restart is not delayed by up to a tick)."""
        sleep = min(self.cfg.tick_s, self.notifier.watchdog_s or self.cfg.tick_s)
        if self.stopping:
            return sleep
        due = [rt.backoff_until for rt in self.games.values() if rt.state is S.BACKOFF]
        if due:
            sleep = min(sleep, max(0.0, min(due) - self.clock()) + 0.001)
        return sleep

    def steady(self) -> float:
        """Seconds since the epoch, read from the wall clock once and then kept by the
        monotonic clock: immune to wall-clock steps for this supervisor's life."""
        wall0, mono0 = self._anchor
        return wall0 + (self.clock() - mono0)

    def start(self) -> None:
        self.waker.install()
        self.conn = db.connect(
            self.cfg.state_dir, busy_timeout_ms=db.SUPERVISOR_BUSY_TIMEOUT_MS, owner=True
        )
        self.journal = Journal(self.conn, clock=self.clock, wall=self.wall, rng=self.rng)
        self.recorder = Recorder(self.conn, self.journal, wall=self.wall, steady=self.steady)
        self._configure_hooks()  # before the first event: a host_reboot alert is one of them
        now_wall = self.wall()
        self.boot_id = db.read_boot_id()
        outcome = db.classify_boot(self.conn, self.boot_id, now_wall)
        self.recorder.drop_stale_stop_request()  # before the supervisor row says running
        boot_time = psutil.boot_time()
        # The boot and its verdict in one transaction: a start that dies after recording the
        # boot (a backend down at boot, a kill) must not leave the next start to call it a crash.
        self.journal.write(lambda c: db.apply_boot(c, outcome, now_wall, boot_time), flush=False)
        if (reboot := reboot_event(outcome)) is not None:
            self.event(*reboot)
        self.journal.flush()
        leftovers = []
        worker_rows = db.workers(self.conn)
        if outcome.same_boot:  # a new supervisor: stop our workers still alive BEFORE any start
            leftovers = stop_leftover_workers(worker_rows, self.cfg, self.notifier)
        try:
            self.launcher.connect()
            # Workers of a predecessor on other hosts (their actors), stopped before any start.
            elsewhere = self.launcher.stop_leftovers(self.cfg.stop_grace_s)
        except OSError as exc:
            raise StartFailed(f"backend {self.launcher.backend}: {exc}") from exc
        host_mode = modes.resume_host_mode(
            self.conn, self.cfg, self.steady(), write=self.journal.write
        )
        if any(g.device != "cpu" for g in self.cfg.games):
            # CUDA workers: expandable segments (less fragmentation) unless the operator chose.
            # The launcher passes the supervisor's environment on.
            os.environ.update(worker_env(os.environ))
        self.sampler.start()
        row = supervisor_row(self.boot_id, now_wall, self.cfg.path)
        self.journal.write(lambda c: db.set_supervisor(c, **row))
        started = start_event(outcome, leftovers, self.cfg.path, host_mode)
        self.event("supervisor_start", None, started)
        if elsewhere:
            self.event("leftovers_stopped", None, {"actors": elsewhere, "backend": "ray"})
        for game, kind, detail in unrecorded_reports(self.conn, worker_rows, self.cfg.run_dir):
            self.event(kind, game, detail)
            log.warning(kind, game=game, **detail)
        if self.launcher.backend == "local":  # several hosts: each has its own torch and driver
            for game, detail in self._read_cpu_fallbacks():
                self.event("device_fallback", game, detail)
                log.warning("device_fallback", game=game, **detail)
        log.info(
            "supervisor_start",
            after=outcome.kind,
            boot_id=self.boot_id,
            downtime_s=outcome.downtime_s,
            leftovers=leftovers,
            games=list(self.games),
        )
        restore_states(self.games, db.workers(self.conn), self.cfg.run_dir)
        self._restore_avoided()
        # On several hosts each host mirrors its own games: events from mirror.json only.
        self.uploader = Uploader(self.cfg, self.event, self.launcher.backend == "local")
        self.refresh_modes()
        for rt in self.games.values():
            if rt.state is S.STOPPED:
                self._set(rt, S.WAITING, "queued")
        self._configure_metrics()
        self.notifier.ready(self.summary())

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        if self.hooks is not None:
            # Alerts of the last events (supervisor_stop, a FATAL) get a moment to go out.
            self.hooks.close(wait_s=HOOKS_CLOSE_WAIT_S)
        if self.uploader is not None:
            self.uploader.stop()
        self.launcher.close()
        self.waker.close()
        self.notifier.close()
        self.sampler.stop()
        if self.recorder is not None:
            self.recorder.close()  # says what could not be written
        elif self.conn is not None:
            self.conn.close()

    def wait(self, timeout: float) -> None:
        """Sleep until a worker exits (its pidfd turns readable), a signal arrives, or timeout."""
        self.waker.wait(timeout)

    # ---- the tick ---------------------------------------------------------------------------

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
        assert self.recorder is not None
        if not self.stopping and self.recorder.stop_requested():
            self.begin_shutdown(now, "rlsup stop (a request in the state database)")
        if self.flags.stop and not self.stopping:
            self.begin_shutdown(now, "signal")
        if self.flags.reload:
            self.flags.reload = False
            self.reload(now)
        self.reap(now)
        for kind, game, detail in self.launcher.observe(now):
            self.event(kind, game, detail)
            log.warning(kind, game=game, **detail)
        if not self.stopping:
            self.observe(now)
            self.watch_gpus(now)
            self.recorder.sample(self.sampler.latest(), now)
            self.run_policy()
            self.refresh_modes()
            self.apply_modes(now)
            self.schedule(now)
            self.tend_spare(now)
            if self.uploader is not None:
                self.uploader.tick(now)
        self.escalate(now)
        self.report_observability()
        self.persist()
        self.notify(now)
        if self.stopping and not any(rt.life for rt in self._all()):
            self.finish_shutdown()
        elif (
            self.exit_when_done
            and not self.stopping
            and all(rt.state in TERMINAL for rt in self.games.values())
        ):
            self.begin_shutdown(now, "all games done or fatal")

    # ---- observability: alert hooks and the Prometheus export ------------------------------

    def _configure_hooks(self) -> None:
        """The hook runner of the configuration now in force (a reload replaces it; hooks of
        the old one still running finish on their own, bounded by their timeouts)."""
        assert self.recorder is not None
        if self.hooks is not None:
            self.hooks.close(wait_s=0.0, then_kill=False)
        self.hooks = (
            HookRunner(self.cfg.hooks, log_dir=self.cfg.logs_dir) if self.cfg.hooks else None
        )
        self.recorder.on_event = self.hooks.fire if self.hooks is not None else None

    def _configure_metrics(self) -> None:
        if self.metrics is not None:  # a reload: the old exporter writes no "up 0"
            self.metrics.stop(replaced_by=self.cfg.metrics)
        self.metrics = MetricsExporter(self.cfg) if self.cfg.metrics.enabled else None
        if self.metrics is not None:
            self.metrics.start()

    def report_observability(self) -> None:
        """What the hooks and the metrics thread did since the last tick, as events."""
        if self.hooks is not None:
            results, dropped = self.hooks.drain()
            for r in results:
                if r.failed and r.hook < len(self.hooks.hooks):
                    self.event("hook_failed", r.game, r.detail(self.hooks.hooks[r.hook]))
            if dropped:
                self.event("hook_failed", None, {"dropped": dropped, "error": "queue full"})
        if self.metrics is not None:
            for failure in self.metrics.drain():
                self.event("metrics_failed", None, failure)

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

    def _all(self) -> list[GameRuntime]:
        return [*self.games.values(), *self.removed.values()]

    # ---- state changes and what the database is told --------------------------------------

    def _set(self, rt: GameRuntime, target: WorkerState, reason: str, **detail: Any) -> Transition:
        pid = rt.proc.pid if rt.proc else None
        tr = transition(
            rt.spec.name, rt.state, target, reason, pid=pid, restarts=rt.restarts, **detail
        )
        rt.state, rt.reason, rt.state_since = target, reason, self.wall()
        if target in (S.EXITED, S.STOPPED, S.FATAL, S.DONE):
            self.gate.clear(rt.spec.name)  # the worker is gone or its wait is abandoned
            if (gone := self.placed.pop(rt.spec.name, None)) is not None:
                self._last_gpu[rt.spec.name] = gone
            self._place_waiting.pop(rt.spec.name, None)
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
        assert self.recorder is not None
        self.recorder.event(kind, game, detail)

    def _row(self, rt: GameRuntime, wall: float) -> dict[str, Any]:
        gpu = self.placed.get(rt.spec.name)
        return {**rt.db_row(wall), "gpu": json.dumps(gpu.as_json()) if gpu else None}

    def _write_worker(self, rt: GameRuntime) -> None:
        assert self.recorder is not None
        self.recorder.worker(rt.spec.name, self._row(rt, self.wall()))

    def persist(self) -> None:
        assert self.recorder is not None
        wall = self.wall()
        self.recorder.tick(
            ((rt.spec.name, self._row(rt, wall)) for rt in self._all()), self.boot_id
        )

    # ---- exits ------------------------------------------------------------------------------

    def reap(self, now: float) -> None:
        for rt in self._all():
            if rt.life is not None and (rc := rt.life.proc.poll()) is not None:
                info = classify_exit(rc)
                if rt.life.proc.lost_before_start():
                    info = ExitInfo(ExitKind.START_LOST, rc, f"{info.description} (as the spare)")
                self.on_exit(rt, rt.life, info, now)
        for name in [n for n, rt in self.removed.items() if rt.life is None]:
            del self.removed[name]

    def on_exit(self, rt: GameRuntime, life: WorkerLife, info: ExitInfo, now: float) -> None:
        seen_at = time.monotonic()  # before the reading, closing and events below
        self._observe_heartbeat(rt, life, now)  # its last words: quarantines, its step
        oom = None
        if info.returncode == -signal.SIGKILL and not life.killed:
            # Not ours. An OOM kill only on the kernel's word (its log, or a cgroup counter).
            oom = self.oom_watch.verdict(life.proc.pid, life.proc.start_ticks)
        ex = WorkerExit(info, now - life.proc.started_mono, self._read_error(rt, life),
                        life.live.heartbeat, life.killed, oom)  # fmt: skip
        # The GPU it ran on, in its exit and failure events: OOMs and crashes per GPU.
        on_gpu = {"gpu": gpu.as_json()} if (gpu := self.placed.get(rt.spec.name)) else {}
        self._set(rt, S.EXITED, info.description, **ex.detail(), **on_gpu)
        if event := ex.error_event():
            self.event(event[0], rt.spec.name, event[1])
        self.waker.unwatch(life.proc.pidfd)
        life.proc.close()
        self.launcher.forget(life.proc)
        rt.life = None
        rt.exit_seen_at = seen_at
        removed = rt.spec.name in self.removed
        route = route_exit(info.kind, life.stop_reason, removed=removed, stopping=self.stopping)
        if settled := ex.settle(route, life.stop_reason):
            self._set(rt, *settled)
        else:
            why, failure = ex.failure(life.stop_reason)
            if failure is not None:
                # The full traceback is in the worker's log (and the event); the journal gets
                # one line saying what and where (in `<game>.log.1` if the next start rotates it).
                where = str(self.cfg.logs_dir / f"{rt.spec.name}.log")
                self.event(failure[0], rt.spec.name, {**failure[1], "log": where, **on_gpu})
                d = failure[1]
                log.error(failure[0], game=rt.spec.name, error_kind=d.get("error_kind"),
                          message=d.get("message") or d.get("description"), log=where)  # fmt: skip
            # A crash right after a resume is no evidence against the checkpoint (an env that
            # failed to build, a signal from outside, an error in evaluation): the next start
            # resumes from the same newest one, and the budget ends a real crash loop.
            self._poke_policy()  # an OOM right after start steps down before the restart
            self._failure(rt, why, ex.uptime_s, now)

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

    def _poke_policy(self) -> None:
        request = getattr(self.policy, "request", None)
        if callable(request):
            request()

    def _read_error(self, rt: GameRuntime, life: WorkerLife) -> dict[str, Any] | None:
        """The exited worker's error.json: the one it wrote itself (by pid, not by file time,
        which a wall-clock step makes meaningless); a leftover of another run is ignored."""
        error = protocol.read_json_file(self.cfg.run_dir(rt.spec.name) / protocol.ERROR_FILE)
        return error if error is not None and error.get("pid") == life.proc.pid else None

    # ---- heartbeats and hangs ---------------------------------------------------------------

    def observe(self, now: float) -> None:
        for rt in self.games.values():
            life = rt.life
            if life is None or rt.state not in (S.STARTING, S.RUNNING):
                continue
            self._observe_heartbeat(rt, life, now)
            if rt.state is S.STARTING and (hb := life.live.heartbeat) is not None:
                self._set(rt, S.RUNNING, "first heartbeat", resumed_from_step=hb.resumed_from_step)
            if not life.start_reported and (hb := life.live.heartbeat) is not None:
                self._report_start(rt, life, hb.start)
            hang = hang_reason(life.live, self.cfg.watchdog, now)
            if hang:
                hb = life.live.heartbeat
                self.event(
                    "worker_hang",
                    rt.spec.name,
                    {
                        "reason": hang,
                        "pid": life.proc.pid,
                        "phase": hb.phase if hb else None,
                        "global_step": hb.global_step if hb else None,
                    },
                )
                log.warning("worker_hang", game=rt.spec.name, reason=hang, pid=life.proc.pid)
                self.request_stop(rt, StopReason.HANG, now + self.cfg.watchdog.kill_grace_s)

    def _report_start(self, rt: GameRuntime, life: WorkerLife, marks: dict[str, Any]) -> None:
        """Once its first step is done: how the worker was started (served by the spare or
        cold) and where the time went, from its predecessor's exit seen to that step. The
        worker's marks and these times are on the system's monotonic clock."""
        first = marks.get("first_step")
        if not isinstance(first, int | float):
            return
        life.start_reported = True

        def span(a: Any, b: Any, across: bool = True) -> float | None:
            """b - a; `across`: a is the supervisor's reading, b the worker's (only on one
            host: another host's monotonic clock has another origin)."""
            ok = isinstance(a, int | float) and isinstance(b, int | float)
            return round(b - a, 3) if ok and (life.proc.same_clock or not across) else None

        since = rt.exit_seen_at if rt.exit_seen_at is not None else life.spawned_at
        detail = {
            "served": life.proc.served,
            "pid": life.proc.pid,
            "exit_to_spawn_s": span(rt.exit_seen_at, life.spawned_at, across=False),
            "spawn_to_assigned_s": span(life.spawned_at, marks.get("assigned")),
            "spawn_to_loaded_s": span(life.spawned_at, marks.get("loaded")),
            "loaded_to_first_step_s": span(marks.get("loaded"), first, across=False),
            "total_s": span(since, first),
        }
        rt.last_start = detail
        self.event("worker_training", rt.spec.name, detail)
        log.info("worker_training", game=rt.spec.name, **detail)

    def _observe_heartbeat(self, rt: GameRuntime, life: WorkerLife, now: float) -> None:
        hb = protocol.read_heartbeat(self.cfg.run_dir(rt.spec.name))
        if hb is None or hb.pid != life.proc.pid:
            return
        life.live.observe(hb, now)
        for kind, detail in new_reports(life.reported, hb):
            self.event(kind, rt.spec.name, detail)
            log.warning(kind, game=rt.spec.name, **detail)
        if hb.gpu_mem_mb is not None:
            sizes = life.mode.sizes()
            rt.gpu_peak_mb[sizes] = max(rt.gpu_peak_mb.get(sizes, 0.0), hb.gpu_mem_mb)
            self.gate.clear(rt.spec.name)  # its memory is now visible to NVML

    # ---- stopping ---------------------------------------------------------------------------

    def request_stop(self, rt: GameRuntime, reason: StopReason, kill_at: float) -> None:
        life = rt.life
        if life is None:
            return
        if rt.state is not S.STOPPING:
            self._set(rt, S.STOPPING, reason)
            life.stop_reason = reason
        self.launcher.terminate(life.proc)
        life.kill_at = kill_at if life.kill_at is None else min(life.kill_at, kill_at)

    def escalate(self, now: float) -> None:
        for rt in self._all():
            life = rt.life
            if life is not None and life.kill_at is not None and now >= life.kill_at:
                log.warning(
                    "worker_kill",
                    game=rt.spec.name,
                    pid=life.proc.pid,
                    reason=f"no exit within the grace after SIGTERM ({life.stop_reason})",
                )
                self.launcher.kill(life.proc)
                life.killed, life.kill_at = True, now + 3600  # once

    def begin_shutdown(self, now: float, why: str) -> None:
        self.stopping = True
        self.stop_deadline = now + self.cfg.stop_grace_s
        log.info("supervisor_stopping", reason=why, grace_s=self.cfg.stop_grace_s)
        self.notifier.stopping("stopping: " + why)
        self._spare_events(SpareWant(False, "supervisor shutdown"), now)
        for rt in self._all():
            if rt.life is not None:
                self.request_stop(rt, StopReason.SHUTDOWN, self.stop_deadline)
            elif rt.state in (S.WAITING, S.BACKOFF):
                self._set(rt, S.STOPPED, "supervisor shutdown")

    def finish_shutdown(self) -> None:
        assert self.recorder is not None
        self.recorder.stopped(self.boot_id)
        log.info("supervisor_stop", clean=True)
        self.finished = True

    # ---- modes and scheduling ---------------------------------------------------------------

    def apply_modes(self, now: float) -> None:
        """Restart workers whose effective mode changed; stop the ones over the cap."""
        for rt in self.games.values():
            if rt.state in (S.STARTING, S.RUNNING) and rt.life is not None:
                want, have = self.view.game(rt.spec.name), rt.life.mode
                if want.sizes() != have.sizes():
                    log.info("mode_change", game=rt.spec.name, old=have.name, new=want.name)
                    self.request_stop(rt, StopReason.MODE_CHANGE, now + self.cfg.stop_grace_s)
        cap = self.view.host.max_concurrent
        leaving = (StopReason.MODE_CHANGE, StopReason.SLOTS)
        holding = [
            rt for rt in self.games.values() if rt.state in ACTIVE and rt.stop_reason not in leaving
        ]
        for rt in reversed(holding[cap:]):
            if rt.state is S.BACKOFF:
                self._set(rt, S.WAITING, "over max_concurrent")
            else:
                self.request_stop(rt, StopReason.SLOTS, now + self.cfg.stop_grace_s)

    def schedule(self, now: float) -> None:
        cap = self.view.host.max_concurrent
        games = self.games.values()
        active = sum(1 for rt in games if rt.state in ACTIVE)
        due = [rt for rt in games if rt.state is S.BACKOFF and now >= rt.backoff_until]
        waiting = [rt for rt in games if rt.state is S.WAITING]
        gated = [rt for rt in due + waiting[: max(0, cap - active)] if self._gpu_gate(rt, now)]
        if not gated:
            return
        planned = sum(1 for rt in games if rt.state in ALIVE) + len(gated)
        threads = max(1, self.cores // max(1, planned))
        began = time.monotonic()
        for i, rt in enumerate(gated):
            if time.monotonic() - began > SPAWN_BUDGET_S:
                # A slow backend (a Ray actor's start may take 30 s) must not hold the tick past
                # the systemd watchdog: the rest start next tick, after this one has pinged it.
                deferred = [later.spec.name for later in gated[i:]]
                for name in deferred:
                    self._chosen.pop(name, None)  # the gate places them afresh next tick
                log.info("spawns_deferred", games=deferred, budget_s=SPAWN_BUDGET_S)
                return
            self.spawn(rt, threads, now)

    # ---- the spare worker -------------------------------------------------------------------

    def tend_spare(self, now: float) -> None:
        """Keep this host's pre-warmed spare (or drop it) as the policy says; its row."""
        self._spare_events(self.spare_want(), now)

    def _spare_events(self, want: SpareWant, now: float) -> None:
        for kind, game, detail in self.launcher.tend_spare(want, now):
            self.event(kind, game, detail)
            log.info(kind, game=game, **detail)
        row = self.launcher.spare_row()
        if row is not None and row != self._spare_row:
            self._spare_row = row
            assert self.recorder is not None
            self.recorder.spare({**row, "updated": self.wall()})

    def spare_want(self) -> SpareWant:
        """Whether this host keeps a spare now ([spare] enabled; "auto": not under memory
        pressure, not where the policy stepped the host down to its lowest mode, not when no
        game is left to start), for which device, with its log."""
        cfg = self.cfg
        device = spare_device([g.device for g in cfg.games])
        log_path, cwd = cfg.logs_dir / "spare.log", cfg.state_dir
        if all(rt.state in TERMINAL for rt in self.games.values()):
            return SpareWant(False, "no game left to start", device, log_path, cwd)
        row = self.launcher.spare_row() or {}
        latest = self.sampler.latest()
        want, reason = decide(
            cfg.spare.enabled,
            cfg.spare.min_ram_available_pct,
            ram_available_pct=latest.ram_available_pct if latest is not None else None,
            ram_total_mb=self._ram_total_mb,
            spare_rss_mb=row.get("rss_mb"),
            have_spare=row.get("state") in ("warming", "ready"),
            lowest_rung=self._lowest_rung(),
        )
        return SpareWant(want, reason, device, log_path, cwd)

    def _lowest_rung(self) -> bool:
        """The host runs its lowest mode because the policy stepped it down there (or an
        operator pinned it): not merely because initial_mode names the lowest rung."""
        names = self.cfg.mode_names
        if len(names) < 2 or self.view.host.name != names[0]:
            return False
        if modes.HOST in self.view.pinned:
            return True
        assert self.conn is not None
        with contextlib.suppress(sqlite3.Error):
            row = db.get_mode(self.conn, modes.HOST)
            self._host_mode_reason = str(row[2] or "") if row else ""
        return self._host_mode_reason != "initial_mode"

    def _gpu_gate(self, rt: GameRuntime, now: float) -> bool:
        """May this game's worker start now? CPU games always; CUDA (or auto) games once a
        GPU is placed for them (gpuplace) and its free memory covers their need, or past
        gpu.timeout_s one rung lower (gpugate)."""
        if rt.spec.device == "cpu" or self.launcher.backend != "local":
            return True  # several hosts: Ray's num_gpus places GPU games
        if self._trains_on_cpu(rt.spec.name):
            return True  # auto with a CPU-only torch (device_fallback): no GPU to wait for
        if (never := self._cuda_never_here(rt)) is not None:
            self._set(rt, S.FATAL, never)  # not a wait that no driver will ever end
            return False
        assert self.conn is not None and self.journal is not None
        name, current = rt.spec.name, self.view.game(rt.spec.name)
        peak = rt.gpu_peak_mb.get(current.sizes())
        placed, gpu = self._place(rt, need_mb(self.gate.cfg, peak), now)
        if not placed:
            return False
        lighter = modes.one_rung_lower(self.cfg, current)
        result = self.gate.admit(
            name,
            current.name,
            lighter.name if lighter else None,
            pinned=bool({name, modes.HOST} & self.view.pinned),
            peak_mb=peak,
            now=now,
            index=gpu.index if gpu else 0,
        )
        if result.event is not None:
            gpu_json = gpu.as_json() if gpu else None
            self.event("gpu_wait", name, {**result.event, "gpu": gpu_json})
            log.info("gpu_wait", game=name, reason=result.reason)
        if result.action == "wait":
            return False
        if result.action == "start" and result.waited_s > 0:
            log.info("gpu_ready", game=name, reason=result.reason)
        if result.action == "fallback" and lighter is not None:
            modes.set_auto_mode(
                self.conn, self.cfg, name, lighter.name, [result.reason], self.steady(),
                write=self.journal.write,
            )  # fmt: skip
            # In force now, whether or not the database has taken it yet.
            self.mode_view = dataclasses.replace(
                self.view, games={**self.view.games, name: lighter}
            )
        if gpu is not None:
            self._chosen[name] = gpu
        return True

    def _read_cpu_fallbacks(self) -> list[tuple[str, dict[str, Any]]]:
        """The auto games that will train on the CPU of this host (its torch is CPU-only, its
        NVIDIA driver unused), with their `device_fallback` detail; remembered for this
        configuration (reads torch's metadata: not once a tick)."""
        warnings = devices.cpu_fallback_warnings(self.cfg.games)
        self._cpu_fallback = (self.cfg, frozenset(name for name, _ in warnings))
        return warnings

    def _trains_on_cpu(self, name: str) -> bool:
        """Decided before the gate: an auto game rlsup said will train on the CPU."""
        if self._cpu_fallback[0] is not self.cfg:  # a reload: decide again for its games
            self._read_cpu_fallbacks()
        return name in self._cpu_fallback[1]

    def _cuda_never_here(self, rt: GameRuntime) -> str | None:
        """Why a `device = "cuda"` game can never start on this host (no NVIDIA driver is
        installed: NVML's library is missing), or None. A driver installed but not loaded
        yet (late at boot) is waited for instead."""
        if rt.spec.device != "cuda" or not isinstance(self.probe, NvmlProbe):
            return None
        snap = self.probe.latest()
        if snap.ts == 0.0 or snap.hung or snap.driver or not snap.absent:
            return None
        return devices.no_driver_refusal(snap.reason)

    def _place(self, rt: GameRuntime, need: float, now: float) -> tuple[bool, GpuId | None]:
        """(may it go on to the gate, the GPU it is placed on). Reads the sampler's last
        NVML snapshot only: the tick never calls NVML."""
        probe = self.probe if isinstance(self.probe, NvmlProbe) else None
        if probe is None:
            return True, None  # a bare free-memory seam (tests): the gate alone, on GPU 0
        snap = probe.latest()
        if snap.ts == 0.0:
            return False, None  # the sampler's first reading is moments away
        why = self._unplaceable(rt, snap)
        if why is not None:
            return self._place_wait(rt, why) if why else (True, None)
        slots = self._slots(rt.spec.name, snap, now)
        if not slots:
            return True, None  # no GPU visible: the worker inherits that (auto: on the CPU)
        choice = gpuplace.place(slots, rt.spec.gpu, need, self._avoided(rt.spec.name))
        if choice.gpu is None:
            return self._place_wait(rt, choice.reason)
        if self._place_waiting.pop(rt.spec.name, None) is not None:
            log.info("gpu_placed", game=rt.spec.name, reason=choice.reason)
        return True, choice.gpu

    def _unplaceable(self, rt: GameRuntime, snap: GpuSnapshot) -> str | None:
        """Why the game cannot be placed now: a reason to wait, "" to start unplaced (NVML
        does not answer and the game may run without it), None: place it."""
        if snap.hung:
            return f"NVML does not answer: {snap.reason}"
        if not snap.driver:
            if rt.spec.device == "cuda":
                return f"NVML not available ({snap.reason}): waiting for the driver"
            return ""  # auto: the worker finds CUDA or runs on the CPU
        return None

    def _slots(self, name: str, snap: GpuSnapshot, now: float) -> list[gpuplace.Slot]:
        readings = {g.index: g for g in snap.gpus}
        ids = [GpuId(g.index, g.uuid) for g in snap.gpus]
        ids += [GpuId(lost.index, lost.uuid) for lost in snap.lost]
        placed = {**self.placed, **self._chosen}  # with those placed this tick, not spawned
        out = []
        for gpu in gpuplace.visible(self.cuda_visible, ids):
            reading = readings.get(gpu.index)
            out.append(
                gpuplace.Slot(
                    gpu,
                    reading.mem_free_mb if reading else None,
                    self.gate.reserved_mb(gpu.index, now, but=name),
                    sum(1 for g, on in placed.items() if on == gpu and g != name),
                )
            )
        return out

    def _place_wait(self, rt: GameRuntime, why: str) -> tuple[bool, None]:
        """The game waits for a GPU: one gpu_wait event per reason."""
        name = rt.spec.name
        if self._place_waiting.get(name) != why:
            self._place_waiting[name] = why
            self.event("gpu_wait", name, {"reason": why, "gpu": None})
            log.info("gpu_wait", game=name, reason=why)
        return False, None

    def watch_gpus(self, now: float) -> None:
        """Once a tick, from the sampler's last NVML snapshot: the driver coming or going
        (`gpu_driver`), GPUs lost (`gpu_lost`): the games on a lost GPU are stopped and
        placed again on another (or wait)."""
        if not isinstance(self.probe, NvmlProbe):
            return
        snap = self.probe.latest()
        if snap.ts == 0.0 or snap.hung:
            return
        if snap.driver != self._driver_up:
            first, self._driver_up = self._driver_up is None, snap.driver
            if snap.driver or not first or any(g.device != "cpu" for g in self.cfg.games):
                gpus = [{"index": g.index, "uuid": g.uuid} for g in snap.gpus]
                detail = {"available": snap.driver, "reason": snap.reason, "gpus": gpus}
                self.event("gpu_driver", None, {**detail, "visible": self.cuda_visible})
        if not snap.driver:
            return
        present = {g.uuid for g in snap.gpus}
        errors = {lost.uuid: lost.error for lost in snap.lost}
        gone = {gpu for gpu in self.placed.values() if gpu.uuid not in present}
        gone |= {GpuId(lost.index, lost.uuid) for lost in snap.lost}
        for gpu in sorted(gone, key=lambda g: g.index):
            if gpu.uuid not in self._lost_gpus:
                self._lost_gpus.add(gpu.uuid)
                self._gpu_lost(gpu, errors.get(gpu.uuid, "missing from NVML's devices"), now)
        self._lost_gpus &= {gpu.uuid for gpu in gone}  # one back (reset) may be lost again

    def _gpu_lost(self, gpu: GpuId, error: str, now: float) -> None:
        games = sorted(name for name, on in self.placed.items() if on == gpu)
        self.event("gpu_lost", None, {**gpu.as_json(), "error": error, "games": games})
        log.error("gpu_lost", gpu=gpu.index, uuid=gpu.uuid, error=error, games=games)
        for name in games:
            rt = self.games.get(name)
            self._last_gpu[name] = self.placed.pop(name)
            if rt is not None and rt.life is not None:
                self.request_stop(rt, StopReason.GPU_LOST, now + self.cfg.stop_grace_s)

    # ---- per-GPU stability: moving a game off a hot or OOM-prone GPU ------------------------

    def gpu_games(self) -> list[PlacedGame] | None:
        """The games on a GPU, for the policy (`gpumoves`, per-GPU attribution): those running
        on one, and those failed there and waiting for their restart. None where this
        supervisor does not place games on GPUs (several hosts, no NVML): GPU pressure stays
        the host's."""
        probe = self.probe if isinstance(self.probe, NvmlProbe) else None
        snap = probe.latest() if probe is not None else None
        if snap is None or not snap.driver or self.launcher.backend != "local":
            return None
        ids = [GpuId(g.index, g.uuid) for g in snap.gpus]
        ids += [GpuId(lost.index, lost.uuid) for lost in snap.lost]
        visible = gpuplace.visible(self.cuda_visible, ids)
        out = []
        for name, rt in self.games.items():
            gpu = self.placed.get(name)
            if gpu is None and rt.state is S.BACKOFF:
                gpu = self._last_gpu.get(name)
            if gpu is None or rt.spec.device == "cpu" or rt.state is S.STOPPING:
                continue  # a stopping worker is leaving its GPU already
            choice = rt.spec.gpu
            allowed = (
                visible if choice is None else [visible[i] for i in choice if i < len(visible)]
            )
            peak = rt.gpu_peak_mb.get(self.view.game(name).sizes())
            out.append(PlacedGame(name, gpu, need_mb(self.gate.cfg, peak), tuple(allowed)))
        return out

    def move_gpu(self, move: GpuMove) -> None:
        """Carry out the policy's move: `gpu_moved`, the GPU it left avoided for the
        cooldown, and its worker (when still running there) stopped with a checkpoint and
        requeued, not counted as a failure; placement then picks another GPU."""
        self.event("gpu_moved", move.game, move.detail())
        until = self.steady() + self.cfg.stability.cooldown_s
        self._avoid.setdefault(move.game, {})[move.from_gpu.uuid] = until
        rt = self.games.get(move.game)
        if rt is not None and rt.life is not None and self.placed.get(move.game) == move.from_gpu:
            self.request_stop(rt, StopReason.GPU_MOVE, self.clock() + self.cfg.stop_grace_s)

    def _avoided(self, name: str) -> frozenset[str]:
        now = self.steady()
        return frozenset(uuid for uuid, until in self._avoid.get(name, {}).items() if until > now)

    def _restore_avoided(self) -> None:
        """The GPUs games were moved off within the cooldown, from the events of a
        predecessor: a restart does not send a game back to the GPU it just left."""
        assert self.conn is not None
        now, cooldown = self.steady(), self.cfg.stability.cooldown_s
        for e in db.events(self.conn, since_mono=now - cooldown, kind="gpu_moved"):
            source = e.detail.get("from")
            if e.game is not None and isinstance(source, dict) and source.get("uuid"):
                ts = min(now, e.mono if e.mono is not None else e.ts)
                self._avoid.setdefault(e.game, {})[str(source["uuid"])] = ts + cooldown

    def spawn(self, rt: GameRuntime, threads: int, now: float) -> None:
        mode = self.view.game(rt.spec.name)
        restarting = rt.state is S.BACKOFF
        spawning_at = time.monotonic()
        gpu = self._chosen.pop(rt.spec.name, None)
        try:
            proc = self._launch(rt, mode, threads, now, gpu)
        except NoRoom as exc:
            # Several hosts, all full (or none joined): the game waits for room, no failure.
            if rt.spec.name not in self._no_room:
                self._no_room.add(rt.spec.name)
                self.event("no_host", rt.spec.name, {"message": str(exc)})
                log.warning("no_host", game=rt.spec.name, message=str(exc))
            return
        except OSError as exc:
            # A full disk, a full process table, a failed pidfd: no child is left running
            # (the launcher kills what it cannot track); retried after a backoff.
            self._failure(rt, f"cannot spawn the worker: {exc}", 0.0, now)
            return
        if restarting:
            rt.restarts += 1
        self._no_room.discard(rt.spec.name)
        placement = self._assign_gpu(rt, gpu)
        rt.life, rt.mode = WorkerLife(proc, mode, Liveness(since=now)), mode
        rt.life.spawned_at = spawning_at
        self._set(
            rt,
            S.STARTING,
            "restart after backoff" if restarting else "slot free",
            mode=mode.name,
            num_envs=mode.num_envs,
            batch_size=mode.batch_size,
            n_steps=mode.n_steps,
            threads=threads,
            served=proc.served,
            **proc.placement(),
            **placement,
        )

    def _assign_gpu(self, rt: GameRuntime, gpu: GpuId | None) -> dict[str, Any]:
        """Record the GPU the new worker got (`gpu_assigned`, `moved_from` when it changed);
        its worker_start detail."""
        if gpu is None:
            return {}
        name = rt.spec.name
        self.placed[name] = gpu
        before = self._last_gpu.get(name)
        detail: dict[str, Any] = {**gpu.as_json(), CUDA_VISIBLE: cuda_visible_for(gpu)}
        if before is not None and before != gpu:
            detail["moved_from"] = before.as_json()
        self.event("gpu_assigned", name, detail)
        log.info("gpu_assigned", game=name, **detail)
        return {"gpu": gpu.as_json()}

    def _launch(
        self, rt: GameRuntime, mode: ModeSpec, threads: int, now: float, gpu: GpuId | None = None
    ) -> WorkerProcess:
        name = rt.spec.name
        run_dir = db.make_private_dir(self.cfg.run_dir(name))
        logs_dir = db.make_private_dir(self.cfg.logs_dir)
        rotate_log(logs_dir / f"{name}.log")
        wcfg = worker_config(
            rt.spec, mode, run_dir, self.cfg.checkpoint_every_s, threads, self.cfg.mirror
        )
        with contextlib.suppress(FileNotFoundError):
            (run_dir / protocol.HEARTBEAT_FILE).unlink()
        env = {CUDA_VISIBLE: cuda_visible_for(gpu)} if gpu is not None else None
        proc = self.launcher.spawn(
            wcfg.to_argv(), logs_dir / f"{name}.log", now, cwd=run_dir, env=env
        )
        try:
            self.waker.watch(proc.pidfd, name)
        except (OSError, ValueError) as exc:
            self.launcher.kill(proc)
            proc.wait()
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
            check_runs_match(dataclasses.replace(new, state_dir=self.cfg.state_dir))
            new = check_for_service(new)
        except ConfigError as exc:
            log.error("config_error", error=str(exc), kept="previous configuration")
            self.event("config_error", None, {"message": str(exc), "kept": "previous"})
            return
        if (refusal := mirror_reload_refusal(self.cfg, new)) is not None:
            # Applied to some parts and not others (the launcher's fences, the uploader, the
            # workers' restores), a moved mirror loses fencing and progress: refused whole.
            log.error("config_error", error=refusal, kept="previous configuration")
            self.event("config_error", None, {"message": refusal, "kept": "previous"})
            return
        if new.state_dir != self.cfg.state_dir:
            log.warning("config_reload_state_dir_ignored", old=str(self.cfg.state_dir))
            new = dataclasses.replace(new, state_dir=self.cfg.state_dir)
        if new.cluster != self.cfg.cluster:  # placements are the running launcher's
            log.warning("config_reload_cluster_ignored", kept=self.cfg.cluster.as_dict())
            new = dataclasses.replace(new, cluster=self.cfg.cluster)
        old_metrics, self.cfg = self.cfg.metrics, new
        self.gate.cfg = gate_config(new)
        self._configure_hooks()
        if new.metrics != old_metrics:
            self._configure_metrics()
        elif self.metrics is not None:
            self.metrics.cfg = new
        self.launcher.configure(new)
        if self.uploader is not None:
            self.uploader.reconfigure(new)
        change = reconcile(self.games, self.removed, new.games, self.wall())
        for rt in change.added:
            self._set(rt, S.WAITING, "added by config reload")
        for rt in change.leaving:
            self.request_stop(rt, StopReason.REMOVED, now + new.stop_grace_s)
        assert self.conn is not None and self.journal is not None
        modes.resume_host_mode(self.conn, new, self.steady(), write=self.journal.write)
        self.refresh_modes()
        self.event("config_reload", None, {"path": str(new.path), "games": list(self.games)})
        log.info("config_reload", games=list(self.games))

    # ---- systemd ----------------------------------------------------------------------------

    def summary(self) -> str:
        return summary(self.games.values())

    def notify(self, now: float) -> None:
        self.notifier.tick(now, self._tick_errors == 0, self.summary())
