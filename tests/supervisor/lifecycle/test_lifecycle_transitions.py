"""The lifecycle owner on its own, transition by transition (supervisord's `test_transition_*`):
each test drives a `Lifecycle` directly, with a fake worker process (a pid, nothing running) and
a fake clock, and asserts on the state it leaves and on its outbox (the events to record, the
rows to write, the GPUs to release, the signals to send) that the daemon would apply. No
process is started, no Supervisor built, nothing sleeps."""

from __future__ import annotations

import errno
import random
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from supervisor.config import (
    Config,
    GameSpec,
    GpuConfig,
    ModeSpec,
    RestartConfig,
    StabilityConfig,
    WatchdogConfig,
)
from supervisor.launch.process import HOST_LOST_RC
from supervisor.launch.spawn import WorkerProcess
from supervisor.lifecycle.exits import StopReason, WorkerExit
from supervisor.lifecycle.game import Effect, Lifecycle, Record, Release, Signal, WriteRow
from supervisor.lifecycle.restart import ExitInfo, ExitKind, classify_exit
from supervisor.lifecycle.runtime import GameRuntime, WorkerLife
from supervisor.lifecycle.states import IllegalTransition
from supervisor.lifecycle.states import WorkerState as S
from supervisor.preemption.notice import Hold, Notice
from training.protocol import ExitCode, Heartbeat

T0 = 1_800_000_000.0  # the wall clock (state_since); the monotonic `now` is passed per call
LIGHT = ModeSpec("light", num_envs=2, batch_size=2, n_steps=4, max_concurrent=2)
HEAVY = ModeSpec("heavy", num_envs=4, batch_size=4, n_steps=4, max_concurrent=2)
WATCHDOG = WatchdogConfig(startup_grace_s=90.0, hang_timeout_s=5.0, kill_grace_s=10.0)
STOP_GRACE_S = 30.0
BACKOFF_BASE_S = 10.0
BUDGET = 2  # a third failure in the window is FATAL
WINDOW_S = 600.0
STABLE_AFTER_S = 60.0


class Wall:
    """The fake wall clock the lifecycle stamps `state_since` with."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class NoJitter(random.Random):
    """Backoff's jitter draw, fixed at 0: a delay is exactly half its raw value."""

    def random(self) -> float:
        return 0.0


class FakePopen:
    """All the lifecycle reads of a worker's Popen: its pid (it never polls or signals)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid


def proc(pid: int) -> WorkerProcess:
    popen = cast("subprocess.Popen[bytes]", FakePopen(pid))
    return WorkerProcess(popen=popen, pidfd=-1, create_time=T0, started_mono=0.0)


def game(name: str, command: tuple[str, ...] | None = None, heartbeat: bool = True) -> GameSpec:
    return GameSpec(
        name, "CartPole-v1", "ppo", total_steps=1000, seed=1, device="cpu",
        command=command, heartbeat=heartbeat,
    )  # fmt: skip


def config(*games: GameSpec) -> Config:
    return Config(
        path=Path("/nonexistent/rlsup.toml"),
        state_dir=Path("/nonexistent/state"),
        initial_mode="light",
        checkpoint_every_s=60.0,
        stop_grace_s=STOP_GRACE_S,
        cost_per_hour=0.0,
        modes=(LIGHT, HEAVY),
        games=games,
        restart=RestartConfig(
            backoff_base_s=BACKOFF_BASE_S,
            backoff_max_s=300.0,
            budget=BUDGET,
            budget_window_s=WINDOW_S,
            stable_after_s=STABLE_AFTER_S,
        ),
        watchdog=WATCHDOG,
        stability=StabilityConfig(),
        gpu=GpuConfig(),
    )


def lifecycle(*names: str, games: tuple[GameSpec, ...] = (), wall: Wall | None = None) -> Lifecycle:
    """A lifecycle of games `names` (plus `games`), all queued, its outbox drained."""
    life = Lifecycle(config(*(game(n) for n in names), *games), wall=wall or Wall(), rng=NoJitter())
    life.queue_new()
    life.drain()
    return life


def beat(
    pid: int,
    step: int = 0,
    *,
    seq: int = 1,
    resumed: int | None = None,
    ckpt: int | None = None,
    start: dict[str, Any] | None = None,
) -> Heartbeat:
    return Heartbeat(
        seq=seq, pid=pid, phase="training", phase_deadline_s=0.0, global_step=step,
        total_steps=1000, episodes=0, sps=0.0, mean_return=None, last_checkpoint_step=ckpt,
        resumed_from_step=resumed, num_envs=2, batch_size=2, device="cpu", gpu_mem_mb=None,
        start=start or {},
    )  # fmt: skip


def spawned(life: Lifecycle, name: str, pid: int, now: float = 0.0) -> GameRuntime:
    """The game's worker spawned (STARTING), the outbox drained."""
    rt = life.games[name]
    life.started(rt, proc(pid), LIGHT, now=now, spawned_at=now, threads=1)
    life.drain()
    return rt


