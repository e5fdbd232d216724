"""One owner for a game's life: every state change and what follows from it (the event, the
worker row, the GPU released, the restart budget and backoff), in one place.

The lifecycle touches no process, file or database. Its steps change the runtimes and leave
their effects in an outbox, in order: events to record, rows to write, GPUs to release,
workers to signal. The tick reads what the outside says (exits, heartbeats, error files),
hands it to a step, and applies the outbox (torchelastic's `RunResult`, supervisord's
`Subprocess.change_state`: steps return, the loop decides).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from supervisor.config import Config, ModeSpec, WatchdogConfig
from supervisor.launch.spawn import WorkerProcess
from supervisor.lifecycle.exits import StopReason, WorkerExit, route_exit
from supervisor.lifecycle.liveness import Liveness, hang_reason, new_reports
from supervisor.lifecycle.restart import (
    backoff_delay_s,
    budget_exhausted,
    consecutive_after_exit,
    failures_in_window,
)
from supervisor.lifecycle.runtime import GameRuntime, Reconciled, WorkerLife, reconcile
from supervisor.lifecycle.states import ACTIVE, ALIVE, TERMINAL, Transition, WorkerState, transition
from supervisor.preemption.notice import NO_HOLD, Hold
from supervisor.sweep.keeper import EndRun
from training.protocol import Heartbeat

log = structlog.get_logger("rlsup.supervisor")

S = WorkerState


@dataclass(frozen=True)
class Record:
    """An event to record. `log`: what the Recorder logs with it (None: the detail;
    False: nothing, the transition logged its own line)."""

    kind: str
    game: str | None
    detail: dict[str, Any]
    log: dict[str, Any] | bool | None = None


@dataclass(frozen=True)
class WriteRow:
    """The game's worker row, as it is now."""

    game: str


@dataclass(frozen=True)
class Release:
    """The game's worker is gone (or its wait abandoned): its GPU and reservation are free."""

    game: str


@dataclass(frozen=True)
class Signal:
    """Ask the game's worker to checkpoint and exit (SIGTERM), or `kill` it."""

    proc: WorkerProcess
    kill: bool = False


Effect = Record | WriteRow | Release | Signal


