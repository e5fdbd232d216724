"""Fault-injection soak engine: a real `rlsup run` under a seeded schedule of faults.

Shared by the CI test (tests/chaos/test_soak.py, a short schedule) and the long run
(benchmarks/soak.py, RLSUP_SOAK_MINUTES). Faults are injected from outside wherever possible:
SIGKILL (also mid-checkpoint), SIGSTOP, supervisor kill, a simulated host reboot, corrupt
checkpoints, a full filesystem (tmpfs), a kernel OOM kill (memory cgroup), mode pins.

A monitor thread samples every worker process, heartbeat and checkpoint directory; after the run
`Soak.check()` turns "nothing lost" (FIELD-NOTES.md) into assertions and `Soak.figures()` into a
table and one JSON line.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
LIGHT_ENVS, MEDIUM_ENVS, N_STEPS = 4, 8, 32


@dataclass(frozen=True)
class GameDef:
    name: str
    env_id: str
    algo: str
    total_steps: int
    args: str

    def iteration_steps(self, num_envs: int) -> int:
        """Agent steps of one training-loop iteration (the slack of the redone-work bound)."""
        if self.algo == "ppo":
            return num_envs * N_STEPS
        from training.dqn import AGENT_STEPS_PER_ITERATE

        return max(1, AGENT_STEPS_PER_ITERATE // num_envs) * num_envs


# Agent steps per second of fault phase each game gets: about half of what it trains at here
# (2 cores, three workers) so that it is still training when the schedule ends.
STEPS_PER_FAULT_S = {"cartpole_dqn": 1500, "cartpole_ppo": 2200, "pong": 170}


def default_games(fault_phase_s: float) -> list[GameDef]:
    """Three games whose total_steps last about the fault phase."""
    scale = fault_phase_s / 1.0
    return [
        GameDef(
            "cartpole_dqn",
            "CartPole-v1",
            "dqn",
            int(STEPS_PER_FAULT_S["cartpole_dqn"] * scale),
            "{ eval_episodes = 0, buffer_size = 20000, learning_starts = 1000, "
            "target_update_interval = 500, replay_chunk_kib = 16 }",
        ),
        GameDef(
            "cartpole_ppo",
            "CartPole-v1",
            "ppo",
            int(STEPS_PER_FAULT_S["cartpole_ppo"] * scale),
            "{ eval_episodes = 0 }",
        ),
        GameDef(
            "pong",
            "Pong-v5",
            "ppo",
            int(STEPS_PER_FAULT_S["pong"] * scale),
            "{ eval_episodes = 0, epochs = 1 }",
        ),
    ]


@dataclass
class SoakSettings:
    workdir: Path
    fault_phase_s: float = 170.0
    seed: int = 1
    min_faults: int = 20
    checkpoint_every_s: float = 1.5
    hang_timeout_s: float = 12.0
    finish_timeout_s: float = 240.0
    games: list[GameDef] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.games:
            self.games = default_games(self.fault_phase_s)


# ---- observations -------------------------------------------------------------------------


@dataclass
class WorkerLife:
    """One worker process as seen through its heartbeats."""

    game: str
    pid: int
    first_seen: float
    resumed_from_step: int | None = None
    quarantined: list[str] = field(default_factory=list)
    num_envs: int = 0
    first_step: int | None = None
    moving_at: float | None = None  # first heartbeat in phase training with a moved step
    max_step: int = 0
    last_seen: float = 0.0
    checkpoint_failures: int = 0
    steps: list[tuple[float, int]] = field(default_factory=list)
    replay_damage: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Fault:
    kind: str
    games: list[str]
    t: float
    victims: dict[str, int] = field(default_factory=dict)  # game -> pid
    note: str = ""
    corrupted: dict[str, int] = field(default_factory=dict)  # game -> step made corrupt
    expect_resume: dict[str, int] = field(default_factory=dict)
    t_end: float | None = None  # disk_full: when space returned
    damaged_file: str | None = None  # replay_rot*: the chunk file flipped
    event_ids: tuple[int, int] | None = None  # (last id before, last id after): the window
    auto_envs: dict[str, int] = field(default_factory=dict)  # scale_auto: the policy's sizes
    inflight_from: dict[str, int] = field(
        default_factory=dict
    )  # game -> step when killed mid-write
    skipped: str | None = None
    recovery_s: float | None = None
    redone_steps: int | None = None
    survived: bool = True
    problems: list[str] = field(default_factory=list)
    # crash_storm: the replacements killed right after their resume (not "the replacement")
    storm: dict[int, int] = field(default_factory=dict)  # pid -> signal
    t_storm_end: float | None = None


class Monitor(threading.Thread):
    """Samples processes, heartbeats and checkpoint dirs every `poll_s` seconds."""

    def __init__(self, state: Path, games: list[str], poll_s: float = 0.2) -> None:
        super().__init__(daemon=True, name="soak-monitor")
        self.state, self.games, self.poll_s = state, games, poll_s
        self.lock = threading.Lock()
        self.lives: dict[tuple[str, int], WorkerLife] = {}
        self.committed: dict[str, dict[int, float]] = {g: {} for g in games}  # step -> first seen
        self.corrupt_dirs: dict[str, set[str]] = {g: set() for g in games}
        self.present: dict[str, set[int]] = {g: set() for g in games}
        # (step, when it went) for committed checkpoints that disappeared (not quarantined)
        self.deleted: dict[str, list[tuple[int, float]]] = {g: [] for g in games}
        self.most_workers: dict[str, int] = dict.fromkeys(games, 0)
        self.duplicates: list[str] = []
        self.most_supervisors = 0
        self.samples = 0
        self._halt = threading.Event()

    def run_dir(self, game: str) -> Path:
        return self.state / "runs" / game

    def run(self) -> None:
        while not self._halt.wait(self.poll_s):
            try:
                self.sample()
            except Exception as exc:  # keep sampling; a racing file is not a soak failure
                print(f"soak monitor: {type(exc).__name__}: {exc}", file=sys.stderr)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def sample(self) -> None:
        now = time.monotonic()
        counts, pids = self.worker_processes()
        sups = len(self.supervisor_pids())
        with self.lock:
            self.samples += 1
            self.most_supervisors = max(self.most_supervisors, sups)
            for g in self.games:
                self.most_workers[g] = max(self.most_workers[g], counts.get(g, 0))
                if counts.get(g, 0) > 1:
                    self.duplicates.append(f"{g}: pids {pids[g]} at t={now:.1f}")
        for g in self.games:
            self._scan_checkpoints(g, now)
            self._read_heartbeat(g, now)

    def worker_processes(self) -> tuple[dict[str, int], dict[str, list[int]]]:
        run_dirs = {str(self.run_dir(g)): g for g in self.games}
        counts: dict[str, int] = {}
        pids: dict[str, list[int]] = {}
        for p in psutil.process_iter(["cmdline", "status"]):
            cmd = p.info["cmdline"] or []
            if "training.worker" not in cmd or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            for i, part in enumerate(cmd[:-1]):
                if part == "--run-dir" and cmd[i + 1] in run_dirs:
                    g = run_dirs[cmd[i + 1]]
                    counts[g] = counts.get(g, 0) + 1
                    pids.setdefault(g, []).append(p.pid)
        return counts, pids

    def supervisor_pids(self) -> list[int]:
        cfg = str(self.state.parent / "rlsup.toml")
        found: dict[int, int] = {}
        for p in psutil.process_iter(["cmdline", "status", "ppid"]):
            cmd = p.info["cmdline"] or []
            alive = p.info["status"] != psutil.STATUS_ZOMBIE
            if "supervisor.cli" in cmd and "run" in cmd and cfg in cmd and alive:
                found[p.pid] = p.info["ppid"]
        # A worker being spawned carries its supervisor's command line between fork and exec:
        # it is that supervisor's child, not a second supervisor.
        return [pid for pid, ppid in found.items() if ppid not in found]

    def _scan_checkpoints(self, game: str, now: float) -> None:
        root = self.run_dir(game) / "checkpoints"
        try:
            entries = list(os.scandir(root))
        except OSError:
            return
        present: set[int] = set()
        for e in entries:
            if e.name.startswith("ckpt-") and e.name[5:].isdigit():
                step = int(e.name[5:])
                if os.path.exists(os.path.join(e.path, "MANIFEST.json")):
                    present.add(step)
                    if step not in self.committed[game]:
                        with self.lock:
                            self.committed[game][step] = now
            elif e.name.startswith(".corrupt-"):
                with self.lock:
                    self.corrupt_dirs[game].add(e.name)
        with self.lock:
            quarantined = {int(n[14:26]) for n in self.corrupt_dirs[game] if n[14:26].isdigit()}
            for step in self.present[game] - present - quarantined:
                self.deleted[game].append((step, now))
            self.present[game] = present

    def _read_heartbeat(self, game: str, now: float) -> None:
        try:
            hb = json.loads((self.run_dir(game) / "heartbeat.json").read_text())
        except (OSError, ValueError):
            return
        pid = int(hb.get("pid", 0))
        with self.lock:
            life = self.lives.get((game, pid))
            if life is None:
                life = self.lives[(game, pid)] = WorkerLife(game, pid, now)
            life.last_seen = now
            step = int(hb.get("global_step") or 0)
            if hb.get("phase") in ("training", "checkpointing", "stopping"):
                if life.first_step is None and hb.get("phase") == "training":
                    life.first_step = step
                    life.resumed_from_step = hb.get("resumed_from_step")
                    life.num_envs = int(hb.get("num_envs") or 0)
                    life.quarantined = list(hb.get("quarantined") or [])
                if (
                    life.moving_at is None
                    and life.first_step is not None
                    and step > life.first_step
                    and hb.get("phase") == "training"
                ):
                    life.moving_at = now
            if life.resumed_from_step is None and hb.get("resumed_from_step") is not None:
                life.resumed_from_step = hb.get("resumed_from_step")
                life.quarantined = list(hb.get("quarantined") or [])
            life.max_step = max(life.max_step, step)
            life.checkpoint_failures = max(
                life.checkpoint_failures, int(hb.get("checkpoint_failures") or 0)
            )
            life.replay_damage = list(hb.get("replay_damage") or [])
            if not life.steps or life.steps[-1][1] != step:
                life.steps.append((now, step))

    # ---- queries (under the lock) ----
    def current(self, game: str) -> WorkerLife | None:
        """The newest life of `game` whose process still runs."""
        with self.lock:
            lives = sorted(
                (lf for lf in self.lives.values() if lf.game == game), key=lambda lf: lf.first_seen
            )
        for life in reversed(lives):
            if psutil.pid_exists(life.pid):
                with contextlib.suppress(psutil.Error):
                    if psutil.Process(life.pid).status() != psutil.STATUS_ZOMBIE:
                        return life
            return None
        return None

    def healthy(self, game: str) -> WorkerLife | None:
        """The current worker if it trains with a moving step (not stopped, step moved lately)."""
        life = self.current(game)
        if life is None or life.moving_at is None or not life.steps:
            return None
        with contextlib.suppress(psutil.Error):
            if psutil.Process(life.pid).status() == psutil.STATUS_STOPPED:
                return None
        if time.monotonic() - life.steps[-1][0] > 10:
            return None
        return life

    def committed_steps(self, game: str, before: float | None = None) -> list[int]:
        with self.lock:
            return sorted(
                s for s, t in self.committed[game].items() if before is None or t <= before
            )

    def lives_of(self, game: str) -> list[WorkerLife]:
        with self.lock:
            return sorted(
                (lf for lf in self.lives.values() if lf.game == game), key=lambda lf: lf.first_seen
            )


# ---- the soak -----------------------------------------------------------------------------


class Soak:
    def __init__(self, settings: SoakSettings) -> None:
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.dir = settings.workdir
        self.state = self.dir / "state"
        self.config = self.dir / "rlsup.toml"
        self.boot_file = self.dir / "boot_id"
        self.read_faults = self.dir / "read-faults"
        self.boot_n = 1
        self.game_names = [g.name for g in settings.games]
        self.env = self._env()
        self.monitor = Monitor(self.state, self.game_names)
        self.sup: subprocess.Popen[bytes] | None = None
        self.sups: list[tuple[subprocess.Popen[bytes], bool]] = []  # (proc, killed by us)
        self.stopped_pids: set[int] = set()  # SIGSTOPped by the schedule
        self.faults: list[Fault] = []
        self.skipped: dict[str, str] = {}
        self.tmpfs: Path | None = None
        self.state_tmpfs: Path | None = None
        self.clock_offset_s = 0.0  # the wall clock as stepped by `clock_step`, to undo
        self.tmpfs_game = "cartpole_ppo"
        self.cgroups: list[Path] = []
        self.disk_full_until: float = 0.0
        self._disk_fault: Fault | None = None
        self._disk_timer: threading.Timer | None = None
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
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "RLSUP_CONFIG"):
            env.pop(key, None)
        return env

    def write_config(self) -> None:
        s = self.s
        games = "".join(
            f'[[games]]\nname = "{g.name}"\nenv_id = "{g.env_id}"\nalgo = "{g.algo}"\n'
            f'total_steps = {g.total_steps}\nseed = 1\ndevice = "cpu"\nargs = {g.args}\n'
            for g in s.games
        )
        modes = "".join(
            f"[modes.{name}]\nnum_envs = {n}\nbatch_size = 64\nn_steps = {N_STEPS}\n"
            "max_concurrent = 3\n"
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
        )

    def setup(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._mount_state_tmpfs()
        self.boot_file.write_text("soak-boot-1\n")
        self.read_faults.write_text("")
        self.write_config()
        for g in self.game_names:
            (self.state / "runs" / g).mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.state, 0o700)
        self._mount_tmpfs()

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
        if self.tmpfs is not None:
            for _ in range(10):
                if subprocess.run(["umount", str(self.tmpfs)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                subprocess.run(["umount", "-l", str(self.tmpfs)], capture_output=True)
            self.tmpfs = None
        self._step_clock(-self.clock_offset_s)
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
        """Seeded: every kind at least once, then random kills up to min_faults (or the time)."""
        kinds = [
            "kill",
            "kill_staging",
            "sigstop",
            "supervisor_kill",
            "host_reboot",
            "corrupt_truncate",
            "corrupt_bitflip",
            "disk_full",
            "oom",
            "kill",
            "kill_staging",
            "replay_rot",
            "replay_rot_live",
            "read_eio",
            "crash_storm",
            "env_id_change",
            "state_disk_full",
            "db_locked",
            "clock_step",
        ]
        self.rng.shuffle(kinds)
        # the mode pin goes early, `auto` well later
        kinds.insert(self.rng.randint(1, 3), "scale_light")
        kinds.insert(self.rng.randint(6, len(kinds)), "scale_auto")
        per_fault_s = 7.0
        n = max(self.s.min_faults, int(self.s.fault_phase_s / per_fault_s))
        filler = ["kill", "kill", "kill_staging", "sigstop", "corrupt_truncate", "corrupt_bitflip"]
        filler += ["replay_rot", "replay_rot_live", "read_eio", "crash_storm"]
        if n > 40:  # long runs: the global faults recur too
            filler += ["supervisor_kill", "host_reboot", "oom", "disk_full"]
            filler += ["state_disk_full", "db_locked", "clock_step", "env_id_change"]
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
                if time.monotonic() > deadline and len(self.faults) >= self.s.min_faults:
                    if "scale_auto" not in [f.kind for f in self.faults] and any(
                        f.kind == "scale_light" for f in self.faults
                    ):
                        kind = "scale_auto"
                    else:
                        break
                if self.all_done():
                    break
                fault = self.inject(kind)
                if fault is not None:
                    self.faults.append(fault)
                    print(
                        f"soak: [{i + 1:3d}] t={fault.t - t_start:6.1f}s {fault.kind:17s} "
                        f"{','.join(fault.games):30s} {fault.skipped or fault.note}",
                        flush=True,
                    )
                self.pace()
            self.restore_disk()
            if not any(f.kind == "scale_auto" for f in self.faults):
                self.faults.append(self.inject("scale_auto"))  # type: ignore[arg-type]
            self.finish()
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

    def pick_game(self, need_ckpts: int = 0, avoid_tmpfs: bool = False) -> str | None:
        """A random game whose worker trains (waiting up to 60 s for one)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ok = [
                g
                for g in self.game_names
                if not self._done(g)
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
        try:
            return bool(psutil.Process(life.pid).ppid() == self.sup.pid)
        except psutil.Error:
            return False

    # ---- injections ----
    def inject(self, kind: str) -> Fault | None:
        handler = getattr(self, f"_f_{kind}")
        return handler()  # type: ignore[no-any-return]

    def _kill_worker(
        self, game: str, sig: int = signal.SIGKILL, fault: Fault | None = None
    ) -> int | None:
        life = self.monitor.current(game)
        if life is None:
            return None
        staging = self._staging(game)
        with contextlib.suppress(ProcessLookupError):
            os.kill(life.pid, sig)
        if fault is not None and staging and sig == signal.SIGKILL:
            fault.inflight_from[game] = life.max_step
        return life.pid

    def _staging(self, game: str) -> list[str]:
        try:
            root = self.monitor.run_dir(game) / "checkpoints"
            return [e.name for e in os.scandir(root) if e.name.startswith(".staging-")]
        except OSError:
            return []

    def _wait_gone(self, pid: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.Error:
                return
            time.sleep(0.02)

    def _f_kill(self) -> Fault | None:
        game = self.pick_game()
        if game is None:
            return None
        fault = Fault("kill", [game], time.monotonic())
        pid = self._kill_worker(game, fault=fault)
        if pid:
            fault.victims[game] = pid
        return fault

    def _f_kill_staging(self) -> Fault | None:
        """SIGKILL while the worker writes a checkpoint (a `.staging-*` dir exists)."""
        game = self.pick_game(need_ckpts=1, avoid_tmpfs=False)
        if game is None:
            return None
        life = self.monitor.current(game)
        if life is None:
            return None
        deadline = time.monotonic() + 4 * self.s.checkpoint_every_s + 10
        while time.monotonic() < deadline:
            staging = self._staging(game)
            if staging:
                t = time.monotonic()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(life.pid, signal.SIGKILL)
                fault = Fault("kill_staging", [game], t, {game: life.pid}, note=f"in {staging[0]}")
                fault.inflight_from[game] = life.max_step
                return fault
            time.sleep(0.002)
        fault = Fault("kill_staging", [game], time.monotonic(), note="no staging seen")
        pid = self._kill_worker(game, fault=fault)
        if pid:
            fault.victims[game] = pid
        return fault

    def _f_sigstop(self) -> Fault | None:
        game = self.pick_game()
        if game is None:
            return None
        t = time.monotonic()
        pid = self._kill_worker(game, signal.SIGSTOP)
        if pid:
            self.stopped_pids.add(pid)
        return Fault("sigstop", [game], t, {game: pid} if pid else {}, note="left stopped")

    def _f_corrupt_truncate(self) -> Fault | None:
        return self._corrupt("corrupt_truncate")

    def _f_corrupt_bitflip(self) -> Fault | None:
        return self._corrupt("corrupt_bitflip")

    def _corrupt(self, kind: str) -> Fault | None:
        """Kill the worker, then damage its newest checkpoint before the replacement loads it:
        the replacement must resume from the previous one and report the quarantine."""
        game = self.pick_game(need_ckpts=2)
        if game is None:
            return None
        t = time.monotonic()
        pid = self._kill_worker(game)
        if pid is None:
            return None
        self._wait_gone(pid)
        root = self.monitor.run_dir(game) / "checkpoints"
        steps = sorted(
            int(p.name[5:])
            for p in root.glob("ckpt-*")
            if p.name[5:].isdigit() and (p / "MANIFEST.json").exists()
        )
        fault = Fault(kind, [game], t, {game: pid})
        if len(steps) < 2:
            fault.note = "fewer than 2 checkpoints: plain kill"
            fault.kind = "kill"
            return fault
        newest = root / f"ckpt-{steps[-1]:012d}"
        target = newest / "learner.pt"
        size = target.stat().st_size
        if kind == "corrupt_truncate":
            os.truncate(target, size // 2)
            fault.note = f"{newest.name}/learner.pt {size} -> {size // 2} bytes"
        else:
            off = self.rng.randrange(size)
            with open(target, "r+b") as f:
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ (1 << self.rng.randrange(8))]))
            fault.note = f"{newest.name}/learner.pt bit flipped at byte {off}"
        fault.corrupted[game] = steps[-1]
        fault.expect_resume[game] = steps[-2]
        self.corrupted[game].add(steps[-1])
        return fault

    # ---- checkpoint faults real hosts produce (issue 9) ----
    DQN_GAME = "cartpole_dqn"

    def _newest(self, game: str) -> Path | None:
        root = self.monitor.run_dir(game) / "checkpoints"
        dirs = sorted(
            p
            for p in root.glob("ckpt-*")
            if p.name[5:].isdigit() and (p / "MANIFEST.json").exists()
        )
        return dirs[-1] if dirs else None

    def _shared_chunk(self, newest: Path, behind_cursor: bool) -> Path | None:
        """A replay chunk of `newest` hard-linked by other checkpoints too (nlink >= 2).
        behind_cursor: the most recently written such chunk (the live worker links it again at
        its next checkpoint); else the most widely shared one."""
        chunks = []
        for p in (newest / "replay").glob("frames-*.bin"):
            with contextlib.suppress(OSError):
                chunks.append((os.stat(p).st_nlink, int(p.stem.split("-")[1]), p))
        shared = [c for c in chunks if c[0] >= 2]
        if not shared:
            return None
        if not behind_cursor:
            return max(shared)[2]
        meta = json.loads((newest / "replay" / "meta.json").read_text())
        cursor = (int(meta["t"]) % int(meta["capacity"])) // int(meta["chunk_slots"])
        n = int(meta["num_chunks"])
        by_chunk = {c: p for _, c, p in shared}
        for back in range(1, n):
            c = (cursor - back) % n
            if c in by_chunk:
                return by_chunk[c]
        return None

    @staticmethod
    def _flip_bit(path: Path, rng: random.Random) -> str:
        size = path.stat().st_size
        off = rng.randrange(size)
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
        return f"{path.parent.parent.name}/replay/{path.name} bit flipped at byte {off}"

    def _f_replay_rot(self) -> Fault | None:
        """Kill the DQN worker, flip one bit in a replay chunk that several checkpoints share
        (one inode): the replacement must resume the newest learner exactly, drop only that
        chunk's transitions, report it, and quarantine nothing."""
        game = self.DQN_GAME

        def ready() -> bool:
            newest = self._newest(game)
            return (
                self._healthy_not_stopped(game)
                and self._owned(game)
                and newest is not None
                and self._shared_chunk(newest, behind_cursor=False) is not None
            )

        if self._done(game) or not self._wait_for(ready, 60):
            return None
        t = time.monotonic()
        pid = self._kill_worker(game)
        if pid is None:
            return None
        self._wait_gone(pid)
        fault = Fault("replay_rot", [game], t, {game: pid})
        newest = self._newest(game)
        chunk = self._shared_chunk(newest, behind_cursor=False) if newest else None
        if chunk is None:
            fault.kind, fault.note = "kill", "no shared replay chunk yet: plain kill"
            return fault
        fault.note = self._flip_bit(chunk, self.rng) + f" (nlink {os.stat(chunk).st_nlink})"
        fault.damaged_file = f"replay/{chunk.name}"
        return fault

    def _f_replay_rot_live(self) -> Fault | None:
        """Flip one bit in a shared replay chunk under the running DQN worker: its next
        checkpoint must find the base no longer matching, rewrite the chunk from memory, say
        so, and commit a checkpoint that verifies in full."""
        game = self.DQN_GAME
        if self._done(game):
            return None
        self._wait_for(lambda: self._healthy_not_stopped(game) and self._owned(game), 60)
        newest = self._newest(game)
        chunk = self._shared_chunk(newest, behind_cursor=True) if newest else None
        life = self.monitor.current(game)
        if chunk is None or newest is None or life is None:
            return None
        t = time.monotonic()
        fault = Fault("replay_rot_live", [game], t, note=self._flip_bit(chunk, self.rng))
        fault.damaged_file = f"replay/{chunk.name}"
        after = int(newest.name[5:])
        deadline = t + 4 * self.s.checkpoint_every_s + 20
        while time.monotonic() < deadline and not self._done(game):
            later = [s for s in self.monitor.committed_steps(game) if s > after]
            if later:
                self._verify_committed(game, later[0], fault)
                return fault
            time.sleep(0.1)
        if not self._done(game):
            fault.problems.append(f"{game}: no checkpoint committed after the bit flip")
        return fault

    def _verify_committed(self, game: str, step: int, fault: Fault) -> None:
        from checkpoints import CheckpointError, CheckpointRef, CheckpointStore

        path = self.monitor.run_dir(game) / "checkpoints" / f"ckpt-{step:012d}"
        try:
            CheckpointStore(path.parent).verify(CheckpointRef(path, step))
        except FileNotFoundError:
            return  # already retired by retention: nothing to check
        except CheckpointError as exc:
            fault.problems.append(f"{game}: ckpt-{step:012d}, committed after the flip: {exc}")

    def _f_read_eio(self) -> Fault | None:
        """Reads of one game's checkpoints fail with EIO for a while (the store's read seam),
        and its worker is killed: replacements must exit `checkpoint_unreadable` and back off,
        nothing may be quarantined, and once reads work the newest checkpoint is resumed."""
        game = self.pick_game(need_ckpts=1)
        if game is None:
            return None
        root = self.monitor.run_dir(game) / "checkpoints"
        t = time.monotonic()
        self.read_faults.write_text(f"EIO {root}/\n")
        pid = self._kill_worker(game)
        fault = Fault("read_eio", [game], t, {game: pid} if pid else {})
        # Until a replacement has run into it (and backed off), plus a little.
        seen = self._wait_for(lambda: self._event_since("checkpoint_unreadable", t), 60)
        time.sleep(1.0)
        self.read_faults.write_text("")
        eio_s = time.monotonic() - t
        fault.note = f"EIO on every read under {root}/ for {eio_s:.1f} s"
        if not seen:
            fault.note += " (no replacement read in that time)"
        return fault

    def _f_crash_storm(self) -> Fault | None:
        """Signals other than SIGKILL, from outside, right after each of three resumes: none
        of it is evidence against the checkpoint, which must stay and be resumed."""
        game = self.pick_game(need_ckpts=1)
        if game is None:
            return None
        sigs = [signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL]
        life = self.monitor.current(game)
        if life is None:
            return None
        t = time.monotonic()
        fault = Fault("crash_storm", [game], t, {game: life.pid})
        sig = self.rng.choice(sigs)
        with contextlib.suppress(ProcessLookupError):
            os.kill(life.pid, sig)
        fault.storm[life.pid] = sig
        for _ in range(2):
            self._wait_gone(life.pid)
            nxt = self._wait_for(lambda: self._resumed_after(game, fault), 60)
            if nxt is None:
                break
            sig = self.rng.choice(sigs)
            with contextlib.suppress(ProcessLookupError):
                os.kill(nxt.pid, sig)
            fault.storm[nxt.pid] = sig
            life = nxt
        self._wait_gone(life.pid)
        fault.t_storm_end = time.monotonic()
        fault.note = "signals " + ", ".join(signal.Signals(s).name for s in fault.storm.values())
        return fault

    def _resumed_after(self, game: str, fault: Fault) -> WorkerLife | None:
        life = self.monitor.current(game)
        if life is None or life.pid in fault.storm or life.first_step is None:
            return None
        return life

    def _f_env_id_change(self) -> Fault | None:
        """The operator changes a running game's env_id and reloads: the reload must be refused
        naming both values, the worker left alone; reverting and reloading is accepted."""
        game = self.pick_game(need_ckpts=1)
        if game is None or self.sup is None:
            return None
        gdef = next(g for g in self.s.games if g.name == game)
        other = "Acrobot-v1" if gdef.env_id != "Acrobot-v1" else "CartPole-v1"
        life = self.monitor.current(game)
        original = self.config.read_text()
        marker = f'name = "{game}"\nenv_id = "{gdef.env_id}"'
        t = time.monotonic()
        fault = Fault("env_id_change", [game], t, note=f"{gdef.env_id} -> {other}, then back")
        self.config.write_text(original.replace(marker, f'name = "{game}"\nenv_id = "{other}"'))
        os.kill(self.sup.pid, signal.SIGHUP)
        refused = self._wait_for(lambda: self._event_since("config_error", t), 30)
        self.config.write_text(original)
        t_back = time.monotonic()
        os.kill(self.sup.pid, signal.SIGHUP)
        reloaded = self._wait_for(lambda: self._event_since("config_reload", t_back), 30)
        if refused is None:
            fault.problems.append("no config_error event for the changed env_id")
        elif not (gdef.env_id in refused and other in refused):
            fault.problems.append(f"the refusal does not name both env ids: {refused[:300]}")
        if reloaded is None:
            fault.problems.append("the reverted config was not reloaded")
        now = self.monitor.current(game)
        if life is not None and (now is None or now.pid != life.pid):
            fault.problems.append(f"{game}: its worker was restarted by a refused reload")
        return fault

    def _event_since(self, kind: str, t_mono: float) -> str | None:
        since = time.time() - (time.monotonic() - t_mono) - 1.0
        with contextlib.suppress(sqlite3.Error):
            conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
            try:
                row = conn.execute(
                    "SELECT detail FROM events WHERE kind = ? AND ts >= ? ORDER BY id DESC",
                    (kind, since),
                ).fetchone()
            finally:
                conn.close()
            return str(row[0]) if row else None
        return None

    @staticmethod
    def _wait_for(pred: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = pred()
            if got:
                return got
            time.sleep(0.1)
        return None

    # ---- the supervisor's own host faults (issue 10) ----
    def _f_state_disk_full(self) -> Fault | None:
        """The whole state dir fills up (SQLite, logs, heartbeats, progress, checkpoints) for a
        while: the supervisor stays, no worker exits or is taken for hung, training goes on,
        and once space returns the outage's events are written and checkpoints commit again."""
        if self.state_tmpfs is None:
            why = self.skipped.get("state_disk_full", "no state tmpfs")
            return Fault("state_disk_full", [], time.monotonic(), skipped=why)
        self.wait_disk()
        self.wait_all_healthy(40)
        games = [g for g in self.game_names if not self._done(g)]
        lives = {g: lf for g in games if (lf := self.monitor.current(g)) is not None}
        if any(lf.max_step > 0.8 * self._total(g) for g, lf in lives.items()):
            return None  # a game would finish (its final checkpoint fails): not this fault
        assert self.sup is not None
        sup_pid = self.sup.pid
        steps = {g: lf.max_step for g, lf in lives.items()}
        first_id = self._last_event_id()
        t = time.monotonic()
        with self._disk_lock:
            self._fill(self.state)
        full_s = 10.0
        time.sleep(full_s)
        fault = Fault("state_disk_full", list(lives), t, note=f"state dir full for {full_s:g} s")
        for g, life in lives.items():
            now = self.monitor.current(g)
            if now is None or now.pid != life.pid:
                fault.problems.append(f"{g}: worker {life.pid} did not survive the full disk")
            elif now.max_step <= steps[g]:
                fault.problems.append(f"{g}: training did not go on while the state dir was full")
        with self._disk_lock:
            for name in (".soak-ballast", ".soak-ballast-tail"):
                with contextlib.suppress(OSError):
                    (self.state / name).unlink()
        fault.t_end = time.monotonic()
        if self.sup.poll() is not None or self.sup.pid != sup_pid:
            fault.problems.append(f"the supervisor exited ({self.sup.poll()}) on a full state dir")
        if not self._wait_for(lambda: self._event_since("state_db_unavailable", t), 60):
            fault.problems.append("no state_db_unavailable event after space returned")
        for g in lives:
            committed = self._wait_for(lambda g=g: self._committed_since(g, fault.t_end), 60)
            if not committed and not self._done(g):
                fault.problems.append(f"{g}: no checkpoint committed after space returned")
        fault.event_ids = (first_id, self._last_event_id())
        return fault

    def _fill(self, directory: Path) -> None:
        with contextlib.suppress(OSError), open(directory / ".soak-ballast", "wb") as f:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        with contextlib.suppress(OSError), open(directory / ".soak-ballast-tail", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()

    def _total(self, game: str) -> int:
        return next(g.total_steps for g in self.s.games if g.name == game)

    def _committed_since(self, game: str, t: float) -> bool:
        with self.monitor.lock:
            return any(at > t for at in self.monitor.committed[game].values())

    def _f_db_locked(self) -> Fault | None:
        """Another process holds the state database's write lock for a while (an operator's
        sqlite3 shell): the supervisor supervises from memory and writes everything after."""
        self.wait_all_healthy(40)
        assert self.sup is not None
        first_id = self._last_event_id()
        t = time.monotonic()
        locker = sqlite3.connect(self.state / "rlsup.db", isolation_level=None, timeout=30)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            time.sleep(6.0)
        finally:
            with contextlib.suppress(sqlite3.Error):
                locker.execute("COMMIT")
            locker.close()
        fault = Fault("db_locked", [], t, note="BEGIN EXCLUSIVE held for 6 s")
        if self.sup.poll() is not None:
            fault.problems.append(f"the supervisor exited ({self.sup.poll()}) on a locked db")
        if not self._wait_for(lambda: self._event_since("state_db_unavailable", t), 30):
            fault.problems.append("no state_db_unavailable event after the lock was released")
        fault.event_ids = (first_id, self._last_event_id())
        return fault

    def _step_clock(self, delta_s: float) -> bool:
        if not delta_s:
            return True
        try:
            now = time.clock_gettime(time.CLOCK_REALTIME)
            time.clock_settime(time.CLOCK_REALTIME, now + delta_s)
        except OSError as exc:
            self.skipped["clock_step"] = f"cannot step the wall clock: {exc}"
            return False
        self.clock_offset_s += delta_s
        return True

    def _f_clock_step(self) -> Fault | None:
        """The wall clock jumps five minutes ahead while the supervisor is down and its workers
        are frozen: the new supervisor must still recognise them (pid + start ticks, not wall
        clock create times) and stop them before it starts others; then the clock jumps back."""
        self.wait_disk()
        self.wait_all_healthy(40)
        assert self.sup is not None
        victims = {g: lf.pid for g in self.game_names if (lf := self.monitor.current(g))}
        first_id = self._last_event_id()
        t = time.monotonic()
        for pid in victims.values():  # frozen: they cannot notice their parent die and leave
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            self.stopped_pids.add(pid)
        os.kill(self.sup.pid, signal.SIGKILL)
        self._mark_killed(self.sup)
        self.sup.wait(10)
        if not self._step_clock(300.0):
            for pid in victims.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            self.start_supervisor()
            return Fault("clock_step", [], t, skipped=self.skipped["clock_step"])
        self.start_supervisor()
        self.wait_all_healthy(60)
        self._step_clock(-300.0)
        fault = Fault("clock_step", list(victims), t, victims, note="+300 s, then back")
        fault.event_ids = (first_id, self._last_event_id())
        return fault

    def _last_event_id(self) -> int:
        with contextlib.suppress(sqlite3.Error):
            conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
            try:
                return int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])
            finally:
                conn.close()
        return 0

    def _f_supervisor_kill(self) -> Fault | None:
        self.wait_disk()
        self.wait_all_healthy(40)
        assert self.sup is not None
        victims = {g: lf.pid for g in self.game_names if (lf := self.monitor.current(g))}
        t = time.monotonic()
        os.kill(self.sup.pid, signal.SIGKILL)
        self._mark_killed(self.sup)
        self.sup.wait(10)
        self.start_supervisor()
        return Fault("supervisor_kill", list(victims), t, victims, note="workers left running")

    def _f_host_reboot(self) -> Fault | None:
        self.wait_disk()
        self.wait_all_healthy(40)
        assert self.sup is not None
        victims = {g: lf.pid for g in self.game_names if (lf := self.monitor.current(g))}
        t = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sup.pid, signal.SIGKILL)
        _, pids = self.monitor.worker_processes()
        for plist in pids.values():
            for pid in plist:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._mark_killed(self.sup)
        self.sup.wait(10)
        for pid in [p for plist in pids.values() for p in plist]:
            self._wait_gone(pid)
        self.boot_n += 1
        self.boot_file.write_text(f"soak-boot-{self.boot_n}\n")
        self.start_supervisor()
        return Fault(
            "host_reboot", list(victims), t, victims, note=f"boot id soak-boot-{self.boot_n}"
        )

    def _f_scale_light(self) -> Fault | None:
        return self._scale("light")

    def _f_scale_auto(self) -> Fault | None:
        return self._scale("auto")

    def _scale(self, mode: str) -> Fault:
        self.wait_disk()
        self.wait_all_healthy(40)
        victims = {g: lf.pid for g in self.game_names if (lf := self.monitor.current(g))}
        t = time.monotonic()
        done = self.rlsup("scale", "--mode", mode)
        fault = Fault(f"scale_{mode}", list(victims), t, victims, note=done.stdout.strip())
        if mode == "auto":  # back to the policy's modes, which incidents may have lowered
            # One policy step (every 5 s) acts on what happened during the pin; its cooldown
            # (300 s) then keeps the modes still while the workers restart.
            time.sleep(6.0)
            fault.auto_envs = self._auto_envs()
            for g, envs in fault.auto_envs.items():
                if envs == LIGHT_ENVS:  # the same sizes as the pin: no restart is due
                    fault.victims.pop(g, None)
        for pid in fault.victims.values():  # the mode change restarts them: let it land
            self._wait_gone(pid, 60)
        self.wait_all_healthy(60)
        if done.returncode != 0:
            fault.problems.append(
                f"rlsup scale --mode {mode}: exit {done.returncode}: {done.stderr}"
            )
        return fault

    def _auto_envs(self) -> dict[str, int]:
        """num_envs of each game's automatic mode: the lighter of its own and the host's."""
        envs = {"light": LIGHT_ENVS, "medium": MEDIUM_ENVS}
        conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
        try:
            rows = dict(conn.execute("SELECT scope, mode FROM modes").fetchall())
        finally:
            conn.close()
        host = envs.get(rows.get("*", "medium"), MEDIUM_ENVS)
        return {g: min(host, envs.get(rows.get(g, "medium"), MEDIUM_ENVS)) for g in self.game_names}

    def _f_disk_full(self) -> Fault | None:
        if self.tmpfs is None:
            return Fault(
                "disk_full",
                [self.tmpfs_game],
                time.monotonic(),
                skipped=self.skipped.get("disk_full"),
            )
        game = self.tmpfs_game
        deadline = time.monotonic() + 60
        # Fill the disk under a worker that trains for the current supervisor: not a leftover
        # of a killed supervisor, not one SIGSTOPped and about to be replaced.
        while time.monotonic() < deadline and not (
            self._healthy_not_stopped(game) and self._owned(game)
        ):
            time.sleep(0.3)
        life = self.monitor.current(game)
        if life is None or self._done(game):
            return None
        t = time.monotonic()
        ballast = self.tmpfs / ".soak-ballast"
        with contextlib.suppress(OSError), open(ballast, "wb") as f:
            chunk = b"\0" * (1 << 20)
            while True:
                f.write(chunk)
                f.flush()
        st = os.statvfs(self.tmpfs)
        fault = Fault(
            "disk_full",
            [game],
            t,
            {game: life.pid},
            note=f"tmpfs full ({st.f_bavail * st.f_frsize} bytes free)",
        )
        full_s = max(8.0, 5 * self.s.checkpoint_every_s)
        self.disk_full_until = t + full_s
        self._disk_fault = fault
        self._disk_timer = threading.Timer(full_s, self.restore_disk)
        self._disk_timer.daemon = True
        self._disk_timer.start()
        return fault

    def restore_disk(self) -> None:
        """Space returns: grow the tmpfs (then drop the ballast)."""
        with self._disk_lock:
            if not self.disk_full_until or self.tmpfs is None:
                return
            subprocess.run(["mount", "-o", "remount,size=128M", str(self.tmpfs)], check=False)
            if self._disk_fault is not None:
                self._disk_fault.t_end = time.monotonic()
            with contextlib.suppress(OSError):
                (self.tmpfs / ".soak-ballast").unlink()
            self.disk_full_until = 0.0

    def _f_oom(self) -> Fault | None:
        """Move a worker into a small memory cgroup (v2, else v1): the kernel OOM-kills it."""
        game = self.pick_game()
        if game is None:
            return None
        life = self.monitor.current(game)
        if life is None:
            return None
        cg, why = self._make_memcg()
        if cg is None:
            self.skipped["oom"] = why
            return Fault("oom", [game], time.monotonic(), skipped=why)
        t = time.monotonic()
        try:
            (cg / "cgroup.procs").write_text(f"{life.pid}\n")
        except OSError as exc:
            why = f"cannot move pid {life.pid} into {cg}: {exc}"
            self.skipped["oom"] = why
            return Fault("oom", [game], t, skipped=why)
        fault = Fault("oom", [game], t, {game: life.pid}, note=f"memory cgroup {cg}")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and psutil.pid_exists(life.pid):
            with contextlib.suppress(psutil.Error):
                if psutil.Process(life.pid).status() == psutil.STATUS_ZOMBIE:
                    break
            time.sleep(0.05)
        kills = self._oom_kills(cg)
        if psutil.pid_exists(life.pid) and not kills:
            # not killed: give it back its memory and record the skip honestly
            with contextlib.suppress(OSError):
                (cg.parent / "cgroup.procs").write_text(f"{life.pid}\n")
            fault.skipped = "the kernel did not OOM-kill the worker within 20 s"
        else:
            fault.note += f" (oom_kill count {kills})"
        return fault

    def _make_memcg(self) -> tuple[Path | None, str]:
        name = f"rlsup-soak-oom-{os.getpid()}-{len(self.cgroups)}"
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if v2.exists() and "memory" in v2.read_text():
            cg = Path("/sys/fs/cgroup") / name
            limit_file, limit = "memory.max", "8M"
        elif Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists():
            cg = Path("/sys/fs/cgroup/memory") / name
            limit_file, limit = "memory.limit_in_bytes", str(8 << 20)
        else:
            return None, "no memory cgroup controller (neither cgroup v2 memory nor v1)"
        try:
            cg.mkdir()
            self.cgroups.append(cg)
            (cg / limit_file).write_text(limit)
            if limit_file == "memory.limit_in_bytes":
                with contextlib.suppress(OSError):
                    (cg / "memory.memsw.limit_in_bytes").write_text(limit)
        except OSError as exc:
            return None, f"cannot create a memory cgroup at {cg}: {exc}"
        return cg, ""

    @staticmethod
    def _oom_kills(cg: Path) -> int:
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError):
                for line in (cg / name).read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        return int(v)
        return 0

    # ---- the end ----
    def finish(self) -> None:
        """No more faults: the last supervisor must bring every game to total_steps and exit 0."""
        # A worker may still be stopped by a late SIGSTOP: the watchdog handles it.
        assert self.sup is not None
        try:
            self.final_rc = self.sup.wait(self.s.finish_timeout_s)
        except subprocess.TimeoutExpired:
            self.final_rc = None
        time.sleep(0.5)
        self.monitor.sample()

    # ---- analysis ----
    def events(self) -> list[dict[str, Any]]:
        conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute("SELECT * FROM events ORDER BY id").fetchall()
        finally:
            conn.close()
        return [dict(r) | {"detail": json.loads(r["detail"] or "{}")} for r in rows]

    def analyse(self) -> None:
        events = self.events()
        mono_to_wall = time.time() - time.monotonic()
        for f in self.faults:
            if f.skipped:
                f.survived = False
                continue
            wall_t = f.t + mono_to_wall - 2.0  # events are wall-clock; allow clock slop
            self._analyse_workers(f)
            self._analyse_events(f, events, wall_t)
            f.survived = not f.problems

    def _replacement(self, game: str, f: Fault) -> WorkerLife | None:
        victim = f.victims.get(game)
        for life in self.monitor.lives_of(game):
            if (
                life.first_seen > f.t
                and life.pid != victim
                and life.pid not in f.storm  # killed right after its resume by the storm
                and life.first_step is not None
            ):
                return life
        return None

    def _interval_steps(self, game: str, victim: WorkerLife | None, t_fault: float = 0.0) -> int:
        """One checkpoint interval in steps, as the victim trained: the largest gap between its
        consecutive commits, or what it trained in the last interval before the fault (plus
        the heartbeat's one-second granularity) when its rate was higher then."""
        if victim is None:
            return 0
        recent = 0
        since = t_fault - self.s.checkpoint_every_s - 1.0
        before = [st for t, st in victim.steps if t <= since]
        if before:
            recent = victim.max_step - before[-1]
        steps = [
            s
            for s in self.monitor.committed_steps(game)
            if victim.first_step is not None and s > victim.first_step and s <= victim.max_step
        ]
        gaps = [b - a for a, b in itertools.pairwise(steps)]
        if gaps:
            return max(*gaps, recent)
        # fewer than two commits: what it trained in one interval
        pts = victim.steps
        if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
            sps = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
            return max(recent, int(sps * self.s.checkpoint_every_s * 2))
        return recent

    def _analyse_workers(self, f: Fault) -> None:
        recoveries: list[float] = []
        redone_total = 0
        if f.kind == "disk_full":
            self._analyse_disk(f)
            return
        for game, vpid in f.victims.items():
            gdef = next(g for g in self.s.games if g.name == game)
            victim = self.monitor.lives.get((game, vpid))
            rep = self._replacement(game, f)
            if rep is None:
                if self._done(game) and victim is not None and victim.max_step >= gdef.total_steps:
                    continue
                f.problems.append(f"{game}: no replacement worker ever trained after {f.kind}")
                continue
            if f.damaged_file is not None and not any(
                d.get("when") == "load" and f.damaged_file in (d.get("files") or [])
                for d in rep.replay_damage
            ):
                f.problems.append(
                    f"{game}: heartbeat replay_damage={rep.replay_damage} does not report "
                    f"{f.damaged_file} dropped at load"
                )
            if rep.moving_at is not None:
                recoveries.append(rep.moving_at - (f.t_storm_end or f.t))
            elif not (rep.first_step is not None and rep.first_step >= gdef.total_steps):
                f.problems.append(f"{game}: replacement pid {rep.pid} never moved global_step")
            resumed = rep.resumed_from_step
            before = self.monitor.committed_steps(game, before=rep.first_seen)
            valid_before = [s for s in before if s not in self.corrupted[game]]
            committed = valid_before[-1] if valid_before else None
            if game in f.expect_resume:
                want = f.expect_resume[game]
                if resumed != want:
                    f.problems.append(
                        f"{game}: after corrupting ckpt {f.corrupted[game]} the worker resumed "
                        f"from {resumed}, expected the previous checkpoint {want}"
                    )
                if not any(f"ckpt-{f.corrupted[game]:012d}" in q for q in rep.quarantined):
                    f.problems.append(
                        f"{game}: heartbeat quarantined={rep.quarantined} does not report "
                        f"ckpt-{f.corrupted[game]:012d}"
                    )
                if not any(
                    n.startswith(f".corrupt-ckpt-{f.corrupted[game]:012d}")
                    for n in self.monitor.corrupt_dirs[game]
                ):
                    f.problems.append(f"{game}: no .corrupt-ckpt-{f.corrupted[game]:012d}* dir")
            elif committed is not None and (resumed is None or resumed < committed):
                f.problems.append(
                    f"{game}: resumed from {resumed} but checkpoint {committed} was committed "
                    f"before the fault"
                )
            if resumed is not None and resumed not in self.monitor.committed_steps(game):
                f.problems.append(f"{game}: resumed from step {resumed}, never a committed ckpt")
            if victim is not None and resumed is not None:
                redone = max(0, victim.max_step - resumed)
                redone_total += redone
                interval = self._interval_steps(game, victim, f.t)
                iteration = gdef.iteration_steps(max(victim.num_envs, 1))
                allowed = interval + iteration
                why = f"one checkpoint interval ({interval}) + one iteration ({iteration})"
                if game in f.expect_resume:  # the corrupt one is lost too
                    lost = f.corrupted[game] - f.expect_resume[game]
                    allowed += lost
                    why += f" + the corrupted checkpoint's interval ({lost})"
                if game in f.inflight_from:  # killed mid-write: the steps since its capture
                    inflight = max(0, victim.max_step - f.inflight_from[game]) + iteration
                    allowed += inflight
                    why += f" + trained during the interrupted write (<= {inflight})"
                if interval and redone > allowed:
                    f.problems.append(f"{game}: redid {redone} steps after {f.kind}; allowed {why}")
            if f.kind == "scale_light" and rep.num_envs != LIGHT_ENVS:
                f.problems.append(f"{game}: num_envs {rep.num_envs} after scale light")
            if f.kind == "scale_auto" and rep.num_envs != f.auto_envs.get(game, MEDIUM_ENVS):
                f.problems.append(
                    f"{game}: num_envs {rep.num_envs} after scale auto, want the policy's "
                    f"{f.auto_envs.get(game, MEDIUM_ENVS)}"
                )
        f.recovery_s = max(recoveries) if recoveries else None
        f.redone_steps = redone_total

    def _analyse_disk(self, f: Fault) -> None:
        game = f.games[0]
        life = self.monitor.lives.get((game, f.victims[game]))
        end = f.t_end or f.t
        if life is None:
            f.problems.append(f"{game}: no worker during disk_full")
            return
        in_window = [s for s, t in self.monitor.committed[game].items() if f.t + 0.5 < t <= end]
        if in_window:
            f.problems.append(f"{game}: checkpoints {in_window} committed on a full disk?")
        if life.checkpoint_failures < 1:
            f.problems.append(f"{game}: heartbeat checkpoint_failures stayed 0 on a full disk")
        moved = [s for t, s in life.steps if f.t <= t <= end]
        total = next(g.total_steps for g in self.s.games if g.name == game)
        if len(moved) < 2 and life.max_step < total:  # a game that finished has nothing to do
            f.problems.append(f"{game}: training did not go on while the disk was full")
        after = sorted(t for s, t in self.monitor.committed[game].items() if t > end)
        if after:
            f.recovery_s = after[0] - end
        elif not self._done(game):
            f.problems.append(f"{game}: no checkpoint committed after space returned")
        f.redone_steps = 0

    def _analyse_events(self, f: Fault, events: list[dict[str, Any]], since: float) -> None:
        def has(kind: str | tuple[str, ...], game: str | None, pred: Any = None) -> bool:
            kinds = (kind,) if isinstance(kind, str) else kind
            return any(
                e["kind"] in kinds
                and e["ts"] >= since
                and (game is None or e["game"] == game)
                and (pred is None or pred(e))
                for e in events
            )

        def during(kinds: tuple[str, ...]) -> list[str]:
            """Events of these kinds written while the fault lasted (by id: a clock step
            makes their times useless for this)."""
            lo, hi = f.event_ids or (0, 0)
            return [f"{e['kind']} {e['game']}" for e in events if lo < e["id"] <= hi
                    and e["kind"] in kinds]  # fmt: skip

        g = f.games[0] if f.games else None
        want: list[tuple[str, bool]] = []

        def crash_of_victim(kinds: tuple[str, ...]) -> bool:
            """The victim's worker_exit (by pid) with SIGKILL, then its crash event."""
            vpid = f.victims.get(g or "")
            exits = [
                e for e in events if e["kind"] == "worker_exit" and e["detail"].get("pid") == vpid
            ]
            if not exits:  # a leftover of a killed supervisor: its successor stopped it
                return any(
                    vpid in (e["detail"].get("leftover_workers_stopped") or [])
                    for e in events
                    if e["kind"] == "supervisor_start"
                )
            ex = exits[0]
            mode_change = ex["detail"].get("returncode") == 75 and any(
                e["kind"] in ("scale_down", "scale_up") and abs(e["ts"] - ex["ts"]) < 15
                for e in events
            )
            if mode_change:
                # The policy restarted it at another mode (exit 75, checkpointed) just as the
                # fault struck: an overlap the schedule cannot avoid, recorded, not a failure.
                f.note += " (overlapped by a policy mode change: the victim exited 75)"
                return True
            if ex["detail"].get("returncode") != -9:
                f.problems.append(f"victim pid {vpid} exited {ex['detail'].get('returncode')}")
            if ex["detail"].get("from") == "stopping":
                return True  # already being stopped (hang, mode change): the exit records it
            return any(
                e["kind"] in kinds and e["game"] == g and ex["id"] < e["id"] <= ex["id"] + 3
                for e in events
            )

        def when_is(when: str) -> Any:
            return lambda e: (
                e["detail"].get("when") == when
                and f.damaged_file in (e["detail"].get("files") or [])
            )

        def storm_crashes() -> bool:
            for pid, sig in f.storm.items():
                exits = [
                    e
                    for e in events
                    if e["kind"] == "worker_exit" and e["detail"].get("pid") == pid
                ]
                if not exits or exits[0]["detail"].get("returncode") != -sig:
                    f.problems.append(f"storm victim pid {pid}: exit {exits[:1]} (want -{sig})")
                    return False
                if not any(
                    e["kind"] == "worker_crash" and exits[0]["id"] < e["id"] <= exits[0]["id"] + 3
                    for e in events
                ):
                    return False
            return True

        if f.kind in ("kill", "kill_staging"):
            want.append(("worker_crash (of the victim pid)", crash_of_victim(("worker_crash",))))
        elif f.kind == "replay_rot":
            want.append(("worker_crash (of the victim pid)", crash_of_victim(("worker_crash",))))
            want.append(("replay_damaged(when=load)", has("replay_damaged", g, when_is("load"))))
        elif f.kind == "replay_rot_live":
            want.append(
                ("replay_damaged(when=checkpoint)", has("replay_damaged", g, when_is("checkpoint")))
            )
        elif f.kind == "read_eio":
            want.append(("worker_crash (of the victim pid)", crash_of_victim(("worker_crash",))))
            want.append(("checkpoint_unreadable", has("checkpoint_unreadable", g)))
        elif f.kind == "crash_storm":
            want.append(("worker_exit + worker_crash for every storm signal", storm_crashes()))
        elif f.kind in ("state_disk_full", "db_locked"):
            want.append(("state_db_unavailable", has("state_db_unavailable", None)))
            if f.kind == "state_disk_full":
                want.append(("write_failed", has("write_failed", None)))
            if bad := during(("worker_hang", "worker_crash", "worker_oom")):
                f.problems.append(f"during the fault: {bad}")
        elif f.kind == "clock_step":
            stopped = set(f.victims.values())

            def found_them(e: dict[str, Any]) -> bool:
                listed = set(e["detail"].get("leftover_workers_stopped") or [])
                return e["detail"].get("after") == "supervisor_crash" and stopped <= listed

            want.append(("supervisor_start stopping every frozen leftover", has(
                "supervisor_start", None, found_them)))  # fmt: skip
            if bad := during(("host_reboot", "worker_hang")):
                f.problems.append(f"a clock step was taken for a reboot or a hang: {bad}")
        elif f.kind == "oom":
            want.append(
                ("worker_crash|worker_oom", crash_of_victim(("worker_crash", "worker_oom")))
            )
        elif f.kind == "sigstop":
            want.append(
                (
                    "worker_hang",
                    has(
                        "worker_hang", g, lambda e: e["detail"].get("pid") == f.victims.get(g or "")
                    ),
                )
            )
        elif f.kind.startswith("corrupt"):
            want.append(("worker_crash (of the victim pid)", crash_of_victim(("worker_crash",))))
            want.append(("checkpoint_corrupt", has("checkpoint_corrupt", g)))
        elif f.kind == "disk_full":
            want.append(("checkpoint_failed", has("checkpoint_failed", g)))
        elif f.kind == "host_reboot":
            want.append(("host_reboot", has("host_reboot", None)))
        elif f.kind == "supervisor_kill":
            want.append(
                (
                    "supervisor_start(after=supervisor_crash)",
                    has(
                        "supervisor_start",
                        None,
                        lambda e: e["detail"].get("after") == "supervisor_crash",
                    ),
                )
            )
        elif f.kind.startswith("scale_"):
            mode = f.kind[6:]
            want.append(
                (
                    f"mode_pinned({mode})",
                    has("mode_pinned", None, lambda e: e["detail"].get("mode") == mode),
                )
            )
        for kind, ok in want:
            if not ok:
                f.problems.append(f"no {kind} event for {f.kind} on {g}")

    # ---- invariants ----
    def check(self) -> list[str]:
        """Every invariant as (message) for each violation; empty = nothing lost."""
        self.analyse()
        out: list[str] = []
        n = len([f for f in self.faults if not f.skipped])
        if n < self.s.min_faults:
            out.append(f"only {n} faults injected (at least {self.s.min_faults} planned)")
        for f in self.faults:
            out += [f"fault {f.kind}: {p}" for p in f.problems]
        if self.final_rc != 0:
            out.append(f"the last `rlsup run --exit-when-done` exited {self.final_rc} (want 0)")
        for proc, killed in self.sups:
            rc = proc.poll()
            if not killed and rc not in (0, None) and proc is not self.sup:
                out.append(f"supervisor pid {proc.pid} crashed with {rc} (not killed by the soak)")
        crashes = self._log_count("tick_failed")
        if crashes:
            out.append(f"the supervisor logged {crashes} tick_failed exceptions")
        conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
        try:
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            rows = {
                r[0]: (r[1], r[2]) for r in conn.execute("SELECT game, state, reason FROM workers")
            }
        finally:
            conn.close()
        if integrity != "ok":
            out.append(f"PRAGMA integrity_check: {integrity}")
        for g in self.s.games:
            state, reason = rows.get(g.name, ("missing", ""))
            steps = self.monitor.committed_steps(g.name)
            if state != "done":
                out.append(f"{g.name}: state {state} ({reason}), want done")
            if not steps or steps[-1] < g.total_steps:
                out.append(
                    f"{g.name}: newest checkpoint {steps[-1] if steps else None} "
                    f"< total_steps {g.total_steps}"
                )
        for name, most in self.monitor.most_workers.items():
            if most > 1:
                out.append(f"{name}: {most} live workers at once: {self.monitor.duplicates[:3]}")
        if self.monitor.most_supervisors > 1:
            out.append(f"{self.monitor.most_supervisors} supervisors alive at once")
        counts, pids = self.monitor.worker_processes()
        if counts:
            out.append(f"worker processes left running after the end: {pids}")
        out += self._verified_checkpoints_kept()
        return out

    def _verified_checkpoints_kept(self) -> list[str]:
        """No checkpoint whose bytes verify is ever quarantined, or deleted but by retention
        behind `keep` (3) newer ones."""
        from checkpoints import CheckpointError, CheckpointRef, CheckpointStore

        out = []
        for g in self.game_names:
            root = self.monitor.run_dir(g) / "checkpoints"
            store = CheckpointStore(root)
            for path in sorted(root.glob(".corrupt-ckpt-*")):
                ref = CheckpointRef(path, int(path.name[14:26]))
                with contextlib.suppress(CheckpointError):
                    store.verify(ref)
                    out.append(f"{g}: {path.name} was quarantined, yet every byte verifies")
            final = self.monitor.present[g]
            seen = self.monitor.committed[g]
            gone = dict(self.monitor.deleted[g])
            for step, t in self.monitor.deleted[g]:
                # Newer checkpoints committed by then (a listing that raced a rename may have
                # missed one: seen within a second) and not themselves gone before it.
                newer = [
                    s for s, first in seen.items()
                    if s > step and first <= t + 1.0 and gone.get(s, math.inf) >= t
                ]  # fmt: skip
                if step not in final and len(newer) < 3:
                    out.append(f"{g}: ckpt-{step:012d} deleted with only {sorted(newer)} newer")
        return out

    def _log_count(self, word: str) -> int:
        try:
            return (self.dir / "supervisor.log").read_text(errors="replace").count(word)
        except OSError:
            return 0

    # ---- figures ----
    def figures(self) -> dict[str, Any]:
        kinds: dict[str, dict[str, Any]] = {}
        for f in self.faults:
            k = kinds.setdefault(
                f.kind, {"injected": 0, "survived": 0, "skipped": 0, "recovery_s": [], "redone": 0}
            )
            if f.skipped:
                k["skipped"] += 1
                continue
            k["injected"] += 1
            k["survived"] += int(f.survived)
            if f.recovery_s is not None:
                k["recovery_s"].append(f.recovery_s)
            k["redone"] += f.redone_steps or 0
        table = {}
        for kind, k in sorted(kinds.items()):
            rec = k.pop("recovery_s")
            table[kind] = {
                **k,
                "recovery_median_s": round(statistics.median(rec), 2) if rec else None,
                "recovery_worst_s": round(max(rec), 2) if rec else None,
            }
        all_rec = [f.recovery_s for f in self.faults if f.recovery_s is not None and not f.skipped]
        return {
            "soak": "rlsup",
            "seed": self.s.seed,
            "faults": sum(k["injected"] for k in table.values()),
            "survived": sum(k["survived"] for k in table.values()),
            "recovery_median_s": round(statistics.median(all_rec), 2) if all_rec else None,
            "recovery_worst_s": round(max(all_rec), 2) if all_rec else None,
            "redone_steps": sum(k["redone"] for k in table.values()),
            "wall_s": round(self.wall_s, 1),
            "monitor_samples": self.monitor.samples,
            "games": {g.name: g.total_steps for g in self.s.games},
            "skipped": self.skipped,
            "by_kind": table,
        }

    def report(self) -> str:
        fig = self.figures()
        lines = [
            f"{'fault':18s} {'injected':>8s} {'survived':>8s} {'skipped':>7s} "
            f"{'rec med s':>9s} {'rec worst s':>11s} {'redone steps':>12s}"
        ]
        for kind, k in fig["by_kind"].items():
            lines.append(
                f"{kind:18s} {k['injected']:8d} {k['survived']:8d} {k['skipped']:7d} "
                f"{_fmt(k['recovery_median_s']):>9s} {_fmt(k['recovery_worst_s']):>11s} "
                f"{k['redone']:12d}"
            )
        lines.append(
            f"{'TOTAL':18s} {fig['faults']:8d} {fig['survived']:8d} {'':7s} "
            f"{_fmt(fig['recovery_median_s']):>9s} {_fmt(fig['recovery_worst_s']):>11s} "
            f"{fig['redone_steps']:12d}"
        )
        lines.append(f"wall time {fig['wall_s']} s; skipped: {fig['skipped'] or 'none'}")
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


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