def running(life: Lifecycle, name: str, pid: int, now: float = 0.0) -> GameRuntime:
    """The game's worker past its first heartbeat (RUNNING, at step 0), the outbox drained."""
    rt = spawned(life, name, pid, now)
    life.heartbeat(rt, worker(rt), beat(pid), now)
    life.check(rt, worker(rt), WATCHDOG, now)
    life.drain()
    assert rt.state is S.RUNNING
    return rt


def worker(rt: GameRuntime) -> WorkerLife:
    assert rt.life is not None, f"{rt.spec.name} has no worker ({rt.state})"
    return rt.life


def exit_of(
    rc: int | ExitInfo,
    *,
    uptime: float = 30.0,
    error: dict[str, Any] | None = None,
    hb: Heartbeat | None = None,
    killed: bool = False,
) -> WorkerExit:
    info = rc if isinstance(rc, ExitInfo) else classify_exit(rc)
    return WorkerExit(info, uptime, error, hb, killed, None)


def exits(
    life: Lifecycle, rt: GameRuntime, ex: WorkerExit, now: float, stopping: bool = False
) -> bool:
    """The worker's exit, as the daemon's reap hands it over (no GPU here)."""
    return life.exited(rt, worker(rt), ex, now, stopping=stopping, on_gpu={})


def effects(out: list[Effect]) -> list[tuple[str, object]]:
    """The outbox in short: ("record", kind), ("row", game), ("release", game), ("term", pid)
    or ("kill", pid)."""
    short: list[tuple[str, object]] = []
    for e in out:
        if isinstance(e, Record):
            short.append(("record", e.kind))
        elif isinstance(e, WriteRow):
            short.append(("row", e.game))
        elif isinstance(e, Release):
            short.append(("release", e.game))
        elif isinstance(e, Signal):
            short.append(("kill" if e.kill else "term", e.proc.pid))
    return short


def recorded(out: list[Effect], kind: str) -> Record:
    """The one event of `kind` in the outbox."""
    [record] = [e for e in out if isinstance(e, Record) and e.kind == kind]
    return record


def pick(detail: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: detail.get(k, "<absent>") for k in keys}


EXIT_THEN = ("from", "to", "reason")


# ---- starts ---------------------------------------------------------------------------------


def test_transition_stopped_to_waiting_queued_at_start_up() -> None:
    wall = Wall()
    life = Lifecycle(config(game("a"), game("b")), wall=wall, rng=NoJitter())
    life.games["b"].state = S.DONE  # restored done from the database (restore_states)
    wall.t = T0 + 7
    life.queue_new()
    a = life.games["a"]
    # WAITING is no event of its own: its row says it.
    assert effects(life.drain()) == [("row", "a")]
    assert (a.state, a.reason, a.state_since) == (S.WAITING, "queued", T0 + 7)
    assert life.games["b"].state is S.DONE


def test_transition_stopped_to_waiting_added_by_a_reload() -> None:
    life = lifecycle("a")
    change = life.reconfigure(config(game("a"), game("b")), now=10.0)
    assert [rt.spec.name for rt in change.added] == ["b"] and change.leaving == []
    assert effects(life.drain()) == [("row", "b")]
    assert (life.games["b"].state, life.games["b"].reason) == (S.WAITING, "added by config reload")


def test_waiting_games_are_started_in_order_while_slots_are_free() -> None:
    life = lifecycle("a", "b", "c")
    assert [rt.spec.name for rt in life.candidates(2, now=0.0)] == ["a", "b"]
    spawned(life, "a", 101)
    assert [rt.spec.name for rt in life.candidates(2, now=0.0)] == ["b"]
    assert life.alive() == 1


def test_transition_waiting_to_starting_slot_free() -> None:
    life = lifecycle("a")
    rt = life.games["a"]
    placed = {"gpu": {"index": 0, "uuid": "GPU-0"}}
    life.started(rt, proc(101), LIGHT, now=5.0, spawned_at=4.5, threads=3, **placed)
    out = life.drain()
    assert effects(out) == [("record", "worker_start"), ("row", "a")]
    start = recorded(out, "worker_start")
    assert start.game == "a" and start.log is False  # the transition logged its own line
    assert start.detail == {
        "from": "waiting", "to": "starting", "reason": "slot free", "pid": 101, "restarts": 0,
        "mode": "light", "num_envs": 2, "batch_size": 2, "n_steps": 4, "threads": 3,
        "served": "cold", **placed,
    }  # fmt: skip
    assert (rt.state, rt.restarts, rt.mode) == (S.STARTING, 0, LIGHT)
    assert worker(rt).proc.pid == 101 and worker(rt).spawned_at == 4.5


