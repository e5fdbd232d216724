"""Fault-injection soak engine: a real `rlsup run` under a seeded schedule of faults.

Shared by the CI test (tests/chaos/test_soak.py, a short schedule) and the long run
(benchmarks/soak.py, RLSUP_SOAK_MINUTES). Faults are injected from outside wherever possible:
SIGKILL (also mid-checkpoint), SIGSTOP, supervisor kill, a simulated host reboot, corrupt
checkpoints and replay chunks, read errors, a full filesystem (tmpfs), a kernel OOM kill (memory
cgroup), a locked or full state database, a wall-clock step, mode pins.

The parts, each in its own module:
  soak_config    the games and settings of a run
  soak_monitor   a thread that samples processes, heartbeats and checkpoint dirs
  soak_faults    the injections (`Injector`) and what each one did (`Fault`)
  soak_analysis  invariants, expected events (`EventLog`) and figures (`Analyst`)
  soak_kinds     the one table: per fault kind, its injection, events, invariants, weights
  soak_engine    this: set-up, the supervisor processes, the schedule, the waits; `run_soak`
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import psutil

from harness.chaos.soak_analysis import Analyst
from harness.chaos.soak_config import (
    LIGHT_ENVS,
    MEDIUM_ENVS,
    N_STEPS,
    PY,
    REPO,
    GameDef,
    SoakSettings,
    default_games,
)
from harness.chaos.soak_faults import Fault, Injector
from harness.chaos.soak_kinds import KINDS, FaultKind
from harness.chaos.soak_monitor import Monitor
from harness.chaos.soak_services import (
    AWS_ENV,
    HOOK_MARK_ENV,
    HOOK_TIMEOUT_S,
    Mirror,
    free_port,
    hook_processes,
    limit_descriptors,
    write_hook,
)
from harness.fake_metadata import FakeMetadata
from training import protocol

__all__ = ["KINDS", "GameDef", "Soak", "SoakSettings", "clean_workdir", "default_games", "run_soak"]


def command_argv(g: GameDef, trainer: str) -> list[str]:
    """A command game's `command`: the script itself, or behind `sh -c` with a sleeping child
    of its own (the shell waits for the script and exits with its status, not by `exec`)."""
    if not g.wrapped:
        return [PY, trainer, "--name", g.name]
    script = f'"$0" -c "import time; time.sleep(3600)" {g.child_mark} & "$0" "$@"'
    return ["sh", "-c", script, PY, trainer, "--name", g.name]


class Soak(Injector, Analyst):
    """One soak run: set-up, the supervisor processes, the schedule, the waits between faults.
    Injections come from `Injector`, judgement from `Analyst`, kinds from `soak_kinds.KINDS`."""

    def __init__(self, settings: SoakSettings) -> None:
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.dir = settings.workdir
        self.state = self.dir / "state"
        self.config = self.dir / "rlsup.toml"
        self.boot_file = self.dir / "boot_id"
        self.read_faults = self.dir / "read-faults"
        self.hook_program = self.dir / "hook.sh"
        self.hook_storm_flag = self.dir / "hook-storm"  # while it exists the hook misbehaves
        self.hook_runs = self.dir / "hook-runs"  # the pid of each misbehaving run
        self.hook_mark = uuid.uuid4().hex
        self.metrics_port = 0
        self.mirror = Mirror(self.dir / "weed")
        # A loopback GCE metadata service the supervisor polls all along: `preemption` posts a
        # notice on it (calm otherwise: no notice, no event).
        self.metadata: FakeMetadata | None = None
        self.boot_n = 1
        self.game_names = [g.name for g in settings.games]
        self.env = self._env()
        marks = {g.name: g.child_mark for g in settings.games if g.wrapped}
        self.monitor = Monitor(self.state, self.game_names, child_marks=marks)
        self.sup: subprocess.Popen[bytes] | None = None
        self.sups: list[tuple[subprocess.Popen[bytes], bool]] = []  # (proc, killed by us)
        self.stopped_pids: set[int] = set()  # SIGSTOPped by the schedule
        self.read_eio_count = 0
        self.faults: list[Fault] = []
        self.kinds: Mapping[str, FaultKind] = KINDS
        self.skipped: dict[str, str] = {}
        self.tmpfs: Path | None = None
        self.state_tmpfs: Path | None = None
        self.clock_offset_s = 0.0  # the wall clock as stepped by `clock_step`, to undo
        self.tmpfs_game = "cartpole_ppo"
        self.cgroups: list[Path] = []
        self.disk_full_until: float = 0.0
        self._disk_fault: Fault | None = None
        self._disk_timer: threading.Timer | None = None
        self._filler = None
        self._disk_lock = threading.Lock()
        self.corrupted: dict[str, set[int]] = {g: set() for g in self.game_names}
        self.t0 = time.monotonic()
        self.wall_s = 0.0
        self.final_rc: int | None = None

    # ---- setup ----
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO)
        env["RLSUP_BOOT_ID_PATH"] = str(self.boot_file)
        env["RLSUP_FAULT_READ_ERRORS"] = str(self.read_faults)  # checkpoints/_faults.py
        env["PYTHONWARNINGS"] = "ignore"
        env[HOOK_MARK_ENV] = self.hook_mark
        env.update(AWS_ENV)  # the mirror's (SeaweedFS takes any): never the host's profile
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "RLSUP_CONFIG"):
            env.pop(key, None)
        return env

    def write_config(self) -> None:
        s = self.s
        games = "".join(
            f'[[games]]\nname = "{g.name}"\nenv_id = "{g.env_id}"\nalgo = "{g.algo}"\n'
            f'total_steps = {g.total_steps}\nseed = 1\ndevice = "cpu"\nargs = {g.args}\n'
            for g in s.games
            if not g.command
        )
        trainer = str(REPO / "harness" / "chaos" / "soak_trainer.py")
        games += "".join(
            f'[[games]]\nname = "{g.name}"\n'
            f"command = {json.dumps(command_argv(g, trainer))}\n"
            f'heartbeat = true\nknobs = ["num_envs"]\ntotal_steps = {g.total_steps}\n'
            'seed = 1\ndevice = "cpu"\n'
            for g in s.games
            if g.command
        )
        modes = "".join(
            f"[modes.{name}]\nnum_envs = {n}\nbatch_size = 64\nn_steps = {N_STEPS}\n"
            f"max_concurrent = {len(s.games)}\n"
            for name, n in (("light", LIGHT_ENVS), ("medium", MEDIUM_ENVS))
        )
        self.config.write_text(
            f'state_dir = "state"\ninitial_mode = "medium"\n'
            f"checkpoint_every_s = {s.checkpoint_every_s}\nstop_grace_s = 20\ntick_s = 0.5\n"
            + modes
            + games
            + "[restart]\nbackoff_base_s = 0.5\nbackoff_max_s = 2\nbudget = 1000\n"
            "budget_window_s = 3600\nstable_after_s = 20\n"
            f"[watchdog]\nstartup_grace_s = 120\nhang_timeout_s = {s.hang_timeout_s}\n"
            "kill_grace_s = 5\n"
            # The pre-warmed spare serves restarts throughout (spare_* faults kill it).
            "[spare]\nenabled = true\n" + self._service_config()
        )

    def _service_config(self) -> str:
        """The endpoint `metrics_flood` floods, the hook `hook_storm` makes misbehave (it
        exits at once otherwise: every crash and restart of the run fires it), and the mirror
        `mirror_move` tries to move (every game is mirrored all along)."""
        pass_env = json.dumps([HOOK_MARK_ENV, "RLSUP_TEST_RUN"])  # the leftover checks' marks
        return (
            f'[metrics]\nlisten = "127.0.0.1:{self.metrics_port}"\n'
            f'[[hooks]]\non = ["worker_crash", "restart"]\ncommand = ["{self.hook_program}"]\n'
            f"timeout_s = {HOOK_TIMEOUT_S:g}\npass_env = {pass_env}\n"
            + self.mirror.config()
            + (
                f'[preemption]\nprovider = "gcp"\nendpoint = "{self.metadata.url}"\npoll_s = 0.5\n'
                if self.metadata is not None
                else ""
            )
        )

    def setup(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._mount_state_tmpfs()
        self.boot_file.write_text("soak-boot-1\n")
        self.read_faults.write_text("")
        write_hook(self.hook_program, self.hook_storm_flag, self.hook_runs)
        self.metrics_port = free_port()
        self.metadata = FakeMetadata("gcp")
        self._start_mirror()
        self.write_config()
        for g in self.game_names:
            (self.state / "runs" / g).mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.state, 0o700)
        self._mount_tmpfs()

    def _start_mirror(self) -> None:
        why = self.mirror.start()
        if why:
            self.skipped["mirror_move"] = why
            print(f"soak: mirror_move skipped: {why}", flush=True)
        else:
            print(f"soak: SeaweedFS answered in {self.mirror.start_s:.1f} s", flush=True)

    def _mount_state_tmpfs(self) -> None:
        """The whole state dir (SQLite, logs, heartbeats, progress, checkpoints) on its own
        filesystem, so that `state_disk_full` can fill it."""
        self.state.mkdir(mode=0o700, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=768M,mode=0700", "tmpfs", str(self.state)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            why = f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}"
            self.skipped["state_disk_full"] = why
            print(f"soak: state_disk_full skipped: {why}", flush=True)
            return
        self.state_tmpfs = self.state

    def _mount_tmpfs(self) -> None:
        target = self.state / "runs" / self.tmpfs_game / "checkpoints"
        target.mkdir(mode=0o700, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64M,mode=0700", "tmpfs", str(target)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            why = f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}"
            self.skipped["disk_full"] = why
            print(f"soak: disk_full skipped: {why}", flush=True)
            return
        self.tmpfs = target

    def cleanup(self) -> None:
        """Kill what is left, unmount, remove cgroups: always, whatever happened."""
        if self._disk_timer is not None:
            self._disk_timer.cancel()
        if self._filler is not None:
            self._filler.stop()
        for proc, _ in self.sups:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.wait(5)
        _, pids = self.monitor.worker_processes()
        for plist in pids.values():
            for pid in plist:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            self.hook_storm_flag.unlink()
        for pid in hook_processes(self.hook_mark):  # a storm cut short: its runs' processes
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.tmpfs is not None:
            for _ in range(10):
                if subprocess.run(["umount", str(self.tmpfs)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                subprocess.run(["umount", "-l", str(self.tmpfs)], capture_output=True)
            self.tmpfs = None
        self._step_clock(-self.clock_offset_s)
        self.mirror.stop()
        if self.metadata is not None:
            self.metadata.close()
            self.metadata = None
        with self._disk_lock:
            for name in (".soak-ballast", ".soak-ballast-tail"):
                with contextlib.suppress(OSError):
                    (self.state / name).unlink()

    def release_state(self) -> None:
        """Unmount the state tmpfs, after the checks have read it."""
        if self.state_tmpfs is not None:
            subprocess.run(["umount", "-l", str(self.state_tmpfs)], capture_output=True)
            self.state_tmpfs = None
        for cg in self.cgroups:
            with contextlib.suppress(OSError):
                cg.rmdir()

    # ---- supervisor processes ----
    def start_supervisor(self) -> None:
        log = open(self.dir / "supervisor.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [PY, "-m", "supervisor.cli", "run", "--config", str(self.config), "--exit-when-done"],
            env=self.env,
            cwd=REPO,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        limit_descriptors(proc.pid)  # a service's descriptor limit, whatever our shell's
        self.sup = proc
        self.sups.append((proc, False))

    def _mark_killed(self, proc: subprocess.Popen[bytes]) -> None:
        self.sups = [(p, k or p is proc) for p, k in self.sups]

    def rlsup(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "supervisor.cli", *args, "--config", str(self.config)],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # ---- schedule ----
    def schedule(self) -> list[str]:
        """Seeded: every kind at least once (KINDS' `opening`), shuffled, the `scale_light`
        pin early and `scale_auto` well later; then drawn by `filler` weight (plus
        `long_filler` on long runs) up to min_faults, or one per ~7 s of the fault phase."""
        kinds = [k for k, kind in self.kinds.items() for _ in range(kind.opening)]
        self.rng.shuffle(kinds)
        kinds.insert(self.rng.randint(1, 3), "scale_light")
        kinds.insert(self.rng.randint(6, len(kinds)), "scale_auto")
        per_fault_s = 7.0
        n = max(self.s.min_faults, int(self.s.fault_phase_s / per_fault_s))
        long = n > 40
        filler = [
            k
            for k, kind in self.kinds.items()
            for _ in range(kind.filler + (kind.long_filler if long else 0))
        ]
        while len(kinds) < n:
            kinds.append(self.rng.choice(filler))
        return kinds

    def run(self) -> None:
        t_start = time.monotonic()
        self.setup()
        try:
            self.start_supervisor()
            self.monitor.start()
            self.wait_all_healthy(240)
            plan = self.schedule()
            deadline = time.monotonic() + self.s.fault_phase_s
            print(
                f"soak: {len(plan)} faults planned over ~{self.s.fault_phase_s:.0f} s", flush=True
            )
            for i, kind in enumerate(plan):
                if time.monotonic() > deadline and self.injected() >= self.s.min_faults:
                    if "scale_auto" not in [f.kind for f in self.faults] and any(
                        f.kind == "scale_light" for f in self.faults
                    ):
                        kind = "scale_auto"
                    else:
                        break
                if self.all_done():
                    break
                fault = self.kinds[kind].inject(self)
                if fault is not None:
                    fault.n = i + 1
                    self.faults.append(fault)
                    print(
                        f"soak: [{i + 1:3d}] t={fault.t - t_start:6.1f}s {fault.kind:17s} "
                        f"{','.join(fault.games):30s} {fault.skipped or fault.note}",
                        flush=True,
                    )
                self.pace()
            self.restore_disk()
            if not any(f.kind == "scale_auto" for f in self.faults):
                self.faults.append(self.kinds["scale_auto"].inject(self))  # type: ignore[arg-type]
            self.finish()
            self.judge_mirror_unmoved()
        finally:
            self.wall_s = time.monotonic() - t_start
            self.monitor.stop()
            self.cleanup()

    def pace(self) -> None:
        time.sleep(self.rng.uniform(0.3, 1.2))

    def wait_disk(self) -> None:
        """Global faults wait for space to return and for the full game's next commit, and
        for any SIGSTOPped worker to be detected and replaced: a restart during a full disk or
        before a hang is seen are scenarios of their own (the redo bound and the worker_hang
        check would not hold), not what this fault measures."""
        while self.disk_full_until:
            time.sleep(0.2)
        deadline = time.monotonic() + 60
        while not self._disk_recovered() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.wait_all_healthy(60)

    def _disk_recovered(self) -> bool:
        """No disk fault, or the full game has committed a checkpoint since space returned."""
        fault = self._disk_fault
        if fault is None:
            return True
        if fault.t_end is None:
            return False  # still full
        if self._done(self.tmpfs_game):
            return True
        with self.monitor.lock:
            times = list(self.monitor.committed[self.tmpfs_game].values())
        return any(t > fault.t_end for t in times)

    def all_done(self) -> bool:
        return all(self._done(g) for g in self.game_names)

    def _done(self, game: str) -> bool:
        total = next(g.total_steps for g in self.s.games if g.name == game)
        steps = self.monitor.committed_steps(game)
        return bool(steps) and steps[-1] >= total

    def wait_all_healthy(self, timeout: float, games: list[str] | None = None) -> bool:
        deadline = time.monotonic() + timeout
        games = games or self.game_names
        while time.monotonic() < deadline:
            if all(self._done(g) or self._healthy_not_stopped(g) for g in games):
                return True
            time.sleep(0.3)
        return False

    def pick_game(
        self,
        need_ckpts: int = 0,
        avoid_tmpfs: bool = False,
        builtin: bool = False,
        command: bool = False,
    ) -> str | None:
        """A random game whose worker trains (waiting up to 60 s for one); `builtin`: one of
        rlsup's own workers (a fault about env_id or the worker's argv has no command game);
        `command`: the user's own script (a fault whose SDK path must be covered)."""
        commands = {g.name for g in self.s.games if g.command}
        # A wrapped game's script is not the process the supervisor started (its shell is):
        # the faults aimed at one worker judge the exit of the pid they killed.
        wrapped = {g.name for g in self.s.games if g.wrapped}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ok = [
                g
                for g in self.game_names
                if not (builtin and g in commands)
                and not (command and g not in commands)
                and g not in wrapped
                and not self._done(g)
                and self.monitor.healthy(g) is not None
                and len(self.monitor.committed_steps(g)) >= need_ckpts
                and not (self.disk_full_until and g == self.tmpfs_game)  # its checkpoints fail now
                and not (g == self.tmpfs_game and not self._disk_recovered())
                and self._owned(g)
                and not (avoid_tmpfs and g == self.tmpfs_game)
            ]
            if ok:
                return self.rng.choice(sorted(ok))
            time.sleep(0.3)
        return None

    def _healthy_not_stopped(self, game: str) -> bool:
        """Training, and not a worker we SIGSTOPped: the supervisor SIGCONTs a hung worker to
        stop it, and it trains for a moment while it does."""
        life = self.monitor.healthy(game)
        return life is not None and life.pid not in self.stopped_pids

    def _owned(self, game: str) -> bool:
        """Its worker is a child of the current supervisor and not one we stopped: a fault on a
        leftover from a killed supervisor, or on a worker about to be replaced as hung, would
        measure that replacement instead of the fault."""
        life = self.monitor.current(game)
        if life is None or self.sup is None or life.pid in self.stopped_pids:
            return False
        try:  # the process the supervisor started leads the session (a wrapper's script not)
            return bool(psutil.Process(os.getsid(life.pid)).ppid() == self.sup.pid)
        except (OSError, psutil.Error):
            return False

    # ---- the end ----
    def finish(self) -> None:
        """No more faults: the last supervisor must bring every game to total_steps and exit 0."""
        # A worker may still be stopped by a late SIGSTOP: the watchdog handles it.
        assert self.sup is not None
        # finish_timeout_s without any game's step moving (a stuck finish), not in all: the
        # schedule's sizing of total_steps cannot know how much training the faults cost (the
        # 60-minute run needed ~20 minutes to finish), and a finish that trains is no failure.
        deadline = time.monotonic() + self.s.finish_timeout_s
        hard_stop = time.monotonic() + 4 * self.s.finish_timeout_s + self.s.fault_phase_s
        last = self._steps()
        self.final_rc = None
        while time.monotonic() < min(deadline, hard_stop):
            try:
                self.final_rc = self.sup.wait(10)
                break
            except subprocess.TimeoutExpired:
                now = self._steps()
                if now != last:
                    last, deadline = now, time.monotonic() + self.s.finish_timeout_s
        time.sleep(0.5)
        self.monitor.sample()

    def _steps(self) -> dict[str, int]:
        out = {}
        for g in self.s.games:
            hb = protocol.read_json_file(self.state / "runs" / g.name / protocol.HEARTBEAT_FILE)
            out[g.name] = int((hb or {}).get("global_step") or 0)
        return out


def run_soak(settings: SoakSettings) -> tuple[Soak, list[str]]:
    """Run one soak; returns it and the invariant violations. Prints the table + JSON line."""
    soak = Soak(settings)
    try:
        soak.run()
    finally:
        try:
            if (soak.state / "rlsup.db").exists():
                violations = soak.check()
            else:
                violations = ["no state database was created"]
        finally:
            soak.release_state()
    print(soak.report(), flush=True)
    for v in violations:
        print(f"VIOLATION: {v}", flush=True)
    print(json.dumps(soak.figures(), sort_keys=True), flush=True)
    return soak, violations


def clean_workdir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