class Lifecycle:
    def __init__(
        self, cfg: Config, *, wall: Callable[[], float], rng: random.Random | None = None
    ) -> None:
        self.cfg = cfg
        self.wall = wall
        self.rng = rng or random.Random()
        self.games: dict[str, GameRuntime] = {g.name: GameRuntime(g) for g in cfg.games}
        self.removed: dict[str, GameRuntime] = {}  # no longer configured, worker still stops
        self.outbox: list[Effect] = []
        # A preemption notice: no start (work lost at the deadline), and a worker that dies
        # now died of the machine's end, not of its game. The tick's one value, set before it
        # reads exits.
        self.hold: Hold = NO_HOLD

    def drain(self) -> list[Effect]:
        out, self.outbox = self.outbox, []
        return out

    def all(self) -> list[GameRuntime]:
        return [*self.games.values(), *self.removed.values()]

    def record(self, kind: str, game: str | None, detail: dict[str, Any], log: Any = None) -> None:
        self.outbox.append(Record(kind, game, detail, log))

    # ---- the one state change ---------------------------------------------------------------

    def set(self, rt: GameRuntime, target: WorkerState, reason: str, **detail: Any) -> Transition:
        pid = rt.proc.pid if rt.proc else None
        tr = transition(
            rt.spec.name, rt.state, target, reason, pid=pid, restarts=rt.restarts, **detail
        )
        rt.state, rt.reason, rt.state_since = target, reason, self.wall()
        if target in (S.EXITED, S.STOPPED, S.FATAL, S.DONE):
            self.outbox.append(Release(rt.spec.name))
        if tr.kind != "worker_state":
            body = {"from": str(tr.source), "to": str(target), "reason": reason, "pid": pid}
            self.record(tr.kind, rt.spec.name, {**body, "restarts": rt.restarts, **detail}, False)
        self.outbox.append(WriteRow(rt.spec.name))
        return tr

    # ---- starts ---------------------------------------------------------------------------

    def queue_new(self) -> None:
        """At start-up: every game not restored to a state of its own waits for a slot."""
        for rt in self.games.values():
            if rt.state is S.STOPPED:
                self.set(rt, S.WAITING, "queued")

    def candidates(self, cap: int, now: float) -> list[GameRuntime]:
        """The games that may start this tick, before the GPU gate: those whose backoff is
        over, then the waiting ones while slots are free (none while a preemption stands)."""
        if self.hold.holding:
            return []
        games = self.games.values()
        active = sum(1 for rt in games if rt.state in ACTIVE)
        due = [rt for rt in games if rt.state is S.BACKOFF and now >= rt.backoff_until]
        waiting = [rt for rt in games if rt.state is S.WAITING]
        return due + waiting[: max(0, cap - active)]

    def alive(self) -> int:
        return sum(1 for rt in self.games.values() if rt.state in ALIVE)

    def thread_share(self, cores: int, starting: Sequence[GameRuntime]) -> int:
        """The cores each game starting now gets (its worker's `--threads`): the host's cores
        over the games that hold a slot: alive, waiting out a restart delay (BACKOFF keeps its
        slot: it is back within seconds), or starting now. Counting only the alive ones gave the
        first of two games that crashed together both cores, for its worker's life: its two
        OpenMP threads beside the other game's on 2 cores trained 40x slower (100 against 4,000
        CartPole steps/s: each parallel region waited for a descheduled thread)."""
        holding = {n for n, rt in self.games.items() if rt.state in ALIVE or rt.state is S.BACKOFF}
        holding |= {rt.spec.name for rt in starting}
        return max(1, cores // max(1, len(holding)))

    def started(
        self,
        rt: GameRuntime,
        proc: WorkerProcess,
        mode: ModeSpec,
        now: float,
        spawned_at: float,
        threads: int,
        **detail: Any,
    ) -> None:
        restarting = rt.state is S.BACKOFF
        if restarting:
            rt.restarts += 1
        rt.life, rt.mode = WorkerLife(proc, mode, Liveness(since=now)), mode
        rt.life.spawned_at = spawned_at
        self.set(
            rt,
            S.STARTING,
            "restart after backoff" if restarting else "slot free",
            mode=mode.name,
            num_envs=mode.num_envs,
            batch_size=rt.spec.mode_batch(mode),
            n_steps=mode.n_steps,
            threads=threads,
            served=proc.served,
            **proc.placement(),
            **detail,
        )

    # ---- heartbeats and hangs ---------------------------------------------------------------

    def heartbeat(self, rt: GameRuntime, life: WorkerLife, hb: Heartbeat, now: float) -> bool:
        """The worker's heartbeat: its liveness, its reports (quarantines, write failures)
        as events, its GPU memory learned. True when it reported GPU memory."""
        life.live.observe(hb, now)
        for kind, detail in new_reports(life.reported, hb):
            self.record(kind, rt.spec.name, detail)
        if hb.gpu_mem_mb is None:
            return False
        sizes = life.mode.sizes()
        rt.gpu_peak_mb[sizes] = max(rt.gpu_peak_mb.get(sizes, 0.0), hb.gpu_mem_mb)
        return True

    def check(
        self, rt: GameRuntime, life: WorkerLife, watchdog: WatchdogConfig, now: float
    ) -> bool:
        """After its heartbeat was read: running once it beat, its start reported once it
        stepped, and True when it hangs (its `worker_hang` recorded; the caller stops it)."""
        if rt.state is S.STARTING and (hb := life.live.heartbeat) is not None:
            self.set(rt, S.RUNNING, "first heartbeat", resumed_from_step=hb.resumed_from_step)
        if not rt.spec.heartbeat and life.live.heartbeat is None:
            # A command game that promised no heartbeat and sent none: running once started,
            # never judged hung (status says it has no hang detection).
            if rt.state is S.STARTING:
                self.set(rt, S.RUNNING, "started (no heartbeat: no hang detection)")
            if not life.start_reported:  # nothing tells its steps: its running time trains
                life.start_reported = True
                detail = {"served": life.proc.served, "pid": life.proc.pid, "heartbeat": False}
                self.record("worker_training", rt.spec.name, detail)
            return False
        if not life.start_reported and (hb := life.live.heartbeat) is not None:
            self._report_start(rt, life, hb.start)
            if not life.start_reported and rt.spec.command is not None and life.live.progressed:
                # A command game's heartbeat (the SDK's) has no start marks: it trains from
                # its step moving past the one it started from.
                life.start_reported = True
                detail = {"served": life.proc.served, "pid": life.proc.pid, "from": "step"}
                self.record("worker_training", rt.spec.name, detail)
        hang = hang_reason(life.live, watchdog, now)
        if not hang:
            return False
        hb = life.live.heartbeat
        detail = {
            "reason": hang,
            "pid": life.proc.pid,
            "phase": hb.phase if hb else None,
            "global_step": hb.global_step if hb else None,
        }
        self.record("worker_hang", rt.spec.name, detail, {"reason": hang, "pid": life.proc.pid})
        return True

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
        self.record("worker_training", rt.spec.name, detail)

    # ---- stopping -----------------------------------------------------------------------------

    def stop(self, rt: GameRuntime, reason: StopReason, kill_at: float) -> None:
        """Ask its worker to checkpoint and exit; SIGKILL due at `kill_at` (the earliest asked)."""
        life = rt.life
        if life is None:
            return
        if rt.state is not S.STOPPING:
            self.set(rt, S.STOPPING, reason)
            life.stop_reason = reason
        self.outbox.append(Signal(life.proc))
        life.kill_at = kill_at if life.kill_at is None else min(life.kill_at, kill_at)

    def end_runs(self, ends: Iterable[EndRun], kill_at: float) -> None:
        """A sweep's trial ended: its runs stop with a checkpoint (exit 75) and are DONE, or
        are DONE at once when they have no worker."""
        for end in ends:
            rt = self.games.get(end.game)
            if rt is None:
                continue
            if rt.life is not None:
                if rt.state is S.STOPPING:
                    rt.life.stop_reason = StopReason.SWEEP  # whatever it was asked before
                self.stop(rt, StopReason.SWEEP, kill_at)
            elif rt.state in (S.WAITING, S.BACKOFF, S.STOPPED):
                self.set(rt, S.DONE, end.why)

    def escalate(self, now: float) -> None:
        """The workers past their grace after SIGTERM: killed, once each."""
        for rt in self.all():
            life = rt.life
            if life is not None and life.kill_at is not None and now >= life.kill_at:
                why = f"no exit within the grace after SIGTERM ({life.stop_reason})"
                log.warning("worker_kill", game=rt.spec.name, pid=life.proc.pid, reason=why)
                self.outbox.append(Signal(life.proc, kill=True))
                life.killed, life.kill_at = True, now + 3600  # once

    def shutdown(self, deadline: float) -> None:
        for rt in self.all():
            if rt.life is not None:
                self.stop(rt, StopReason.SHUTDOWN, deadline)
            elif rt.state in (S.WAITING, S.BACKOFF):
                self.set(rt, S.STOPPED, "supervisor shutdown")

    def apply_modes(self, want: Any, cap: int, now: float) -> None:
        """Restart workers whose effective mode changed (`want(name)`: the mode in force);
        stop the ones over the cap."""
        grace = self.cfg.stop_grace_s
        for rt in self.games.values():
            life, new = rt.life, want(rt.spec.name)
            if (
                rt.state in (S.STARTING, S.RUNNING)
                and life
                and rt.spec.knob_values(new) != rt.spec.knob_values(life.mode)
            ):
                log.info("mode_change", game=rt.spec.name, old=life.mode.name, new=new.name)
                self.stop(rt, StopReason.MODE_CHANGE, now + grace)
        leaving = (StopReason.MODE_CHANGE, StopReason.SLOTS)
        holding = [
            rt for rt in self.games.values() if rt.state in ACTIVE and rt.stop_reason not in leaving
        ]
        for rt in reversed(holding[cap:]):
            if rt.state is S.BACKOFF:
                self.set(rt, S.WAITING, "over max_concurrent")
            else:
                self.stop(rt, StopReason.SLOTS, now + grace)

    # ---- exits --------------------------------------------------------------------------------

    def exited(
        self,
        rt: GameRuntime,
        life: WorkerLife,
        ex: WorkerExit,
        now: float,
        *,
        stopping: bool,
        on_gpu: dict[str, Any],
    ) -> bool:
        """Where the exit leads: settled (done, stopped, requeued) or a failure counted
        against the budget (backoff, or FATAL past it). True for a failure."""
        self.set(rt, S.EXITED, ex.info.description, **ex.detail(), **on_gpu)
        if event := ex.error_event():
            self.record(event[0], rt.spec.name, event[1], False)
        rt.life = None
        removed = rt.spec.name in self.removed
        route = route_exit(
            ex.info.kind,
            life.stop_reason,
            removed=removed,
            stopping=stopping,
            progressed=ex.progressed,
            import_error=ex.start_import_error(self.cfg.watchdog.startup_grace_s),
        )
        if settled := ex.settle(route, life.stop_reason):
            self.set(rt, *settled)
            return False
        why, failure = ex.failure(life.stop_reason)
        if self.hold.excuses_deaths:
            # Killed at (or around) the preemption's deadline: requeued, resumed from its
            # newest checkpoint once the notice lapses or on the next boot; neither the
            # restart budget nor the stability policy's crash count sees it.
            self.record("worker_preempted", rt.spec.name, {**ex.detail(), "why": why})
            self.set(rt, S.WAITING, f"preempted: {why}")
            return False
        if failure is not None:
            # The full traceback is in the worker's log (and the event); the journal gets
            # one line saying what and where (in `<game>.log.1` if the next start rotates it).
            where = str(self.cfg.logs_dir / f"{rt.spec.name}.log")
            d = failure[1]
            line = {"error_kind": d.get("error_kind"), "log": where}
            line["message"] = d.get("message") or d.get("description")
            self.record(failure[0], rt.spec.name, {**d, "log": where, **on_gpu}, line)
        # A crash right after a resume is no evidence against the checkpoint (an env that
        # failed to build, a signal from outside, an error in evaluation): the next start
        # resumes from the same newest one, and the budget ends a real crash loop.
        self.failure(rt, why, ex.uptime_s, now)
        return True

    def spawn_failed(self, rt: GameRuntime, exc: OSError, now: float) -> None:
        """The worker could not be started. A command game's program (or its cwd) missing
        or not executable cannot start next time either: FATAL at once, naming it. Anything
        else (a full disk, a full process table) is a failure against the budget."""
        missing = (FileNotFoundError, PermissionError, NotADirectoryError)
        if rt.spec.command is not None and isinstance(exc, missing):
            command = " ".join(rt.spec.command)
            where = rt.spec.cwd or "the game's run dir"
            self.set(rt, S.FATAL, f"cannot start the command `{command}` (in {where}): {exc}")
            return
        self.failure(rt, f"cannot spawn the worker: {exc}", 0.0, now)

    def failure(self, rt: GameRuntime, why: str, uptime: float, now: float) -> None:
        """A failure against the restart budget: backoff, or FATAL once it is spent."""
        r = self.cfg.restart
        rt.failures = failures_in_window([*rt.failures, now], now, r.budget_window_s)
        rt.consecutive = consecutive_after_exit(rt.consecutive, uptime, r.stable_after_s)
        if budget_exhausted(rt.failures, now, r.budget_window_s, r.budget):
            self.set(
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
        self.set(
            rt, S.BACKOFF, why, delay_s=round(delay, 3), failures=len(rt.failures), budget=r.budget
        )

    def forget_removed(self) -> None:
        for name in [n for n, rt in self.removed.items() if rt.life is None]:
            del self.removed[name]

    # ---- a reload -----------------------------------------------------------------------------

    def reconfigure(self, cfg: Config, now: float) -> Reconciled:
        """The reloaded games: new ones queued, removed ones' workers stopped."""
        self.cfg = cfg
        change = reconcile(self.games, self.removed, cfg.games, self.wall())
        for rt in change.added:
            self.set(rt, S.WAITING, "added by config reload")
        for rt in change.leaving:
            self.stop(rt, StopReason.REMOVED, now + cfg.stop_grace_s)
        return change

    def all_settled(self) -> bool:
        return all(rt.state in TERMINAL for rt in self.games.values())