def test_transition_waiting_to_backoff_when_the_spawn_fails() -> None:
    life = lifecycle("a")
    rt = life.games["a"]
    life.spawn_failed(rt, OSError(errno.ENOSPC, "No space left on device"), now=5.0)
    out = life.drain()
    assert effects(out) == [("record", "backoff"), ("row", "a")]
    assert pick(recorded(out, "backoff").detail, *EXIT_THEN, "delay_s", "failures") == {
        "from": "waiting", "to": "backoff",
        "reason": "cannot spawn the worker: [Errno 28] No space left on device",
        "delay_s": 0.0, "failures": 1,
    }  # fmt: skip
    assert rt.failures == [5.0] and rt.backoff_until == 5.0


def test_transition_waiting_to_fatal_when_a_command_games_program_is_missing() -> None:
    life = lifecycle(games=(game("mine", command=("/nonexistent/train",)),))
    rt = life.games["mine"]
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory", "/nonexistent/train")
    life.spawn_failed(rt, missing, now=5.0)
    out = life.drain()
    assert effects(out) == [("release", "mine"), ("record", "fatal"), ("row", "mine")]
    assert rt.state is S.FATAL and rt.failures == []  # not a failure: a restart cannot help
    assert rt.reason.startswith(
        "cannot start the command `/nonexistent/train` (in the game's run dir): [Errno 2]"
    )


def test_transition_backoff_to_backoff_when_the_restart_cannot_spawn() -> None:
    life = lifecycle("a")
    rt = life.games["a"]
    life.spawn_failed(rt, OSError(errno.ENOSPC, "No space left on device"), now=5.0)
    life.drain()
    assert life.candidates(2, now=5.0) == [rt]  # the restart is due: the daemon spawns it
    life.spawn_failed(rt, OSError(errno.ENOSPC, "No space left on device"), now=6.0)
    out = life.drain()
    assert effects(out) == [("record", "backoff"), ("row", "a")]
    assert recorded(out, "backoff").detail["failures"] == 2
    assert rt.state is S.BACKOFF and rt.backoff_until == 6.0 + BACKOFF_BASE_S / 2


# ---- heartbeats and hangs -----------------------------------------------------------------


def test_transition_starting_to_running_on_the_first_heartbeat() -> None:
    life = lifecycle("a")
    rt = spawned(life, "a", 101)
    assert life.check(rt, worker(rt), WATCHDOG, now=1.0) is False
    assert rt.state is S.STARTING and life.drain() == []  # no heartbeat yet: nothing moves
    assert life.heartbeat(rt, worker(rt), beat(101, 500, resumed=500), now=2.0) is False
    assert life.drain() == []  # reading it changes no state
    assert life.check(rt, worker(rt), WATCHDOG, now=2.0) is False
    assert effects(life.drain()) == [("row", "a")]  # RUNNING: its row, no event
    assert (rt.state, rt.reason) == (S.RUNNING, "first heartbeat")
    # A later heartbeat is no first one: RUNNING stays, nothing is written.
    life.heartbeat(rt, worker(rt), beat(101, 520, seq=2, resumed=500), now=3.0)
    assert life.check(rt, worker(rt), WATCHDOG, now=3.0) is False
    assert life.drain() == []


def test_the_first_step_reports_how_the_worker_started_once() -> None:
    life = lifecycle("a")
    rt = spawned(life, "a", 101, now=10.0)
    marks = {"loaded": 11.0, "first_step": 12.5}
    life.heartbeat(rt, worker(rt), beat(101, 8, start=marks), now=13.0)
    life.check(rt, worker(rt), WATCHDOG, now=13.0)
    out = life.drain()
    assert effects(out) == [("row", "a"), ("record", "worker_training")]
    assert pick(recorded(out, "worker_training").detail, "served", "pid", "total_s") == {
        "served": "cold", "pid": 101, "total_s": 2.5,
    }  # fmt: skip
    life.heartbeat(rt, worker(rt), beat(101, 16, seq=2, start=marks), now=14.0)
    life.check(rt, worker(rt), WATCHDOG, now=14.0)
    assert life.drain() == []


