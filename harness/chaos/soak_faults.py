"""The soak's hands: each fault it injects, from outside wherever it can (signals, bytes on
disk, a full filesystem, a memory cgroup, the wall clock, the state database's lock, an
operator's commands). `Fault` records what was done; `soak_kinds.KINDS` says which injection
each kind uses and what must follow it.

`Injector` is a mixin of `soak_engine.Soak`: it reaches the monitor, the supervisor process and
the schedule's helpers through the attributes declared below.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from checkpoints import CheckpointError, CheckpointRef, CheckpointStore
from checkpoints.names import MANIFEST_NAME, STAGING_PREFIX, ckpt_name, ckpt_step
from harness.chaos.soak_config import LIGHT_ENVS, MEDIUM_ENVS, SoakSettings
from harness.chaos.soak_monitor import Monitor, WorkerLife
from harness.chaos.soak_services import (
    FLOOD_FD_SLACK,
    HOOK_TIMEOUT_S,
    MOVED_BUCKET,
    ConnectionFlood,
    DescriptorWatch,
    Mirror,
    hook_processes,
    open_descriptors,
    scrape,
)
from harness.fake_metadata import FakeMetadata
from supervisor.launch.spawn import process_argv
from supervisor.observe.hooks import RUNS_PER_HOOK
from training.protocol import read_heartbeat


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
    n: int = 0  # its place in the schedule
    # state_disk_full / db_locked: did the supervisor log a write failure in the window (an
    # outage)? Then a state_db_unavailable event must say so. (A database whose WAL has room
    # writes on through a full disk: no outage, nothing to report.)
    window_wall: tuple[float, float] | None = None
    db_outage: bool = True
    # replay_rot_live: did the worker write into the flipped chunk before its next checkpoint?
    # Then that checkpoint rewrites it from memory anyway: no comparison, no damage to report.
    chunk_rewritten: bool = False
    recovery_s: float | None = None
    redone_steps: int | None = None
    survived: bool = True
    problems: list[str] = field(default_factory=list)
    # crash_storm: the replacements killed right after their resume (not "the replacement")
    storm: dict[int, int] = field(default_factory=dict)  # pid -> signal
    t_storm_end: float | None = None
    # report_lost: the replacement that reported the damage, stopped as a leftover by the
    # killed supervisor's successor (its report is judged, the next one's recovery).
    reporter: int | None = None
    # spare_kill / spare_assign_kill: the spare process killed.
    spare_pid: int | None = None
    # mirror_move: the refusal's event id (the mirror_ok that must follow it).
    after_event_id: int | None = None
    # A wrapped game's victim (its script) is not the worker the supervisor started (its
    # shell, the session's leader): game -> that leader's pid, for the events naming it.
    leaders: dict[str, int] = field(default_factory=dict)


class Filler:
    """Keeps a filesystem full: a ballast file to the last page, then a thread that takes back
    within ~20 ms any space freed meanwhile (a failed checkpoint's staging removed, retention
    deleting an old one), as the other writers of a really full disk would."""

    def __init__(self, directory: Path) -> None:
        self.files = [directory / ".soak-ballast", directory / ".soak-ballast-tail"]
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._keep, daemon=True, name="soak-filler")

    def start(self) -> None:
        for path, block in zip(self.files, (1 << 20, 4096), strict=True):
            self._append(path, block)
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for path in self.files:
            with contextlib.suppress(OSError):
                path.unlink()

    def _keep(self) -> None:
        while not self._halt.wait(0.02):
            self._append(self.files[1], 4096)

    @staticmethod
    def _append(path: Path, block: int) -> None:
        with contextlib.suppress(OSError), open(path, "ab") as f:
            while True:
                f.write(b"\0" * block)
                f.flush()


def _checkpoint_request(run_dir: Path) -> dict[str, Any]:
    """The heartbeat's `checkpoint_request` (how the worker served one), {} when none."""
    try:
        hb = json.loads((run_dir / "heartbeat.json").read_text())
    except (OSError, ValueError):
        return {}
    req = hb.get("checkpoint_request") if isinstance(hb, dict) else None
    return req if isinstance(req, dict) else {}


