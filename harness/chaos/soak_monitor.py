"""The soak's eyes: a thread that samples every worker process, heartbeat and checkpoint
directory (by name, never through rlsup's own code) and keeps each worker life it saw."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from checkpoints.names import CORRUPT_PREFIX, MANIFEST_NAME, ckpt_step, corrupt_step
from supervisor.launch.spawn import process_argv

SHELLS = frozenset({"sh", "bash", "dash"})


@dataclass
class WorkerLife:
    """One worker process as seen through its heartbeats."""

    game: str
    pid: int
    first_seen: float  # its first heartbeat seen (late when heartbeats fail: a full disk)
    started: float = 0.0  # its process's start (monotonic): what was committed before it counts
    resumed_from_step: int | None = None
    quarantined: list[str] = field(default_factory=list)
    num_envs: int = 0
    first_step: int | None = None
    moving_at: float | None = None  # first heartbeat with a step past first_step
    max_step: int = 0
    last_seen: float = 0.0
    checkpoint_failures: int = 0
    steps: list[tuple[float, int]] = field(default_factory=list)
    replay_damage: list[dict[str, Any]] = field(default_factory=list)


class Monitor(threading.Thread):
    """Samples processes, heartbeats and checkpoint dirs every `poll_s` seconds."""

    def __init__(
        self,
        state: Path,
        games: list[str],
        poll_s: float = 0.2,
        child_marks: dict[str, str] | None = None,
    ) -> None:
        super().__init__(daemon=True, name="soak-monitor")
        self.state, self.games, self.poll_s = state, games, poll_s
        # Wrapped command games: game -> the argv word of the child their shell starts. Never
        # more than one alive per game: one more is a previous life's, left behind.
        self.child_marks = dict(child_marks or {})
        self.most_children: dict[str, int] = dict.fromkeys(self.child_marks, 0)
        self.leaked_children: list[str] = []
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
        children = self.wrapper_children()
        with self.lock:
            for g, found in children.items():
                self.most_children[g] = max(self.most_children[g], len(found))
                if len(found) > 1:
                    self.leaked_children.append(f"{g}: children {found} at t={now:.1f}")
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
            cmd = process_argv(p.info["cmdline"] or [])
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if cmd and os.path.basename(cmd[0]) in SHELLS:
                continue  # a wrapped game's `sh -c`: its script is the worker, counted below
            if any(part.endswith("soak_trainer.py") for part in cmd):  # the command game
                names = [cmd[i + 1] for i, part in enumerate(cmd[:-1]) if part == "--name"]
                if names and names[0] in self.games:
                    counts[names[0]] = counts.get(names[0], 0) + 1
                    pids.setdefault(names[0], []).append(p.pid)
                continue
            if "training.worker" not in cmd:
                continue
            for i, part in enumerate(cmd[:-1]):
                if part == "--run-dir" and cmd[i + 1] in run_dirs:
                    g = run_dirs[cmd[i + 1]]
                    counts[g] = counts.get(g, 0) + 1
                    pids.setdefault(g, []).append(p.pid)
        return counts, pids

    def wrapper_children(self) -> dict[str, list[int]]:
        """Live processes carrying each wrapped game's child mark, by game."""
        found: dict[str, list[int]] = {g: [] for g in self.child_marks}
        if not found:
            return found
        by_mark = {mark: g for g, mark in self.child_marks.items()}
        for p in psutil.process_iter(["cmdline", "status"]):
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            for part in p.info["cmdline"] or []:
                if part in by_mark:
                    found[by_mark[part]].append(p.pid)
        return found

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
            if (step := ckpt_step(e.name)) is not None:
                if os.path.exists(os.path.join(e.path, MANIFEST_NAME)):
                    present.add(step)
                    if step not in self.committed[game]:
                        with self.lock:
                            self.committed[game][step] = now
            elif e.name.startswith(CORRUPT_PREFIX):
                with self.lock:
                    self.corrupt_dirs[game].add(e.name)
        with self.lock:
            quarantined = {s for n in self.corrupt_dirs[game] if (s := corrupt_step(n)) is not None}
            for step in self.present[game] - present - quarantined:
                self.deleted[game].append((step, now))
            self.present[game] = present

    def _read_heartbeat(self, game: str, now: float) -> None:
        try:
            hb = json.loads((self.run_dir(game) / "heartbeat.json").read_text())
        except (OSError, ValueError):
            return
        pid, step = hb.get("pid"), hb.get("global_step")
        if not isinstance(pid, int) or pid <= 0 or not isinstance(step, int | None):
            return  # no worker's: what `hostile_files` wrote (the worker replaces it in ~1 s)
        with self.lock:
            life = self.lives.get((game, pid))
            if life is None:
                life = self.lives[(game, pid)] = WorkerLife(game, pid, now, process_start(pid, now))
            life.last_seen = now
            step = int(step or 0)
            if hb.get("phase") in ("training", "checkpointing", "stopping"):
                if life.first_step is None and hb.get("phase") == "training":
                    life.first_step = step
                    life.resumed_from_step = hb.get("resumed_from_step")
                    life.num_envs = int(hb.get("num_envs") or 0)
                    life.quarantined = list(hb.get("quarantined") or [])
                # Moved in any of these phases: a worker resumed one iteration short of its
                # total shows its new step first in its final checkpoint's heartbeat.
                moved = life.first_step is not None and step > life.first_step
                if life.moving_at is None and moved:
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


def process_start(pid: int, default: float) -> float:
    """When `pid` started, on the monotonic clock (its start ticks since boot; no wall clock,
    which the soak steps); `default` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return default
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return min(default, time.monotonic() - since_start)