def test_transition_starting_to_running_for_a_command_game_without_heartbeats() -> None:
    life = lifecycle(games=(game("mine", command=("train",), heartbeat=False),))
    rt = spawned(life, "mine", 101)
    assert life.check(rt, worker(rt), WATCHDOG, now=0.5) is False
    out = life.drain()
    assert effects(out) == [("row", "mine"), ("record", "worker_training")]
    assert rt.reason == "started (no heartbeat: no hang detection)"
    assert recorded(out, "worker_training").detail["heartbeat"] is False
    # It promised none: never judged hung, however long it stays silent.
    assert life.check(rt, worker(rt), WATCHDOG, now=1e6) is False
    assert life.drain() == [] and rt.state is S.RUNNING


def test_transition_running_to_stopping_on_a_hang_then_killed_once_past_the_grace() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)  # step 0, no progress: start-up grace (90 s) is the limit
    assert life.check(rt, worker(rt), WATCHDOG, now=90.0) is False
    assert life.check(rt, worker(rt), WATCHDOG, now=100.0) is True
    out = life.drain()
    assert effects(out) == [("record", "worker_hang")]  # the caller stops it
    hang = recorded(out, "worker_hang")
    assert hang.detail["reason"] == "heartbeat seq unchanged for 100.0 s (limit 90 s)"
    assert pick(hang.detail, "pid", "phase", "global_step") == {
        "pid": 101, "phase": "training", "global_step": 0,
    }  # fmt: skip
    assert rt.state is S.RUNNING

    life.stop(rt, StopReason.HANG, kill_at=100.0 + WATCHDOG.kill_grace_s)
    assert effects(life.drain()) == [("row", "a"), ("term", 101)]
    assert (rt.state, rt.reason, rt.stop_reason) == (S.STOPPING, "hang", StopReason.HANG)
    life.escalate(now=109.0)
    assert life.drain() == []
    life.escalate(now=110.0)
    assert effects(life.drain()) == [("kill", 101)]
    assert worker(rt).killed is True
    life.escalate(now=111.0)
    assert life.drain() == []  # once


def test_a_second_stop_resends_sigterm_and_keeps_the_earliest_kill() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    life.stop(rt, StopReason.MODE_CHANGE, kill_at=50.0)
    life.drain()
    life.stop(rt, StopReason.SHUTDOWN, kill_at=40.0)
    assert effects(life.drain()) == [("term", 101)]  # no second STOPPING
    assert rt.stop_reason is StopReason.MODE_CHANGE and worker(rt).kill_at == 40.0
    life.stop(rt, StopReason.SHUTDOWN, kill_at=60.0)
    assert worker(rt).kill_at == 40.0


def test_transition_stopping_to_exited_to_backoff_after_a_hang_kill() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    life.stop(rt, StopReason.HANG, kill_at=110.0)
    life.escalate(now=110.0)
    life.drain()
    ex = exit_of(-9, uptime=111.0, hb=beat(101), killed=True)
    assert exits(life, rt, ex, now=111.0) is True
    out = life.drain()
    # The hang made its own event: no worker_crash beside it.
    assert effects(out) == [
        ("release", "a"), ("record", "worker_exit"), ("row", "a"),
        ("record", "backoff"), ("row", "a"),
    ]  # fmt: skip
    exit_detail = recorded(out, "worker_exit").detail
    assert pick(exit_detail, *EXIT_THEN, "exit", "killed_by_supervisor") == {
        "from": "stopping", "to": "exited", "reason": "killed by SIGKILL",
        "exit": "killed_by_signal", "killed_by_supervisor": True,
    }  # fmt: skip
    assert recorded(out, "backoff").detail["reason"] == "hang: killed by SIGKILL"
    assert rt.life is None and rt.failures == [111.0]


# ---- exits --------------------------------------------------------------------------------


def test_transition_running_to_exited_to_done_at_total_steps() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    ex = exit_of(ExitCode.DONE, uptime=120.0, hb=beat(101, 1000, seq=9, ckpt=1000))
    assert exits(life, rt, ex, now=120.0) is False
    out = life.drain()
    assert effects(out) == [
        ("release", "a"), ("record", "worker_exit"), ("row", "a"),
        ("release", "a"), ("record", "game_done"), ("row", "a"),
    ]  # fmt: skip
    exit_detail = recorded(out, "worker_exit").detail
    assert pick(exit_detail, *EXIT_THEN, "pid", "returncode", "exit", "uptime_s") == {
        "from": "running", "to": "exited", "reason": "exit status 0 (done)", "pid": 101,
        "returncode": 0, "exit": "done", "uptime_s": 120.0,
    }  # fmt: skip
    assert pick(exit_detail, "global_step", "last_checkpoint_step") == {
        "global_step": 1000, "last_checkpoint_step": 1000,
    }  # fmt: skip
    assert pick(recorded(out, "game_done").detail, *EXIT_THEN) == {
        "from": "exited", "to": "done", "reason": "total_steps reached",
    }  # fmt: skip
    assert rt.state is S.DONE and rt.life is None and rt.failures == []
    assert life.all_settled()