class Injector:
    """Every injection, `_f_<kind>`; each returns the Fault it made, or None when no game was
    in a state to take it (it is then not counted)."""

    # Provided by soak_engine.Soak.
    s: SoakSettings
    rng: random.Random
    monitor: Monitor
    sup: subprocess.Popen[bytes] | None
    state: Path
    config: Path
    boot_file: Path
    read_faults: Path
    boot_n: int
    game_names: list[str]
    stopped_pids: set[int]
    read_eio_count: int  # read_eio faults so far: the first strikes the user's script
    skipped: dict[str, str]
    tmpfs: Path | None
    state_tmpfs: Path | None
    tmpfs_game: str
    cgroups: list[Path]
    clock_offset_s: float
    disk_full_until: float
    _disk_fault: Fault | None
    _disk_timer: threading.Timer | None
    _filler: Filler | None
    _disk_lock: threading.Lock
    corrupted: dict[str, set[int]]
    metrics_port: int
    hook_storm_flag: Path
    hook_mark: str
    hook_runs: Path
    mirror: Mirror
    metadata: FakeMetadata | None
    faults: list[Fault]

    if TYPE_CHECKING:  # the engine's own

        def start_supervisor(self) -> None: ...
        def _mark_killed(self, proc: subprocess.Popen[bytes]) -> None: ...
        def rlsup(self, *args: str) -> subprocess.CompletedProcess[str]: ...
        def pick_game(
            self,
            need_ckpts: int = 0,
            avoid_tmpfs: bool = False,
            builtin: bool = False,
            command: bool = False,
        ) -> str | None: ...
        def wait_disk(self) -> None: ...
        def wait_all_healthy(self, timeout: float, games: list[str] | None = None) -> bool: ...
        def _done(self, game: str) -> bool: ...
        def _healthy_not_stopped(self, game: str) -> bool: ...
        def _owned(self, game: str) -> bool: ...

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
            return [e.name for e in os.scandir(root) if e.name.startswith(STAGING_PREFIX)]
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
            step
            for p in root.glob("ckpt-*")
            if (step := ckpt_step(p.name)) is not None and (p / MANIFEST_NAME).exists()
        )
        fault = Fault(kind, [game], t, {game: pid})
        if len(steps) < 2:
            fault.note = "fewer than 2 checkpoints: plain kill"
            fault.kind = "kill"
            return fault
        newest = root / ckpt_name(steps[-1])
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
            if ckpt_step(p.name) is not None and (p / MANIFEST_NAME).exists()
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
        # The bit is flipped while the worker is stopped (it commits nothing meanwhile), then
        # it is killed: flipped after the kill, a replacement from the spare (restarted at
        # once, loading within ~0.1 s) could read the chunk before the flip and rightly
        # report nothing.
        life = self.monitor.current(game)
        if life is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(life.pid, signal.SIGSTOP)
        self._wait_stopped(life.pid)
        newest = self._newest(game)
        chunk = self._shared_chunk(newest, behind_cursor=False) if newest else None
        note = None
        if chunk is not None:
            note = self._flip_bit(chunk, self.rng) + f" (nlink {os.stat(chunk).st_nlink})"
        t = time.monotonic()
        pid = self._kill_worker(game)
        if pid is None:
            return None
        self._wait_gone(pid)
        fault = Fault("replay_rot", [game], t, {game: pid})
        if chunk is None or note is None:
            fault.kind, fault.note = "kill", "no shared replay chunk yet: plain kill"
            return fault
        fault.note = note
        fault.damaged_file = f"replay/{chunk.name}"
        return fault

    @staticmethod
    def _wait_stopped(pid: int, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                    return
            except psutil.Error:
                return
            time.sleep(0.005)

    def _f_report_lost(self) -> Fault | None:
        """A replay_rot whose report dies with the supervisor: it is stopped (SIGSTOP) as soon
        as it has spawned the replacement and SIGKILLed once that worker's heartbeat reports
        the damaged chunk, so no event records it. Its successor must, from that heartbeat."""
        game = self.DQN_GAME
        fault = self._f_replay_rot()
        if fault is None or fault.kind != "replay_rot" or self.sup is None:
            return fault
        fault.kind = "report_lost"
        old, sup = fault.victims[game], self.sup

        def replacement() -> int | None:
            pids = self.monitor.worker_processes()[1].get(game) or []
            return next((p for p in pids if p != old), None)

        pid = fault.reporter = self._wait_for(replacement, 30)
        with contextlib.suppress(ProcessLookupError):
            os.kill(sup.pid, signal.SIGSTOP)

        def reported() -> bool:
            hb = read_heartbeat(self.monitor.run_dir(game))
            return hb is not None and hb.pid == pid and bool(hb.replay_damage)

        if pid is None or not self._wait_for(reported, 60):
            fault.problems.append(f"{game}: replacement {pid} never reported the damaged chunk")
        with contextlib.suppress(ProcessLookupError):
            os.kill(sup.pid, signal.SIGKILL)
        self._mark_killed(sup)
        sup.wait(10)
        self.start_supervisor()
        fault.note += f"; supervisor killed before recording pid {pid}'s report"
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
        after = ckpt_step(newest.name) or 0
        deadline = t + 4 * self.s.checkpoint_every_s + 20
        while time.monotonic() < deadline and not self._done(game):
            later = [s for s in self.monitor.committed_steps(game) if s > after]
            if later:
                self._verify_committed(game, later[0], fault)
                fault.chunk_rewritten = self._chunk_written(newest, later[0], chunk)
                if fault.chunk_rewritten:
                    fault.note += " (then written by the worker: rewritten, nothing to compare)"
                return fault
            time.sleep(0.1)
        if not self._done(game):
            fault.problems.append(f"{game}: no checkpoint committed after the bit flip")
        return fault

    def _chunk_written(self, before: Path, step: int, chunk: Path) -> bool:
        """Did the buffer's write index pass through `chunk` between the snapshot of checkpoint
        `before` and that of checkpoint `step`? (True when it cannot tell.)"""
        try:
            m0 = json.loads((before / "replay" / "meta.json").read_text())
            after = before.parent / ckpt_name(step) / "replay" / "meta.json"
            m1 = json.loads(after.read_text())
        except (OSError, ValueError):
            return True
        cap, slots = int(m0["capacity"]), int(m0["chunk_slots"])
        t0, t1 = int(m0["t"]), int(m1["t"])
        c = int(chunk.stem.split("-")[1])
        lo, hi = c * slots, (c + 1) * slots
        return any(lo <= i % cap < hi for i in range(t0, min(t1, t0 + cap)))

    def _verify_committed(self, game: str, step: int, fault: Fault) -> None:
        path = self.monitor.run_dir(game) / "checkpoints" / ckpt_name(step)
        problem = verify_unless_retired(path, step)
        if problem is not None:
            fault.problems.append(f"{game}: {ckpt_name(step)}, committed after the flip: {problem}")

    def _f_read_eio(self) -> Fault | None:
        """Reads of one game's checkpoints fail with EIO for a while (the store's read seam),
        and its worker is killed: replacements must exit `checkpoint_unreadable` and back off,
        nothing may be quarantined, and once reads work the newest checkpoint is resumed.
        The first such fault strikes the user's own script (the SDK's path, which a random
        pick once left untried while it lacked checkpoint_unreadable), the next ones any game."""
        self.read_eio_count += 1
        first = self.read_eio_count == 1
        game = self.pick_game(need_ckpts=1, command=first) or (
            self.pick_game(need_ckpts=1) if first else None
        )
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
        game = self.pick_game(need_ckpts=1, builtin=True)
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
        # Workers of the current supervisor only: a leftover of a killed one is about to be
        # stopped, which is that fault's recovery, not this one's.
        if not self._wait_for(lambda: all(self._owned(g) for g in games), 60):
            return None
        lives = {g: lf for g in games if (lf := self.monitor.current(g)) is not None}
        if any(lf.max_step > 0.8 * self._total(g) for g, lf in lives.items()):
            return None  # a game would finish (its final checkpoint fails): not this fault
        assert self.sup is not None
        sup_pid = self.sup.pid
        steps = {g: lf.max_step for g, lf in lives.items()}
        first_id = self._last_event_id()
        t, t_wall = time.monotonic(), time.time()
        filler = Filler(self.state)
        with self._disk_lock:
            filler.start()
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
            filler.stop()
        fault.t_end = time.monotonic()
        if self.sup.poll() is not None or self.sup.pid != sup_pid:
            fault.problems.append(f"the supervisor exited ({self.sup.poll()}) on a full state dir")
        self._judge_outage(fault, t_wall, time.time(), "after space returned")
        for g in lives:
            committed = self._wait_for(lambda g=g: self._committed_since(g, fault.t_end), 60)
            if not committed and not self._done(g):
                fault.problems.append(f"{g}: no checkpoint committed after space returned")
        fault.event_ids = (first_id, self._last_event_id())
        return fault

    def _judge_outage(self, fault: Fault, t0: float, t1: float, when: str) -> None:
        """An outage the supervisor logged in [t0, t1] (wall clock) must become a
        state_db_unavailable event whose `since` lies in it; no outage logged, none expected."""
        fault.window_wall = (t0 - 1.0, t1 + 1.0)
        fault.db_outage = self._outage_logged(*fault.window_wall)
        if not fault.db_outage:
            fault.note += " (no database write failed: nothing to report)"
            return
        if not self._wait_for(lambda: self._outage_recorded(*fault.window_wall), 90):
            fault.problems.append(f"no state_db_unavailable event for the outage {when}")

    def _outage_logged(self, t0: float, t1: float) -> bool:
        """The supervisor's log says a database write failed (`state_db_unavailable`) in
        [t0, t1]."""
        try:
            lines = (self.state.parent / "supervisor.log").read_text(errors="replace")
        except OSError:
            return True  # cannot tell: expect the event
        for line in lines.splitlines():
            if '"event": "state_db_unavailable"' not in line:
                continue
            with contextlib.suppress(ValueError, KeyError):
                stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
                if t0 <= datetime.fromisoformat(stamp).timestamp() <= t1:
                    return True
        return False

    def _outage_recorded(self, t0: float, t1: float) -> bool:
        with contextlib.suppress(sqlite3.Error):
            conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
            try:
                rows = conn.execute(
                    "SELECT detail FROM events WHERE kind = 'state_db_unavailable'"
                ).fetchall()
            finally:
                conn.close()
            return any(t0 <= float(json.loads(r[0]).get("since", 0)) <= t1 for r in rows)
        return False

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
        t, t_wall = time.monotonic(), time.time()
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
        self._judge_outage(fault, t_wall, time.time(), "after the lock was released")
        fault.event_ids = (first_id, self._last_event_id())
        return fault

    # ---- the spare worker ---------------------------------------------------------------

    def _spare(self) -> tuple[int | None, str]:
        """The supervisor's spare as its row says: (pid, state)."""
        with contextlib.suppress(sqlite3.Error):
            conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
            try:
                row = conn.execute("SELECT pid, state FROM spare WHERE id = 1").fetchone()
            finally:
                conn.close()
            if row is not None:
                return row[0], str(row[1])
        return None, "absent"

    def _ready_spare(self, timeout: float) -> int | None:
        pid = self._wait_for(lambda: (p := self._spare())[1] == "ready" and p[0], timeout)
        return int(pid) if pid else None

    def _f_spare_kill(self) -> Fault | None:
        """The spare SIGKILLed (ready, or still warming): replaced; no game loses a worker."""
        pid, state = self._spare()
        if not pid:
            return None
        t = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        fault = Fault("spare_kill", [], t, note=f"spare pid {pid} ({state})")
        fault.spare_pid = pid
        return fault

    def _f_spare_assign_kill(self) -> Fault | None:
        """A worker SIGKILLed with a ready spare, and the spare SIGKILLed the moment its row
        hands it the game (mid hand-over): the game still gets exactly one worker."""
        spare = self._ready_spare(30)
        game = self.pick_game()
        if spare is None or game is None:
            return None
        fault = Fault("spare_assign_kill", [game], time.monotonic())
        pid = self._kill_worker(game, fault=fault)
        if not pid:
            return None
        fault.victims[game] = pid

        def handed() -> bool:
            with contextlib.suppress(sqlite3.Error):
                conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
                try:
                    row = conn.execute("SELECT pid FROM workers WHERE game = ?", (game,)).fetchone()
                finally:
                    conn.close()
                return bool(row) and row[0] == spare
            return False

        took = self._wait_for(handed, 20)
        with contextlib.suppress(ProcessLookupError):
            os.kill(spare, signal.SIGKILL)
        fault.spare_pid = spare
        fault.note = f"spare pid {spare} killed {'as it took over' if took else '(never handed)'}"
        return fault

    def _f_handover_supervisor_kill(self) -> Fault | None:
        """The state database locked (an operator's sqlite3 shell) and a worker SIGKILLed with
        a ready spare: the spare takes the game while its row cannot be written, and then the
        supervisor is SIGKILLed, the lock released, a new supervisor started. It must stop the
        spare turned worker, which no row names, before it starts the game again."""
        self.wait_disk()
        self.wait_all_healthy(40)
        spare = self._ready_spare(30)
        game = self.pick_game(builtin=True)
        if spare is None or game is None:
            return None
        assert self.sup is not None
        fault = Fault("handover_supervisor_kill", [game], time.monotonic())
        run_dir = str(self.monitor.run_dir(game))

        def became() -> bool:
            try:
                argv = process_argv(psutil.Process(spare).cmdline())
            except psutil.Error:
                return False
            return "--standby" not in argv and run_dir in argv

        locker = sqlite3.connect(self.state / "rlsup.db", isolation_level=None, timeout=30)
        took = False
        try:
            locker.execute("BEGIN EXCLUSIVE")
            pid = self._kill_worker(game, fault=fault)
            if not pid:
                return None
            fault.victims[game] = pid
            took = bool(self._wait_for(became, 20))
            os.kill(self.sup.pid, signal.SIGKILL)
            self._mark_killed(self.sup)
            self.sup.wait(10)
        finally:
            with contextlib.suppress(sqlite3.Error):
                locker.execute("COMMIT")
            locker.close()
        self.start_supervisor()
        fault.spare_pid = spare if took else None
        fault.note = (
            f"spare pid {spare} {'took the game' if took else 'never took it'}, then the "
            "supervisor was killed with the database locked"
        )
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
        leaders = _leaders(victims)  # while they live: a gone process has no session
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
        fault.leaders = leaders
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
        self._take_machine()
        self._boot_again()
        return Fault(
            "host_reboot", list(victims), t, victims, note=f"boot id soak-boot-{self.boot_n}"
        )

    def _take_machine(self) -> None:
        """The machine goes: the supervisor's group and every worker SIGKILLed at once."""
        assert self.sup is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sup.pid, signal.SIGKILL)
        _, pids = self.monitor.worker_processes()
        # Every process of the workers' sessions: a wrapped game's shell and its child too.
        everything = _sessions_of([p for plist in pids.values() for p in plist])
        for pid in everything:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._mark_killed(self.sup)
        self.sup.wait(10)
        for pid in everything:
            self._wait_gone(pid)

    def _boot_again(self) -> None:
        """A new boot id, and the supervisor started as systemd would at boot."""
        self.boot_n += 1
        self.boot_file.write_text(f"soak-boot-{self.boot_n}\n")
        self.start_supervisor()

    def _f_preemption(self) -> Fault | None:
        """A GCE notice (30 s), each game's checkpoint asked for and served (each heartbeat
        says so within 25 s, or it is a problem), then the machine is taken before the
        deadline (everything SIGKILLed) and boots again: `preempted`, not a `host_reboot`;
        every game resumes from the checkpoint the notice made."""
        self.wait_disk()
        self.wait_all_healthy(40)
        assert self.sup is not None and self.metadata is not None
        victims = {g: lf.pid for g in self.game_names if (lf := self.monitor.current(g))}
        t = time.monotonic()
        posted = time.time()
        self.metadata.post_notice(30.0)
        deadline = time.monotonic() + 25.0
        served: dict[str, float] = {}
        while time.monotonic() < deadline and len(served) < len(victims):
            for g in victims:
                req = _checkpoint_request(self.monitor.run_dir(g))
                if g not in served and req.get("committed"):
                    served[g] = float(req["committed"]) - posted
            time.sleep(0.2)
        self._take_machine()
        self.metadata.mode = "calm"  # the new machine has no notice
        self._boot_again()
        note = ", ".join(f"{g} {s:.1f} s" for g, s in sorted(served.items())) or "none served"
        fault = Fault("preemption", list(victims), t, victims, note=f"notice -> commit: {note}")
        for g in sorted(set(victims) - set(served)):
            if self._done(g):
                continue  # it reached total_steps meanwhile: its final checkpoint is its last
            # A healthy worker serves the notice's request within about a minibatch (the SDK's:
            # at its script's next should_checkpoint()); one whose heartbeat never says so
            # leaves its operator blind inside the window.
            req = _checkpoint_request(self.monitor.run_dir(g))
            fault.problems.append(f"{g}: checkpoint request not served in 25 s ({req or 'unseen'})")
        return fault

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
        self.wait_disk()  # one disk fault at a time: the previous one's space back and used
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
        self._fill(self.tmpfs)
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

    def _fill(self, directory: Path) -> None:
        """Start keeping `directory`'s filesystem full. A filler an earlier fault left running
        is stopped first: a second one replacing it would orphan it, and an orphaned filler
        keeps the disk full for the rest of the run (the first 60-minute soak on this
        version lost its last half hour that way: one game could never checkpoint again)."""
        with self._disk_lock:
            if self._filler is not None:
                self._filler.stop()
            self._filler = Filler(directory)
            self._filler.start()

    def restore_disk(self) -> None:
        """Space returns: grow the tmpfs (then drop the ballast)."""
        with self._disk_lock:
            if not self.disk_full_until or self.tmpfs is None:
                return
            if self._filler is not None:
                self._filler.stop()
                self._filler = None
            subprocess.run(["mount", "-o", "remount,size=128M", str(self.tmpfs)], check=False)
            fault = self._disk_fault
            if fault is not None:
                fault.t_end = time.monotonic()
            self.disk_full_until = 0.0
        if fault is not None:
            self._verify_window_commits(fault)

    def _verify_window_commits(self, fault: Fault) -> None:
        """A checkpoint may commit while the disk is "full" (space freed by its own failed
        staging or by retention, in the moment before the filler takes it back): what must
        never happen is one committed that is not whole. Checked now, while it exists."""
        game, end = fault.games[0], fault.t_end or fault.t
        root = self.monitor.run_dir(game) / "checkpoints"
        with self.monitor.lock:
            steps = [s for s, t in self.monitor.committed[game].items() if fault.t < t <= end]
        for step in steps:
            for _ in range(2):  # a second look: retention may be deleting it just now
                path = root / ckpt_name(step)
                if not path.is_dir():
                    break
                try:
                    CheckpointStore(root).verify(CheckpointRef(path, step))
                    break
                except CheckpointError as exc:
                    problem = f"{game}: {ckpt_name(step)}, committed on a full disk: {exc}"
                time.sleep(0.5)
            else:
                fault.problems.append(problem)

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
        gone = True
        with contextlib.suppress(psutil.Error):
            gone = psutil.Process(life.pid).status() == psutil.STATUS_ZOMBIE
        if not kills and gone and self._wait_for(lambda: self._done(game), 5):
            # It reached total_steps and exited 0 before the kernel struck: no OOM to judge.
            fault.skipped = "the game finished before the kernel OOM-killed its worker"
        elif psutil.pid_exists(life.pid) and not kills:
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

    # ---- the services beside the workers (issue 24): metrics endpoint, hooks, mirror ----------

    def _trains_again(self, game: str, victim: int) -> bool:
        """A worker other than `victim` trains `game` (its step moving), or the game is done."""
        life = self.monitor.healthy(game)
        return self._done(game) or (life is not None and life.pid != victim)

    def _f_metrics_flood(self) -> Fault | None:
        """A burst of idle local connections to `[metrics] listen`, more than a service has
        descriptors, and a worker SIGKILLed while they are held: its replacement must spawn and
        train, a real scrape must answer, and the supervisor's descriptors stay bounded."""
        game = self.pick_game()
        if game is None or self.sup is None:
            return None
        sup_pid = self.sup.pid
        base = open_descriptors(sup_pid) or 0
        first_id = self._last_event_id()
        watch = DescriptorWatch(sup_pid)
        flood = ConnectionFlood(self.metrics_port)
        fault = Fault("metrics_flood", [game], time.monotonic())
        try:
            established = flood.open()
            fault.t = time.monotonic()  # its recovery counts from the kill
            pid = self._kill_worker(game, fault=fault)
            if pid:
                fault.victims[game] = pid
                if not self._wait_for(lambda: self._trains_again(game, pid), 60):
                    fault.problems.append(
                        f"{game}: no replacement trained within 60 s of the kill while "
                        f"{established} connections were held"
                    )
            body, error = scrape(self.metrics_port)
        finally:
            flood.close()
            most = watch.stop()
        if body is None or b"rlsup_supervisor_up 1" not in body:
            fault.problems.append(f"GET /metrics during the flood: {error or body[:200]!r}")
        if most > base + FLOOD_FD_SLACK:
            fault.problems.append(
                f"the supervisor held {most} descriptors during the flood ({base} before; "
                f"bound {base} + {FLOOD_FD_SLACK})"
            )
        after = open_descriptors(sup_pid)
        fault.note = (
            f"{established}/{flood.count} idle connections held; supervisor descriptors "
            f"{base} -> at most {most} -> {after}; GET /metrics "
            + ("answered" if body is not None else "failed")
        )
        fault.event_ids = (first_id, self._last_event_id())
        return fault

    def _f_hostile_files(self) -> Fault | None:
        """What a buggy script or a bad disk leaves where the supervisor reads: a run dir's
        eval.json with an infinite step, a heartbeat.json with a string for a step (the worker
        replaces it within a second), an error.json of wrong types, a garbage progress.csv row,
        and accounting.json with a string game entry and a non-numeric time. The supervisor
        ticks on, `status`, `results` and `report` answer without a traceback, /metrics
        answers, and the game trains on."""
        game = self.pick_game()
        if game is None or self.sup is None:
            return None
        first_id = self._last_event_id()
        run_dir = self.monitor.run_dir(game)
        fault = Fault("hostile_files", [game], time.monotonic())
        hostile = {
            run_dir / "eval.json": '{"step": Infinity, "mean": NaN, "episodes": "x"}',
            run_dir / "heartbeat.json": '{"schema": 1, "seq": "x", "pid": -5, "global_step": "a"}',
            run_dir / "error.json": '{"pid": "abc", "kind": 7, "message": ["x"], "step": NaN}',
        }
        accounting = self.state / "accounting.json"
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(accounting.read_text())
            if isinstance(doc, dict):
                doc.setdefault("games", {})[game] = "garbage"
                doc["wall_s"] = "abc"
                hostile[accounting] = json.dumps(doc)
        for path, text in hostile.items():
            tmp = path.with_name(f".{path.name}.soak")
            tmp.write_text(text)
            os.replace(tmp, path)
        with contextlib.suppress(OSError), (run_dir / "progress.csv").open("a") as f:
            f.write("garbage,Infinity,NaN,,-1e999\n")
        for args in (("status", "--json"), ("results", "--json"), ("report", "--json")):
            done = self.rlsup(*args)
            if done.returncode not in (0, 4) or "Traceback" in done.stderr:
                fault.problems.append(
                    f"rlsup {' '.join(args)} exited {done.returncode}: {done.stderr[-300:]}"
                )
        body, error = scrape(self.metrics_port)
        if body is None or b"rlsup_supervisor_up 1" not in body:
            fault.problems.append(f"GET /metrics after the hostile files: {error or body[:200]!r}")
        if self.sup.poll() is not None:
            fault.problems.append(f"the supervisor exited {self.sup.returncode}")
        if not self._wait_for(lambda: self._healthy_not_stopped(game), 30):
            fault.problems.append(f"{game}: not training 30 s after the hostile files")
        fault.note = f"wrote {', '.join(sorted(p.name for p in hostile))} and a progress row"
        fault.event_ids = (first_id, self._last_event_id())
        return fault

    def _f_hook_storm(self) -> Fault | None:
        """Every game's worker SIGKILLed at once while the `[[hooks]]` program on worker_crash
        and restart misbehaves (megabytes of output, a setsid descendant holding its output,
        sleeping past timeout_s): the supervisor keeps ticking (restarts, no hang taken),
        each misbehaving run ends at its timeout, and nothing of a run is left running."""
        self.wait_disk()
        self.wait_all_healthy(40)
        wrapped = {g.name for g in self.s.games if g.wrapped}  # its kill is its script's
        games = [
            g for g in self.game_names if not self._done(g) and self._owned(g) and g not in wrapped
        ]
        if not games or self.sup is None:
            return None
        first_id = self._last_event_id()
        with contextlib.suppress(FileNotFoundError):
            self.hook_runs.unlink()
        self.hook_storm_flag.touch()
        fault = Fault("hook_storm", games, time.monotonic())
        try:
            for g in games:
                if pid := self._kill_worker(g, fault=fault):
                    fault.victims[g] = pid
            # Until every victim's restart has fired the hook and its crash and restart runs
            # have started misbehaving (more than one lane's worth: the later ones queue);
            # their training is judged later, by `recovered`, as for any kill.
            restarted = self._wait_for(
                lambda: len(self._events_after(first_id, "restart")) >= len(fault.victims), 30
            )
            if not restarted:
                fault.problems.append("not every victim was restarted within 30 s of the kills")
            runs = 2 * len(fault.victims)
            self._wait_for(
                lambda: len(self._read_lines(self.hook_runs)) >= runs, 4 * HOOK_TIMEOUT_S
            )
        finally:
            self.hook_storm_flag.unlink()  # later runs exit at once
        self._judge_hook_runs(fault, first_id)
        fault.event_ids = (first_id, self._last_event_id())
        return fault

    def _judge_hook_runs(self, fault: Fault, first_id: int) -> None:
        """Each misbehaving run (its pid in hook_runs) reported killed at its timeout, none
        lasting much past it, and no process of any run left once they are reported."""
        runs = len(self._read_lines(self.hook_runs))
        # The runs of one hook go RUNS_PER_HOOK at a time: a queue of them takes a multiple.
        budget_s = HOOK_TIMEOUT_S * (runs // RUNS_PER_HOOK + 1) + 15.0

        def reported() -> list[dict[str, Any]] | None:
            timed_out = [d for d in self._details_after(first_id, "hook_failed")
                         if "timeout_s" in str(d.get("error"))]  # fmt: skip
            return timed_out if len(timed_out) >= runs and not self._hook_left() else None

        timed_out = self._wait_for(reported, budget_s) or [
            d for d in self._details_after(first_id, "hook_failed")
            if "timeout_s" in str(d.get("error"))
        ]  # fmt: skip
        longest = max((float(d.get("seconds") or 0) for d in timed_out), default=0.0)
        left = self._hook_left()
        fault.note = (
            f"{runs} misbehaving hook runs; {len(timed_out)} killed at timeout_s "
            f"{HOOK_TIMEOUT_S:g} (longest {longest:.1f} s)"
        )
        if not runs:
            fault.problems.append("the storm ran no hook (no worker_crash/restart fired it)")
        if len(timed_out) < runs:
            fault.problems.append(
                f"{runs} misbehaving hook runs, {len(timed_out)} reported killed at their "
                f"timeout within {budget_s:.0f} s"
            )
        if longest > HOOK_TIMEOUT_S + 2.0:
            fault.problems.append(f"a hook run lasted {longest:.1f} s (timeout_s {HOOK_TIMEOUT_S})")
        if left:
            fault.problems.append(f"hook processes left running after the storm: {left}")
            for pid in left:  # not to leak them into the rest of the run
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _hook_left(self) -> list[str]:
        out = []
        for pid in hook_processes(self.hook_mark):
            with contextlib.suppress(psutil.Error):
                out.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())}")
        return out

    @staticmethod
    def _read_lines(path: Path) -> list[str]:
        try:
            return path.read_text().split()
        except FileNotFoundError:
            return []

    def _details_after(self, first_id: int, kind: str) -> list[dict[str, Any]]:
        """The details of the `kind` events written after event id `first_id`."""
        return [detail for _, detail in self._events_after(first_id, kind)]

    def _events_after(self, first_id: int, kind: str) -> list[tuple[int, dict[str, Any]]]:
        """(id, detail) of the `kind` events written after event id `first_id`."""
        with contextlib.suppress(sqlite3.Error):
            conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
            try:
                rows = conn.execute(
                    "SELECT id, detail FROM events WHERE kind = ? AND id > ? ORDER BY id",
                    (kind, first_id),
                ).fetchall()
            finally:
                conn.close()
            return [(int(r[0]), json.loads(r[1] or "{}")) for r in rows]
        return []

    def _f_mirror_move(self) -> Fault | None:
        """The operator points `[mirror] url` elsewhere and reloads (SIGHUP) just as a worker
        is SIGKILLed: the reload is refused whole (config_error naming mirror.url), the
        replacement restores and is mirrored against the location in force, uploads go on
        there (mirror_ok after the refusal, nothing in the other bucket), no other worker is
        restarted; then the file is reverted and reloaded."""
        if self.mirror.weed is None:
            why = self.skipped.get("mirror_move", "no mirror")
            return Fault("mirror_move", [], time.monotonic(), skipped=why)
        game = self.pick_game(need_ckpts=1, builtin=True)  # judged by its worker's argv
        if game is None or self.sup is None:
            return None
        original = self.config.read_text()
        old, new = f'url = "{self.mirror.url}"', f'url = "{self.mirror.moved_url}"'
        others = {
            g: lf.pid for g in self.game_names if g != game and (lf := self.monitor.current(g))
        }
        first_id = self._last_event_id()
        fault = Fault(
            "mirror_move", [game], time.monotonic(), note=f"url -> {self.mirror.moved_url}"
        )
        self.config.write_text(original.replace(old, new))
        try:
            pid = self._kill_worker(game, fault=fault)
            os.kill(self.sup.pid, signal.SIGHUP)
            refused = self._wait_for(lambda: self._events_after(first_id, "config_error"), 30)
        finally:
            self.config.write_text(original)
        if pid:
            fault.victims[game] = pid
            self._judge_replacement_mirror(fault, game, pid)
        if not refused:
            fault.problems.append("no config_error event for the moved mirror")
        else:
            fault.after_event_id, detail = refused[0]  # mirror_ok must follow it (soak_kinds)
            if "mirror.url" not in str(detail.get("message")):
                fault.problems.append(f"the refusal does not name mirror.url: {detail}")
        t_back = time.monotonic()
        os.kill(self.sup.pid, signal.SIGHUP)
        if not self._wait_for(lambda: self._event_since("config_reload", t_back), 30):
            fault.problems.append("the reverted config was not reloaded")
        for g, other in others.items():
            now = self.monitor.current(g)
            if not self._done(g) and (now is None or now.pid != other):
                fault.problems.append(f"{g}: its worker was restarted by a refused reload")
        fault.event_ids = (first_id, self._last_event_id())
        return fault

    def _judge_replacement_mirror(self, fault: Fault, game: str, victim: int) -> None:
        """The replacement (a spare handed the game, or a new process) runs with the mirror
        in force, not the refused one: judged from its command line once it has the game."""

        def replacement_argv() -> list[str] | None:
            for pid in self.monitor.worker_processes()[1].get(game) or []:
                if pid != victim:
                    with contextlib.suppress(psutil.Error):
                        return list(psutil.Process(pid).cmdline())
            return None

        argv = self._wait_for(replacement_argv, 30)
        if argv is None:
            fault.problems.append(f"{game}: no replacement process within 30 s of the kill")
        elif self.mirror.moved_url in argv or self.mirror.url not in argv:
            fault.problems.append(f"{game}: its replacement runs with {argv}")

    def judge_mirror_unmoved(self) -> None:
        """At the end of the run: nothing was ever uploaded where a refused reload pointed the
        mirror (a move applied to the uploader after all would have put every game there)."""
        faults = [f for f in self.faults if f.kind == "mirror_move"]
        if not faults or self.mirror.weed is None:
            return
        moved = self.mirror.objects(MOVED_BUCKET)
        if moved:
            faults[0].problems.append(f"{moved} objects in {MOVED_BUCKET}, the refused mirror")


def _leaders(victims: dict[str, int]) -> dict[str, int]:
    """game -> the session leader of its victim, where that is another process (a wrapper)."""
    out = {}
    for game, pid in victims.items():
        with contextlib.suppress(OSError):
            if (sid := os.getsid(pid)) != pid:
                out[game] = sid
    return out


def _sessions_of(pids: list[int]) -> list[int]:
    """`pids` and every live process that shares a session with one of them."""
    sids = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            sids.add(os.getsid(pid))
    out = set(pids)
    for p in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(p.pid) in sids:
                out.add(p.pid)
    return sorted(out)


def verify_unless_retired(path: Path, step: int) -> str | None:
    """Why the committed checkpoint at `path` does not verify, or None (it verifies, or
    retention retired it meanwhile: the directory is renamed away at once, so a verification
    racing it reads files that are gone, "missing MANIFEST.json": nothing to judge). The
    60-minute soak verified checkpoints under load slower than retention retired them."""
    try:
        CheckpointStore(path.parent).verify(CheckpointRef(path, step))
    except FileNotFoundError:
        return None
    except CheckpointError as exc:
        return None if not path.exists() else str(exc)
    return None
