"""The supervisor: start-up, the tick, and shutdown.

"Monitor returns, loop decides": signal handlers only set flags; one `tick()` (with an injected
monotonic clock) reads what the outside says (exits, heartbeats, host vitals, the desired
modes), hands it to the owners of the decisions, and applies what they return:
- a game's life (`lifecycle.game.Lifecycle`): state changes, the restart budget and backoff,
  hangs, stops; it returns its effects in an outbox that `_apply` carries out;
- the GPUs (`gpu.placer.GpuPlacer`): where a game may start, lost GPUs, moves;
- modes (`stability`): the stability policy and the modes in force;
- the sweeps (`sweep.keeper`): trials' evaluations to the pruner, an ended trial's runs;
- the participants (`participants`): the preemption watch (read first: its one `Hold` rules
  the tick), alert hooks, metrics, the uploader, the spare, each handed one `TickView`.
Every database write goes through the Recorder (`ledger.recorder`), which also logs it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
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
)
from supervisor.config.sweep import sweep_reload_refusal
from supervisor.gpu.gate import NvmlLike, worker_env
from supervisor.gpu.moves import GpuMove, PlacedGame
from supervisor.gpu.placer import GameAsk, GpuPlacer, PlacedAsk
from supervisor.launch import spawn as sp
from supervisor.launch.backends import make_launcher
from supervisor.launch.launcher import LauncherSeam
from supervisor.launch.oomwatch import KernelOomWatch
from supervisor.launch.spare import SpareWant
from supervisor.launch.spawn import NoRoom, WorkerProcess
from supervisor.ledger import db
from supervisor.ledger.journal import Journal
from supervisor.ledger.recorder import Recorder
from supervisor.lifecycle.exits import StopReason, WorkerExit
from supervisor.lifecycle.game import Lifecycle, Record, Release, Signal, WriteRow
from supervisor.lifecycle.restart import ExitInfo, ExitKind, classify_exit
from supervisor.lifecycle.runtime import GameRuntime, summary
from supervisor.lifecycle.startup import (
    boot_outcome,
    restore_states,
    start_event,
    stop_leftover_workers,
    supervisor_row,
    unrecorded_reports,
)
from supervisor.lifecycle.states import WorkerState
from supervisor.lock import LockHeld, acquire_lock
from supervisor.participants import Event, HookAlerts, Started, StartFailed, TickView
from supervisor.sdnotify import Notifier
from supervisor.stability import modes, scaling, vitals
from supervisor.sweep.keeper import TrialWaits
from supervisor.waker import Waker
from training import protocol

__all__ = ["LockHeld", "StartFailed", "Supervisor", "acquire_lock"]

log = structlog.get_logger("rlsup.supervisor")
S = WorkerState
VITALS_EVERY_S = 5.0
# A tick's spawns stop once they have taken this long; the rest wait for the next tick.
SPAWN_BUDGET_S = 10.0


# The stability policy's seam: called once a tick (before modes are applied) with the state
# connection, the config and the step-free clock; returns what it decided, in order (GPU moves
# to carry out, mode changes to record). Default: scaling.StabilityPolicy. `request()`, if any:
# run at the next call.
PolicyStep = Callable[[sqlite3.Connection, Config, float], Sequence[scaling.Decided] | None]
_DEFAULT = "default"


class Supervisor:
    def __init__(
        self,
        cfg: Config,
        *,
        launcher: LauncherSeam | None = None,
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
        self.clock, self.wall = clock, wall
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
        self.rng = random.Random()
        # One NVML probe: the vitals sampler's GPU readings and the GPU gate's free memory.
        self.probe: NvmlLike = gpu_probe if gpu_probe is not None else vitals.NvmlProbe()
        self.gpus = GpuPlacer(
            cfg,
            self.probe,
            record=self.event,
            steady=self.steady,
            visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
            local=self.launcher.local,
        )
        self.sampler = sampler or vitals.VitalsSampler(
            cfg.state_dir, VITALS_EVERY_S, probe=self.gpus.nvml, clock=self.steady
        )
        # policy: the stability policy by default; None turns automatic scaling off.
        self.policy: PolicyStep | None = (
            scaling.StabilityPolicy(self.sampler.latest, gpu_games=self.gpu_games)
            if isinstance(policy, str)
            else policy
        )
        self.life = Lifecycle(cfg, wall=wall, rng=self.rng)
        self.games, self.removed = self.life.games, self.life.removed
        self._started: Started | None = None
        self.boot_id = ""
        self.stopping = False
        self.stop_deadline = 0.0
        self.finished = False
        self._tick_errors = 0
        self._no_room: set[str] = set()  # games told "no host has room" (once each)
        self.pins = modes.PinWatch()  # operators' pins, recorded as the tick reads them

    @property
    def on(self) -> Started:
        """The parts made by `start()` (a method that needs them before it is a bug)."""
        if self._started is None:
            raise RuntimeError("the supervisor has not started")
        return self._started

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
                    self.waker.wait(self.sleep_s())
        finally:
            self.close()
        return 0

    def wait(self, timeout: float) -> None:
        """Sleep until a worker exits (its pidfd turns readable), a signal arrives, or timeout."""
        self.waker.wait(timeout)

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
        conn = db.connect(
            self.cfg.state_dir, busy_timeout_ms=db.SUPERVISOR_BUSY_TIMEOUT_MS, owner=True
        )
        journal = Journal(conn, clock=self.clock, wall=self.wall, rng=self.rng)
        recorder = Recorder(conn, journal, wall=self.wall, steady=self.steady)
        hooks = HookAlerts(self.cfg, recorder)  # before the first event: host_reboot alerts
        try:
            view = self._boot(conn, journal, recorder)
        except BaseException:
            hooks.close()
            recorder.close()  # says what could not be written
            raise
        self._started = Started.make(
            self.cfg, conn, journal, recorder, hooks, view,
            launcher=self.launcher, boot_id=self.boot_id, wall=self.wall, steady=self.steady,
        )  # fmt: skip
        self.life.queue_new()
        self._apply()
        for part in self._started.participants:
            part.start()
        self.notifier.ready(summary(self.games.values()))

    def _boot(self, conn: sqlite3.Connection, journal: Journal, recorder: Recorder) -> Any:
        """The boot in the ledger, a predecessor's leftovers stopped, the games' states
        restored: everything before the first tick that reads or writes the database."""
        now_wall = self.wall()
        self.boot_id = db.read_boot_id()
        outcome, reboot = boot_outcome(conn, self.boot_id, now_wall)  # a preemption: no crash
        recorder.drop_stale_stop_request()  # before the supervisor row says running
        boot_time = psutil.boot_time()
        # The boot and its verdict in one transaction: a start that dies after recording the
        # boot (a backend down at boot, a kill) must not leave the next start to call it a crash.
        journal.write(lambda c: db.apply_boot(c, outcome, now_wall, boot_time), flush=False)
        if reboot is not None:
            recorder.event(*reboot)
        journal.flush()
        leftovers = []
        worker_rows = db.workers(conn)
        if outcome.same_boot:  # a new supervisor: stop our workers still alive BEFORE any start
            leftovers = stop_leftover_workers(worker_rows, self.cfg, self.notifier)
        try:
            self.launcher.connect()
            # Workers of a predecessor on other hosts (their actors), stopped before any start.
            elsewhere = self.launcher.stop_leftovers(self.cfg.stop_grace_s)
        except OSError as exc:
            raise StartFailed(f"backend {self.launcher.backend}: {exc}") from exc
        host_mode, change = modes.resume_host_mode(conn, self.cfg, self.steady(), journal.write)
        modes.record(recorder, [change])
        if any(g.device != "cpu" for g in self.cfg.games):
            # CUDA workers: expandable segments (less fragmentation) unless the operator chose.
            # The launcher passes the supervisor's environment on.
            os.environ.update(worker_env(os.environ))
        self.sampler.start()
        row = supervisor_row(self.boot_id, now_wall, self.cfg.path)
        journal.write(lambda c: db.set_supervisor(c, **row))
        detail = start_event(outcome, leftovers, self.cfg.path, host_mode)
        line = {"after": outcome.kind, "boot_id": self.boot_id, "downtime_s": outcome.downtime_s}
        recorder.event("supervisor_start", None, detail, line | {"games": list(self.games)})
        if elsewhere:
            detail = {"actors": elsewhere, "backend": self.launcher.backend}
            recorder.event("leftovers_stopped", None, detail)
        for game, kind, detail in unrecorded_reports(conn, worker_rows, self.cfg.run_dir):
            recorder.event(kind, game, detail)
        for game, detail in self.gpus.cpu_fallbacks():  # this host's torch and driver
            recorder.event("device_fallback", game, detail)
        restore_states(self.games, db.workers(conn), self.cfg.run_dir)
        self.gpus.restore_avoided(conn)
        return modes.view(conn, self.cfg)

    def close(self) -> None:
        for part in reversed(self._started.participants if self._started else []):
            part.close()
        self.launcher.close()
        self.waker.close()
        self.notifier.close()
        self.sampler.stop()
        if self._started is not None:
            self._started.recorder.close()  # says what could not be written

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
        now, on = self.clock(), self.on
        if not self.stopping and on.recorder.stop_requested():
            self.begin_shutdown(now, "rlsup stop (a request in the state database)")
        if self.flags.stop and not self.stopping:
            self.begin_shutdown(now, "signal")
        if self.flags.reload:
            self.flags.reload = False
            self.reload(now)
        self.record(on.preemption.watch())  # news from outside, like an exit: first
        self.life.hold = on.preemption.hold()  # no start, and a death is no failure
        self.reap(now)
        self.record(self.launcher.observe(now))
        if not self.stopping:
            self.observe(now)
            grace = now + self.cfg.stop_grace_s
            for name in self.gpus.watch():  # games on a lost GPU: placed again elsewhere
                if (rt := self.games.get(name)) is not None:
                    self.life.stop(rt, StopReason.GPU_LOST, grace)
            on.recorder.sample(self.sampler.latest_json(), now)
            self.run_policy()
            self.refresh_modes()
            self.life.apply_modes(self.view.game, self.view.host.max_concurrent, now)
            self._apply()
            self.schedule(now)
        self.life.escalate(now)
        self._apply()
        view = self.tick_view(now)
        for part in on.participants:
            self.record(part.tick(view))
        wall = self.wall()
        rows = ((rt.spec.name, self._row(rt, wall)) for rt in self.life.all())
        on.recorder.tick(rows, self.boot_id)
        self.notifier.tick(now, self._tick_errors == 0, summary(self.games.values()))
        if self.stopping and not any(rt.life for rt in self.life.all()):
            self.finish_shutdown()
        elif self.exit_when_done and not self.stopping and self.life.all_settled():
            self.begin_shutdown(now, "all games done or fatal")

    def event(self, kind: str, game: str | None, detail: dict[str, Any]) -> None:
        self.on.recorder.event(kind, game, detail)

    def record(self, events: Iterable[Event]) -> None:
        for kind, game, detail in events:
            self.on.recorder.event(kind, game, detail)

    def tick_view(self, now: float | None = None) -> TickView:
        """The tick as decided, for its participants: built once, after the decisions."""
        placed = frozenset(g.name for g in self.cfg.games if self.gpus.starts_placed(g))
        return TickView(
            self.clock() if now is None else now, self.wall(), self.stopping,
            tuple(self.games.values()), self.view, self.sampler.latest(), self.life.hold, placed,
        )  # fmt: skip

    def _row(self, rt: GameRuntime, wall: float) -> dict[str, Any]:
        return {**rt.db_row(wall), "gpu": self.gpus.row_gpu(rt.spec.name)}

    def _apply(self) -> None:
        """Carry out what the lifecycle decided, in order."""
        recorder = self.on.recorder
        for effect in self.life.drain():
            if isinstance(effect, Record):
                recorder.event(effect.kind, effect.game, effect.detail, effect.log)
            elif isinstance(effect, WriteRow):
                if (rt := self.games.get(effect.game) or self.removed.get(effect.game)) is not None:
                    recorder.worker(effect.game, self._row(rt, self.wall()))
            elif isinstance(effect, Release):
                self.gpus.gone(effect.game)
            elif isinstance(effect, Signal):
                (self.launcher.kill if effect.kill else self.launcher.terminate)(effect.proc)

    # ---- exits, heartbeats and hangs ----------------------------------------------------------

    def reap(self, now: float) -> None:
        for rt in self.life.all():
            life = rt.life
            if life is None or (rc := life.proc.poll()) is None:
                continue
            info = classify_exit(rc)
            if life.proc.lost_before_start():
                info = ExitInfo(ExitKind.START_LOST, rc, f"{info.description} (as the spare)")
            seen_at = time.monotonic()  # before the reading, closing and events below
            self._heartbeat(rt, now)  # its last words: quarantines, its step
            oom = None
            if info.returncode == -signal.SIGKILL and not life.killed:
                # Not ours. An OOM kill only on the kernel's word (its log, or a cgroup counter).
                oom = self.oom_watch.verdict(life.proc.pid, life.proc.start_ticks)
            error = sp.worker_error(self.cfg, rt.spec, life.proc.pid, rc)
            ex = WorkerExit(info, now - life.proc.started_mono, error, life.live.heartbeat,
                            life.killed, oom)  # fmt: skip
            on_gpu = self.gpus.on_gpu(rt.spec.name)
            failed = self.life.exited(rt, life, ex, now, stopping=self.stopping, on_gpu=on_gpu)
            rt.exit_seen_at = seen_at
            self.waker.unwatch(life.proc.pidfd)
            life.proc.close()
            self.launcher.forget(life.proc)
            if failed and callable(request := getattr(self.policy, "request", None)):
                request()  # an OOM right after start steps down before the restart
            self._apply()
        self.life.forget_removed()

    def _heartbeat(self, rt: GameRuntime, now: float) -> None:
        life = rt.life
        hb = protocol.read_heartbeat(self.cfg.run_dir(rt.spec.name))
        if life is None or hb is None or not sp.heartbeat_of(hb.pid, life.proc.pid, rt.spec):
            return
        if self.life.heartbeat(rt, life, hb, now):
            self.gpus.seen_memory(rt.spec.name)  # its memory is now visible to NVML

    def observe(self, now: float) -> None:
        """Heartbeats and hangs; then the sweeps' trials (supervisor/sweep/keeper.py): their
        evaluations to the pruner, their ends told, an ended trial's runs stopped."""
        for rt in self.games.values():
            life = rt.life
            if life is None or rt.state not in (S.STARTING, S.RUNNING):
                continue
            self._heartbeat(rt, now)
            if self.life.check(rt, life, self.cfg.watchdog, now):
                self.life.stop(rt, StopReason.HANG, now + self.cfg.watchdog.kill_grace_s)
        self._apply()
        step = self.on.sweeps.step({n: (rt.state, rt.reason) for n, rt in self.games.items()})
        self.record(step.events)
        self.life.end_runs(step.ends, now + self.cfg.stop_grace_s)
        self._apply()

    # ---- modes, GPUs and scheduling ---------------------------------------------------------

    def run_policy(self) -> None:
        on = self.on
        if self.policy is None or not on.journal.healthy:
            # Its decisions must persist (they survive reboots): automatic scaling waits for
            # the state database to take writes again; supervision goes on.
            return
        try:
            for decided in self.policy(on.conn, self.cfg, self.steady()) or ():
                if not isinstance(decided, GpuMove):
                    modes.record(on.recorder, [decided])
                elif self.gpus.move(decided) and (rt := self.games.get(decided.game)) and rt.life:
                    # Off its GPU: the worker stopped with a checkpoint and requeued.
                    self.life.stop(rt, StopReason.GPU_MOVE, self.clock() + self.cfg.stop_grace_s)
                    self._apply()
        except sqlite3.Error as exc:
            log.warning("policy_skipped", reason=f"state database: {exc}")
        except Exception:
            # A policy bug must not stop supervision: keep the modes as they are.
            log.exception("policy_failed")

    def refresh_modes(self) -> None:
        """Read the modes in force once a tick (operators' pins arrive through the database and
        are recorded as read); when it cannot be read, keep supervising with the last view."""
        try:
            self.on.mode_view = modes.view(self.on.conn, self.cfg)
            modes.record(self.on.recorder, self.pins.read(self.on.conn))
        except sqlite3.Error as exc:
            log.warning("modes_unreadable", error=str(exc), kept="the modes last read")

    @property
    def view(self) -> modes.ModeView:
        return self.on.mode_view

    def gpu_games(self) -> list[PlacedGame] | None:
        """The games on a GPU, for the policy's per-GPU attribution."""
        asks = [
            PlacedAsk(rt.spec, rt.state is S.BACKOFF, rt.state is S.STOPPING,
                      rt.gpu_peak_mb.get(self.view.game(rt.spec.name).sizes()))
            for rt in self.games.values()
        ]  # fmt: skip
        return self.gpus.games_on_gpus(asks)

    def schedule(self, now: float) -> None:
        gated = []
        for rt in self.life.candidates(self.view.host.max_concurrent, now):
            name, current = rt.spec.name, self.view.game(rt.spec.name)
            lighter = modes.one_rung_lower(self.cfg, current)
            pinned = bool({name, modes.HOST} & self.view.pinned)
            ask = GameAsk(rt.spec, current, lighter, pinned, rt.gpu_peak_mb.get(current.sizes()))
            admission = self.gpus.admit(ask, now)
            if admission.never is not None:
                self.life.set(rt, S.FATAL, admission.never)  # no driver will ever end the wait
            elif admission.ok and admission.fallback is not None:
                change = modes.auto_mode_change(self.on.conn, self.cfg, name,
                                                admission.fallback.name, [admission.reason],
                                                self.steady())  # fmt: skip
                modes.record(self.on.recorder, [change])
                # In force now, whether or not the database has taken it yet.
                games = {**self.view.games, name: admission.fallback}
                self.on.mode_view = dataclasses.replace(self.view, games=games)
            if admission.ok:
                gated.append(rt)
        self._apply()
        if not gated:
            return
        threads = self.life.thread_share(self.cores, gated)
        began = time.monotonic()
        for i, rt in enumerate(gated):
            if time.monotonic() - began > SPAWN_BUDGET_S:
                # A slow backend (a Ray actor's start may take 30 s) must not hold the tick past
                # the systemd watchdog: the rest start next tick, after this one has pinged it.
                deferred = [later.spec.name for later in gated[i:]]
                self.gpus.defer(deferred)  # the gate places them afresh next tick
                log.info("spawns_deferred", games=deferred, budget_s=SPAWN_BUDGET_S)
                return
            self.spawn(rt, threads, now)

    def spawn(self, rt: GameRuntime, threads: int, now: float) -> None:
        name, mode = rt.spec.name, self.view.game(rt.spec.name)
        spawning_at = time.monotonic()
        env = self.life.hold.worker_env(self.gpus.env_for(name))
        try:
            proc = self._launch(rt, mode, threads, now, env)
        except (NoRoom, TrialWaits) as exc:
            # All hosts full, its last worker's remains still stopping, its sweep's study store
            # failing: it waits, no failure.
            self.gpus.unassign(name)
            if name not in self._no_room and exc.event:
                self._no_room.add(name)
                self.event(exc.event, name, {"message": str(exc)})
            return
        except OSError as exc:
            # A full disk, a full process table, a failed pidfd: no child is left running
            # (the launcher kills what it cannot track); retried after a backoff. A command
            # game's program that is not there ends FATAL at once.
            self.gpus.unassign(name)
            self.life.spawn_failed(rt, exc, now)
            self._apply()
            return
        self._no_room.discard(name)
        placement = self.gpus.assign(name)
        self.life.started(rt, proc, mode, now, spawning_at, threads, **placement)
        self._apply()

    def _launch(self, rt: GameRuntime, mode: ModeSpec, threads: int, now: float,
                env: dict[str, str] | None) -> WorkerProcess:  # fmt: skip
        name, spec = rt.spec.name, self.on.sweeps.assign(rt.spec)  # a trial's values: drawn once
        conn = self.on.conn
        mtbf = db.mtbf_s(conn, time.time()) if self.cfg.adaptive_checkpoints else None
        mtbf = mtbf if mtbf else None  # 0: a boot that failed before any up-time was seen
        w = sp.prepare_worker(self.cfg, spec, mode, threads, env, db.starts(conn, name), mtbf)
        proc = self.launcher.spawn(w.argv, w.log, now, cwd=w.cwd, env=w.env, command=w.command)
        try:
            self.waker.watch(proc.pidfd, name)
        except (OSError, ValueError) as exc:
            self.launcher.kill(proc)
            proc.wait()
            proc.close()
            raise OSError(f"cannot watch the new worker's pidfd: {exc}") from exc
        return proc

    # ---- shutdown and reload ----------------------------------------------------------------

    def begin_shutdown(self, now: float, why: str) -> None:
        self.stopping = True
        self.stop_deadline = now + self.cfg.stop_grace_s
        log.info("supervisor_stopping", reason=why, grace_s=self.cfg.stop_grace_s)
        self.notifier.stopping("stopping: " + why)
        self.record(self.on.spare.tend(SpareWant(False, "supervisor shutdown"), now, self.wall()))
        self.life.shutdown(self.stop_deadline)
        self._apply()

    def finish_shutdown(self) -> None:
        self.on.recorder.stopped(self.boot_id)
        log.info("supervisor_stop", clean=True)
        self.finished = True

    def reload(self, now: float) -> None:
        self.notifier.reloading()
        try:
            self._reload(now)
        finally:
            self.notifier.ready(summary(self.games.values()))

    def _reload(self, now: float) -> None:
        try:
            new = load_config(self.cfg.path)
            check_runs_match(dataclasses.replace(new, state_dir=self.cfg.state_dir))
            new = check_for_service(new)
            refusal = mirror_reload_refusal(self.cfg, new) or sweep_reload_refusal(self.cfg, new)
            if refusal is not None:
                # Applied to some parts and not others (the launcher's fences, the uploader,
                # the workers' restores), a moved mirror loses fencing and progress: refused.
                raise ConfigError(refusal)
        except ConfigError as exc:
            line = {"error": str(exc), "kept": "previous configuration"}
            self.on.recorder.event(
                "config_error", None, {"message": str(exc), "kept": "previous"}, line
            )
            return
        if new.state_dir != self.cfg.state_dir:
            log.warning("config_reload_state_dir_ignored", old=str(self.cfg.state_dir))
            new = dataclasses.replace(new, state_dir=self.cfg.state_dir)
        if new.cluster != self.cfg.cluster:  # placements are the running launcher's
            log.warning("config_reload_cluster_ignored", kept=self.cfg.cluster.as_dict())
            new = dataclasses.replace(new, cluster=self.cfg.cluster)
        self.cfg = new
        self.gpus.reconfigure(new)
        self.launcher.configure(new)
        for part in self.on.participants:
            part.reconfigure(new)
        self.on.sweeps.reconfigure(new)
        self.life.reconfigure(new, now)
        self._apply()
        _, change = modes.resume_host_mode(self.on.conn, new, self.steady(), self.on.journal.write)
        modes.record(self.on.recorder, [change])
        self.refresh_modes()
        detail = {"path": str(new.path), "games": list(self.games)}
        self.on.recorder.event("config_reload", None, detail, {"games": list(self.games)})