def test_transition_running_to_exited_to_backoff_on_a_crash() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    error = {"kind": "exception", "message": "ValueError: bad reward\n  more", "traceback": "tb"}
    ex = exit_of(1, uptime=30.0, error=error, hb=beat(101, 64, seq=5))
    assert exits(life, rt, ex, now=30.0) is True
    out = life.drain()
    assert effects(out) == [
        ("release", "a"), ("record", "worker_exit"), ("row", "a"),
        ("record", "worker_crash"), ("record", "backoff"), ("row", "a"),
    ]  # fmt: skip
    crash = recorded(out, "worker_crash")
    where = "/nonexistent/state/logs/a.log"
    assert pick(crash.detail, "returncode", "description", "error_kind", "traceback", "log") == {
        "returncode": 1, "description": "exit status 1 (crash)", "error_kind": "exception",
        "traceback": "tb", "log": where,
    }  # fmt: skip
    assert crash.log == {"error_kind": "exception", "log": where, "message": error["message"]}
    backoff = recorded(out, "backoff").detail
    assert pick(backoff, *EXIT_THEN, "delay_s", "failures", "budget") == {
        "from": "exited", "to": "backoff",
        "reason": "crash: exit status 1 (crash): ValueError: bad reward",
        "delay_s": 0.0, "failures": 1, "budget": BUDGET,
    }  # fmt: skip
    assert (rt.state, rt.backoff_until, rt.consecutive) == (S.BACKOFF, 30.0, 1)


def test_transition_running_to_exited_to_backoff_on_an_oom_with_its_checkpoint_error() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    error = {"kind": "checkpoint_corrupt", "message": "ckpt-64: bad digest"}
    assert exits(life, rt, exit_of(ExitCode.OOM, error=error), now=30.0) is True
    out = life.drain()
    kinds = [kind for what, kind in effects(out) if what == "record"]
    assert kinds == ["worker_exit", "checkpoint_corrupt", "worker_oom", "backoff"]
    assert recorded(out, "checkpoint_corrupt").detail == {
        "error_kind": "checkpoint_corrupt", "message": "ckpt-64: bad digest",
    }  # fmt: skip
    assert recorded(out, "backoff").detail["reason"].startswith("oom: exit status 76 (oom)")


def test_transition_backoff_to_starting_restart_when_the_delay_is_over() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    exits(life, rt, exit_of(1), now=30.0)
    rt = running(life, "a", 102, now=30.0)  # the first restart in a row: at once
    exits(life, rt, exit_of(1, uptime=5.0), now=35.0)  # the second: base/2 (no jitter)
    life.drain()
    assert rt.backoff_until == 35.0 + BACKOFF_BASE_S / 2
    assert life.candidates(2, now=39.9) == []
    assert life.candidates(2, now=40.0) == [rt]
    life.started(rt, proc(103), LIGHT, now=40.0, spawned_at=40.0, threads=1)
    out = life.drain()
    assert effects(out) == [("record", "restart"), ("row", "a")]  # a restart, not a start
    assert pick(recorded(out, "restart").detail, *EXIT_THEN, "restarts", "pid") == {
        "from": "backoff", "to": "starting", "reason": "restart after backoff",
        "restarts": 2, "pid": 103,
    }  # fmt: skip


def test_a_stable_run_resets_the_backoff() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    exits(life, rt, exit_of(1, uptime=5.0), now=5.0)
    rt = running(life, "a", 102, now=5.0)
    exits(life, rt, exit_of(1, uptime=STABLE_AFTER_S), now=65.0)  # stayed up: no loop
    assert rt.consecutive == 1 and rt.backoff_until == 65.0
    assert recorded(life.drain(), "backoff").detail["failures"] == 2  # still in the budget


def crash_loop(life: Lifecycle, name: str, at: list[float]) -> list[Effect]:
    """Crash the game's worker once at each time in `at` (each after a fast restart);
    returns the outbox of the last crash."""
    out: list[Effect] = []
    for i, now in enumerate(at):
        rt = running(life, name, 200 + i, now=now)
        exits(life, rt, exit_of(1, uptime=1.0), now=now)
        out = life.drain()
    return out


def test_transition_exited_to_fatal_past_the_restart_budget() -> None:
    life = lifecycle("a")
    out = crash_loop(life, "a", [10.0, 20.0, 30.0])
    rt = life.games["a"]
    assert effects(out) == [
        ("release", "a"), ("record", "worker_exit"), ("row", "a"), ("record", "worker_crash"),
        ("release", "a"), ("record", "fatal"), ("row", "a"),
    ]  # fmt: skip
    assert rt.state is S.FATAL and life.all_settled()
    assert recorded(out, "fatal").detail["reason"] == (
        "restart budget spent: 3 failures in 600 s (budget 2); last: crash: exit status 1 (crash)"
    )
    assert life.candidates(2, now=1e6) == []  # never started again


def test_the_budget_window_refills_as_failures_age_out() -> None:
    life = lifecycle("a")
    out = crash_loop(life, "a", [10.0, 20.0, 20.0 + WINDOW_S])
    assert life.games["a"].state is S.BACKOFF
    assert recorded(out, "backoff").detail["failures"] == 1  # the first two aged out


def test_transition_running_to_exited_to_fatal_on_a_config_error_exit_78() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    error = {"kind": "config_error", "message": "unknown env_id 'Foo-v0'"}
    assert exits(life, rt, exit_of(ExitCode.CONFIG, error=error), now=3.0) is False
    out = life.drain()
    kinds = [kind for what, kind in effects(out) if what == "record"]
    assert kinds == ["worker_exit", "fatal"]  # no crash event, no backoff
    assert rt.reason == "configuration error: unknown env_id 'Foo-v0'"
    assert rt.state is S.FATAL and rt.failures == []


IMPORT_ERROR = {
    "kind": "import_error",
    "message": "ModuleNotFoundError: No module named 'gymnasium'\nTraceback ...",
}


def test_transition_starting_to_exited_to_fatal_on_an_import_error_at_start_up() -> None:
    life = lifecycle("a")
    rt = spawned(life, "a", 101)
    ex = exit_of(1, uptime=2.0, error=IMPORT_ERROR)  # before any heartbeat, within the grace
    assert exits(life, rt, ex, now=2.0) is False
    out = life.drain()
    assert [kind for what, kind in effects(out) if what == "record"] == ["worker_exit", "fatal"]
    assert pick(recorded(out, "worker_exit").detail, "from", "to") == {
        "from": "starting", "to": "exited",
    }  # fmt: skip
    assert rt.state is S.FATAL and rt.failures == []
    assert rt.reason.startswith(
        "cannot start: ModuleNotFoundError: No module named 'gymnasium' "
        "(at start-up, before any heartbeat); restarting cannot help"
    )


def test_transition_running_to_exited_to_backoff_on_an_import_error_after_a_heartbeat() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    ex = exit_of(1, uptime=2.0, error=IMPORT_ERROR, hb=beat(101))
    assert exits(life, rt, ex, now=2.0) is True  # a crash like any other: the budget decides
    assert rt.state is S.BACKOFF
    assert ("record", "worker_crash") in effects(life.drain())


def test_transition_running_to_exited_to_backoff_on_an_unrequested_exit_75_without_progress() -> (
    None
):
    life = lifecycle("a")
    rt = running(life, "a", 101)
    ex = exit_of(ExitCode.STOPPED, uptime=1.0, hb=beat(101))  # nobody asked, nothing gained
    assert exits(life, rt, ex, now=1.0) is True
    out = life.drain()
    assert [kind for what, kind in effects(out) if what == "record"] == ["worker_exit", "backoff"]
    assert rt.reason == "exit 75 without a stop request and without progress since its start"
    assert rt.state is S.BACKOFF and rt.failures == [1.0]


def test_transition_running_to_exited_to_waiting_on_an_unrequested_exit_75_after_progress() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    ex = exit_of(ExitCode.STOPPED, hb=beat(101, 64, seq=9, ckpt=64))
    assert exits(life, rt, ex, now=30.0) is False
    assert [kind for what, kind in effects(life.drain()) if what == "record"] == ["worker_exit"]
    assert (rt.state, rt.reason) == (S.WAITING, "stopped after a checkpoint (exit 75)")
    assert rt.failures == []


@pytest.mark.parametrize(
    ("info", "state", "reason"),
    [
        (classify_exit(ExitCode.FENCED), S.FATAL, "fenced: the game was placed again"),
        (classify_exit(HOST_LOST_RC), S.WAITING, "its host was lost: placed again"),
        (
            ExitInfo(ExitKind.START_LOST, -9, "killed by SIGKILL (as the spare)"),
            S.WAITING,
            "the spare died before it took the assignment",
        ),
    ],
    ids=["fenced-77", "host-lost", "spare-lost"],
)
def test_transition_running_to_exited_settles_without_a_failure(
    info: ExitInfo, state: S, reason: str
) -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    assert exits(life, rt, exit_of(info), now=30.0) is False
    assert rt.state is state and rt.reason.startswith(reason)
    assert rt.failures == []


def test_transition_running_to_exited_to_waiting_when_a_counted_preemption_excuses_it() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    notice = Notice("aws", "terminate", deadline=T0 + 120, notice_at=T0, posted=T0 + 120)
    life.hold = Hold(notice, counted=True)
    assert exits(life, rt, exit_of(-9, uptime=30.0), now=30.0) is False
    out = life.drain()
    kinds = [kind for what, kind in effects(out) if what == "record"]
    assert kinds == ["worker_exit", "worker_preempted"]  # no crash, no backoff
    assert recorded(out, "worker_preempted").detail["why"] == "killed_by_signal: killed by SIGKILL"
    assert rt.state is S.WAITING and rt.reason.startswith("preempted: ")
    assert rt.failures == [] and life.candidates(2, now=30.0) == []  # nothing starts meanwhile
    # Past max_preemptions the notice holds starts, but a death is a failure again.
    rt = running(life, "a", 102)
    life.hold = Hold(notice, counted=False)
    assert exits(life, rt, exit_of(-9), now=40.0) is True and rt.state is S.BACKOFF


# ---- stops the supervisor asks for ------------------------------------------------------------


def test_transition_running_to_stopping_on_a_mode_change() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    life.apply_modes(lambda name: LIGHT, cap=2, now=10.0)
    assert life.drain() == []  # the same sizes: nothing to do
    life.apply_modes(lambda name: HEAVY, cap=2, now=10.0)
    assert effects(life.drain()) == [("row", "a"), ("term", 101)]
    assert (rt.state, rt.reason, rt.stop_reason) == (S.STOPPING, "mode_change", "mode_change")
    assert worker(rt).kill_at == 10.0 + STOP_GRACE_S


def test_transition_running_to_stopping_over_max_concurrent() -> None:
    life = lifecycle("a", "b")
    running(life, "a", 101)
    b = running(life, "b", 102)
    life.apply_modes(lambda name: LIGHT, cap=1, now=10.0)  # the cap went down to 1
    assert effects(life.drain()) == [("row", "b"), ("term", 102)]  # the last one leaves
    assert (b.state, b.stop_reason) == (S.STOPPING, StopReason.SLOTS)
    life.apply_modes(lambda name: LIGHT, cap=1, now=11.0)
    assert effects(life.drain()) == []  # already leaving: no other one is stopped for it


def test_transition_backoff_to_waiting_over_max_concurrent() -> None:
    life = lifecycle("a", "b")
    running(life, "a", 101)
    b = running(life, "b", 102)
    exits(life, b, exit_of(1), now=5.0)
    life.drain()
    life.apply_modes(lambda name: LIGHT, cap=1, now=10.0)
    assert effects(life.drain()) == [("row", "b")]
    assert (b.state, b.reason) == (S.WAITING, "over max_concurrent")


@pytest.mark.parametrize(
    "asked",
    [StopReason.MODE_CHANGE, StopReason.SLOTS, StopReason.GPU_LOST, StopReason.GPU_MOVE],
)
def test_transition_stopping_to_exited_to_waiting_when_the_supervisor_asked(
    asked: StopReason,
) -> None:
    life = lifecycle("a")
    rt = spawned(life, "a", 101)  # from STARTING as well as RUNNING
    life.stop(rt, asked, kill_at=40.0)
    life.drain()
    # Whatever the status (here a SIGTERM death without a checkpoint): asked for, no failure.
    assert exits(life, rt, exit_of(-15), now=12.0) is False
    out = life.drain()
    assert [kind for what, kind in effects(out) if what == "record"] == ["worker_exit"]
    assert pick(recorded(out, "worker_exit").detail, "from", "to") == {
        "from": "stopping", "to": "exited",
    }  # fmt: skip
    assert (rt.state, rt.reason, rt.failures) == (S.WAITING, str(asked), [])
    assert life.candidates(2, now=12.0) == [rt]


def test_transition_running_to_stopping_on_shutdown_and_the_idle_ones_to_stopped() -> None:
    life = lifecycle("a", "b", "c")
    running(life, "a", 101)
    c = running(life, "c", 103)
    exits(life, c, exit_of(1), now=5.0)  # c waits out a backoff, b waits for a slot
    life.drain()
    life.shutdown(deadline=50.0)
    assert effects(life.drain()) == [
        ("row", "a"), ("term", 101),
        ("release", "b"), ("row", "b"),
        ("release", "c"), ("row", "c"),
    ]  # fmt: skip
    states = {name: (rt.state, rt.reason) for name, rt in life.games.items()}
    assert states == {
        "a": (S.STOPPING, "shutdown"),
        "b": (S.STOPPED, "supervisor shutdown"),
        "c": (S.STOPPED, "supervisor shutdown"),
    }
    assert worker(life.games["a"]).kill_at == 50.0


def test_transition_stopping_to_exited_to_stopped_on_shutdown_whatever_the_status() -> None:
    life = lifecycle("a")
    rt = running(life, "a", 101)
    life.shutdown(deadline=50.0)
    life.drain()
    assert exits(life, rt, exit_of(1), now=20.0, stopping=True) is False  # not a failure
    out = life.drain()
    assert [kind for what, kind in effects(out) if what == "record"] == ["worker_exit"]
    assert (rt.state, rt.reason, rt.failures) == (S.STOPPED, "supervisor shutdown", [])


def test_transition_running_to_stopping_to_stopped_when_removed_by_a_reload() -> None:
    life = lifecycle("a", "b")
    a = running(life, "a", 101)
    change = life.reconfigure(config(game("b")), now=10.0)
    assert change.leaving == [a] and list(life.games) == ["b"] and list(life.removed) == ["a"]
    assert effects(life.drain()) == [("row", "a"), ("term", 101)]
    assert (a.state, a.stop_reason) == (S.STOPPING, StopReason.REMOVED)
    assert worker(a).kill_at == 10.0 + STOP_GRACE_S
    # It is still watched (escalated, reaped) until its worker is gone.
    assert a in life.all()
    assert exits(life, a, exit_of(ExitCode.STOPPED), now=12.0) is False
    assert (a.state, a.reason) == (S.STOPPED, "removed from the configuration")
    life.forget_removed()
    assert life.removed == {} and a not in life.all()


def test_transition_stopping_to_exited_to_waiting_when_readded_while_stopping() -> None:
    life = lifecycle("a")
    a = running(life, "a", 101)
    life.reconfigure(config(), now=10.0)
    life.reconfigure(config(game("a")), now=11.0)  # back before its old worker exited
    assert life.games["a"] is a and life.removed == {}
    assert a.state is S.STOPPING and a.stop_reason is StopReason.READDED
    assert life.candidates(2, now=11.0) == []  # never two workers at once
    life.drain()
    assert exits(life, a, exit_of(ExitCode.STOPPED), now=12.0) is False
    assert (a.state, a.reason) == (S.WAITING, "readded")


# ---- refused transitions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "target"),
    [
        (lambda life: life.games["a"], S.RUNNING),  # WAITING: never heart-beating unstarted
        (lambda life: running(life, "a", 101), S.STARTING),
        (lambda life: running(life, "a", 101), S.WAITING),  # only through EXITED
    ],
    ids=["waiting-to-running", "running-to-starting", "running-to-waiting"],
)
def test_transition_refused_from_a_wrong_source_state(
    make: Callable[[Lifecycle], GameRuntime], target: S
) -> None:
    life = lifecycle("a")
    rt = make(life)
    before = (rt.state, rt.reason, rt.state_since)
    with pytest.raises(IllegalTransition):
        life.set(rt, target, "a bug")
    assert (rt.state, rt.reason, rt.state_since) == before
    assert life.drain() == []  # nothing to record, release or write


def test_transition_refused_from_a_terminal_state_to_a_start() -> None:
    life = lifecycle("a")
    crash_loop(life, "a", [1.0, 2.0, 3.0])
    rt = life.games["a"]
    assert rt.state is S.FATAL
    with pytest.raises(IllegalTransition):
        life.set(rt, S.STARTING, "a bug")
    assert rt.state is S.FATAL and life.drain() == []


# ---- the thread budget of a worker starting now ---------------------------------------------


def test_a_game_waiting_out_its_restart_delay_keeps_its_share_of_the_cores() -> None:
    """Two games on 2 cores crash together: the first back must get 1 thread, not 2. With 2 it
    kept both cores for its worker's life, and its two OpenMP threads beside the other game's
    trained 40x slower (benchmarks/goodput.py: 100 against 4,000 CartPole steps/s)."""
    life = lifecycle("a", "b", "c")
    a, b = running(life, "a", 101), running(life, "b", 102)
    assert life.thread_share(2, [life.games["c"]]) == 1  # 3 on 2 cores: 1 each
    for rt in (a, b):
        exits(life, rt, exit_of(1, uptime=1.0), now=5.0)
    life.drain()
    assert (a.state, b.state) == (S.BACKOFF, S.BACKOFF)
    # a's delay is over first; b is still waiting out its own and comes back in a moment.
    assert life.thread_share(2, [a]) == 1
    assert life.thread_share(4, [a]) == 2
    life.set(b, S.FATAL, "restart budget spent")  # a game gone for good frees its share
    life.drain()
    assert life.thread_share(2, [a]) == 2
