"""The pre-warmed spare worker: one per host, handed the next game that needs a worker.

A cold start pays a fresh interpreter, torch's and envpool's imports and the first optimizer
step (~3 s on 2 cores); the spare (`python -m training.worker --standby`, training/standby.py)
has paid what of that does not depend on the game and waits on a private channel (a
socketpair: no path, nothing another user can open). `Launcher.spawn` gives a start to the
ready spare whose device matches and falls back to a cold start otherwise; the keeper then
spawns the next spare at low priority.

Whether a host keeps a spare is the stability policy's call (`decide`): `[spare] enabled =
"auto"` drops it under memory pressure (RAM available below `min_ram_available_pct` once the
spare's own RSS is counted) and where the host runs its lowest mode.

The spare is supervised like a worker: its `alive` messages are its heartbeat (silent past the
watchdog's deadline: killed and replaced), a spare that dies is replaced after a backoff that
grows while spares keep dying before they are ready, and every change is an event.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from supervisor.files import make_private_dir, rotate_log
from supervisor.launch.process import start_ticks
from supervisor.launch.spawn import WorkerProcess, start_worker_process
from training.protocol import SPARE_MAX_MESSAGE, decode_message, encode_message

Event = tuple[str, str | None, dict[str, Any]]

RESPAWN_BASE_S = 2.0
RESPAWN_MAX_S = 300.0
STOP_GRACE_S = 5.0
# Before the first RSS reading: what an idle CPU spare holds on this machine kind (measured:
# docs/figures.md), so that the memory rule counts a spare that does not exist yet.
EXPECTED_RSS_MB = 350.0


@dataclass(frozen=True)
class SpareWant:
    """What the supervisor wants this tick: a spare or not (and why), for which device,
    with its log and working directory."""

    want: bool
    reason: str
    device: str = "cpu"
    log_path: Path | None = None
    cwd: Path | None = None


def spare_device(devices: list[str]) -> str:
    """The device the spare warms: cuda where any game may train on a GPU."""
    return "cpu" if all(d == "cpu" for d in devices) else "cuda"


def device_matches(spare_device: str, game_device: str) -> bool:
    """May a spare warmed on `spare_device` (what it reported: "cpu" also when it asked for
    cuda and the host has none) become a worker of `game_device`?"""
    if game_device == "auto":
        return True  # auto resolves to cuda exactly where the spare found it
    return spare_device == game_device


def argv_device(argv: list[str]) -> str:
    """The `--device` in a worker argv (`WorkerConfig.to_argv` leaves out the default)."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "--device":
            return argv[i + 1]
    return "auto"


def decide(
    enabled: bool | str,
    min_ram_available_pct: float,
    *,
    ram_available_pct: float | None,
    ram_total_mb: float | None,
    spare_rss_mb: float | None,
    have_spare: bool,
    lowest_rung: bool,
) -> tuple[bool, str]:
    """(want a spare, why). `enabled`: true / false / "auto". Under auto, no spare where the
    host is at its lowest mode, or where RAM available would fall below the threshold: with a
    spare running its RSS is already taken from what is available (keep it while available
    stays at or above the threshold); without one, its RSS (measured, else expected) is
    counted before one is started."""
    if enabled is False:
        return False, "disabled ([spare] enabled = false)"
    if enabled is True:
        return True, "enabled ([spare] enabled = true)"
    if lowest_rung:
        return False, "the host runs its lowest mode"
    if ram_available_pct is None or not ram_total_mb:
        return False, "no memory reading yet"
    rss = spare_rss_mb if spare_rss_mb is not None else EXPECTED_RSS_MB
    after = ram_available_pct - (0.0 if have_spare else 100.0 * rss / ram_total_mb)
    if after < min_ram_available_pct:
        return False, (
            f"memory pressure: {after:.1f}% RAM available with the spare counted "
            f"(below [spare] min_ram_available_pct = {min_ram_available_pct:g})"
        )
    return True, f"auto: {after:.0f}% RAM available with the spare counted"


@dataclass
class Spare:
    """One spare process, from spawn to assignment (or death)."""

    popen: subprocess.Popen[bytes]
    chan: socket.socket  # the supervisor's end
    pidfd: int
    ticks: int | None
    create_time: float
    spawned: float  # monotonic
    device_asked: str
    state: str = "warming"  # warming -> ready
    heard: float = 0.0  # monotonic: its last message
    ready_since: float | None = None  # wall clock
    ready_mono: float | None = None
    device: str | None = None  # what it warmed (its "ready" message)
    warm_s: float | None = None
    priority: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass
class SpareWorkerProcess(WorkerProcess):
    """A worker that began as the spare: the same process, handed over to a game."""

    chan: socket.socket | None = None
    acked: bool = False

    def lost_before_start(self) -> bool:
        """Did it die before taking its assignment (so the game never had a worker)? Its
        acknowledgement outlives it in the channel's buffer."""
        self._drain()
        return not self.acked

    def _drain(self) -> None:
        if self.chan is None or self.acked:
            return
        for msg in read_messages(self.chan):
            if msg.get("type") == "assigned":
                self.acked = True

    def close(self) -> None:
        super().close()
        if self.chan is not None:
            self.chan.close()
            self.chan = None


def read_messages(chan: socket.socket) -> list[dict[str, Any]]:
    """Every message waiting on a non-blocking channel; a closed channel ends the list."""
    out: list[dict[str, Any]] = []
    while True:
        try:
            raw = chan.recv(SPARE_MAX_MESSAGE)
        except (BlockingIOError, InterruptedError):
            return out
        except OSError:
            return out
        if not raw:
            return out
        if (msg := decode_message(raw)) is not None:
            out.append(msg)


@dataclass
class SpareKeeper:
    """Keeps (at most) one spare on this host; `Launcher.spawn` takes it."""

    python: str
    module: str
    wall: Callable[[], float] = time.time
    warm_timeout_s: float = 180.0  # the watchdog's startup grace
    silent_after_s: float = 120.0  # the watchdog's hang timeout
    spare: Spare | None = None
    retiring: list[Spare] = field(default_factory=list)
    want: SpareWant = field(default_factory=lambda: SpareWant(False, "not started"))
    lost_in_a_row: int = 0  # spares that died before they were ready, since the last ready
    next_spawn: float = 0.0
    rss_mb: float | None = None  # the last idle spare's, measured
    pending: list[Event] = field(default_factory=list)  # events made between two ticks

    # ---- the tick ---------------------------------------------------------------------------

    def tend(self, want: SpareWant, now: float) -> list[Event]:
        """Once a tick: read the spare's messages, replace a dead or silent one, start or
        stop one as `want` says. Returns the events."""
        events, self.pending = self.pending, []
        if want.want != self.want.want:
            kind = "spare_enabled" if want.want else "spare_disabled"
            events.append((kind, None, {"reason": want.reason}))
        self.want = want
        self._reap_retiring(now)
        if self.spare is not None:
            events += self._watch(self.spare, now)
        if self.spare is not None and (not want.want or self.spare.device_asked != want.device):
            why = want.reason if not want.want else f"device now {want.device}"
            events.append(("spare_stopped", None, {"pid": self.spare.pid, "reason": why}))
            self._retire(self.spare, now)
            self.spare = None
        if want.want and self.spare is None and now >= self.next_spawn:
            events += self._spawn(want, now)
        return events

    def _watch(self, spare: Spare, now: float) -> list[Event]:
        events: list[Event] = []
        for msg in read_messages(spare.chan):
            spare.heard = now
            if msg.get("type") == "ready" and spare.state == "warming":
                spare.state, spare.ready_since, spare.ready_mono = "ready", self.wall(), now
                spare.device = str(msg.get("device") or "cpu")
                spare.warm_s = _float(msg.get("warm_s"))
                spare.priority = str(msg.get("priority") or "")
                self.lost_in_a_row = 0
                self.rss_mb = self.measure_rss(spare)
                events.append(("spare_ready", None, {
                    "pid": spare.pid, "device": spare.device, "warm_s": spare.warm_s,
                    "ready_after_s": round(now - spare.spawned, 3),
                    "rss_mib": _round(self.rss_mb), "priority": spare.priority,
                }))  # fmt: skip
        rc = spare.popen.poll()
        limit = self.warm_timeout_s if spare.state == "warming" else self.silent_after_s
        silent = now - max(spare.heard, spare.spawned) > limit
        if rc is None and not silent:
            return events
        if rc is None:  # silent: killed and replaced
            self._kill(spare)
            rc = spare.popen.poll()
        if rc is None:
            # Stuck in the GPU driver (uninterruptible), the kill takes effect only once the
            # driver call returns: never wait for that in the tick; a later tick reaps it.
            self.retiring.append(spare)
        else:
            self._close(spare)
        self.spare = None
        if spare.state == "warming":
            self.lost_in_a_row += 1
        delay = min(RESPAWN_MAX_S, RESPAWN_BASE_S * 2.0 ** max(0, self.lost_in_a_row - 1))
        self.next_spawn = now + (delay if self.lost_in_a_row else 0.0)
        events.append(("spare_lost", None, {
            "pid": spare.pid, "state": spare.state, "returncode": rc,
            "reason": f"silent for more than {limit:g} s" if silent else "exited",
            "respawn_in_s": round(max(0.0, self.next_spawn - now), 3),
        }))  # fmt: skip
        return events

    def _spawn(self, want: SpareWant, now: float) -> list[Event]:
        assert want.log_path is not None
        try:
            make_private_dir(want.log_path.parent)
        except OSError as exc:
            self.next_spawn = now + RESPAWN_BASE_S * 2.0 ** min(8, self.lost_in_a_row)
            return [("spare_lost", None, {"pid": None, "state": "spawn", "reason": str(exc)})]
        rotate_log(want.log_path)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [self.python, "-P", "-m", self.module, "--standby",
               "--channel-fd", str(theirs.fileno()), "--device", want.device,
               "--parent-pid", str(os.getpid())]  # fmt: skip
        try:
            popen = start_worker_process(cmd, want.log_path, want.cwd, pass_fds=(theirs.fileno(),))
        except OSError as exc:
            ours.close()
            theirs.close()
            self.lost_in_a_row += 1
            self.next_spawn = now + RESPAWN_BASE_S * 2.0 ** min(8, self.lost_in_a_row)
            return [("spare_lost", None, {"pid": None, "state": "spawn", "reason": str(exc)})]
        theirs.close()
        ours.setblocking(False)
        try:
            pidfd = os.pidfd_open(popen.pid)
        except OSError as exc:
            # Never a child nobody tracks: kill and reap it, try again later.
            _killpg(popen.pid)
            popen.kill()
            popen.wait()
            ours.close()
            self.next_spawn = now + RESPAWN_BASE_S
            return [("spare_lost", None, {"pid": None, "state": "spawn", "reason": str(exc)})]
        try:
            create_time = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            create_time = 0.0
        self.spare = Spare(popen, ours, pidfd, start_ticks(popen.pid), create_time, now,
                           want.device, heard=now)  # fmt: skip
        return [("spare_spawned", None, {"pid": popen.pid, "device": want.device})]

    # ---- handing over -----------------------------------------------------------------------

    def take(
        self, argv: list[str], log_path: Path, cwd: Path | None, now: float
    ) -> SpareWorkerProcess | None:
        """The ready spare, become the worker `argv` (None: no ready spare for its device,
        or the hand-over failed; the caller starts it cold)."""
        spare = self.spare
        if spare is None or spare.state != "ready":
            return None
        # A spare that died since the tick is handed nothing (its events wait for the tick).
        self.pending += self._watch(spare, now)
        if self.spare is not spare or spare.device is None:
            return None
        if not device_matches(spare.device, argv_device(argv)):
            return None
        msg = {"type": "assign", "argv": argv, "cwd": str(cwd or os.getcwd()),
               "log": str(log_path)}  # fmt: skip
        self.spare = None
        try:
            spare.chan.send(encode_message(msg))
        except (OSError, ValueError):
            # Gone or wedged between two ticks (or an argv past the channel's limit): it is no
            # spare of ours any more, and the game starts cold.
            self._retire(spare, now)
            return None
        self.next_spawn = now  # the next spare starts in this tick (tend runs after spawns)
        return SpareWorkerProcess(
            spare.popen, spare.pidfd, spare.create_time, now, spare.ticks,
            served="spare", chan=spare.chan,
        )  # fmt: skip

    # ---- stopping ---------------------------------------------------------------------------

    def _retire(self, spare: Spare, now: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(spare.pid, signal.SIGTERM)
        spare.heard = now  # when it was asked: SIGKILL after STOP_GRACE_S
        self.retiring.append(spare)

    def _reap_retiring(self, now: float) -> None:
        for spare in list(self.retiring):
            if spare.popen.poll() is None and now - spare.heard > STOP_GRACE_S:
                self._kill(spare)
            if spare.popen.poll() is not None:
                self._close(spare)
                self.retiring.remove(spare)

    def close(self) -> None:
        """At the supervisor's exit: no spare outlives it."""
        spares = [*self.retiring, *([self.spare] if self.spare else [])]
        self.spare, self.retiring = None, []
        for spare in spares:
            with contextlib.suppress(ProcessLookupError):
                os.kill(spare.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for spare in spares:
            try:
                spare.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(spare)
                # Bounded: one stuck in the GPU driver dies when its call returns (systemd's
                # KillMode=control-group has it too); the supervisor's exit never waits on it.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spare.popen.wait(STOP_GRACE_S)
            self._close(spare)

    @staticmethod
    def _kill(spare: Spare) -> None:
        _killpg(spare.pid)
        with contextlib.suppress(ProcessLookupError):
            spare.popen.kill()

    @staticmethod
    def _close(spare: Spare) -> None:
        spare.chan.close()
        if spare.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(spare.pidfd)
            spare.pidfd = -1

    # ---- what status shows --------------------------------------------------------------------

    @staticmethod
    def measure_rss(spare: Spare) -> float | None:
        try:
            return float(psutil.Process(spare.pid).memory_info().rss) / 2**20
        except psutil.Error:
            return None

    def row(self) -> dict[str, Any]:
        """The `spare` row: its state (off / warming / ready), identity and why."""
        spare = self.spare
        if spare is None:
            state = "starting" if self.want.want else "off"
            return {"state": state, "pid": None, "pid_start_ticks": None, "device": None,
                    "since": None, "ready_since": None, "reason": self.want.reason,
                    "rss_mb": self.rss_mb}  # fmt: skip
        return {
            "state": spare.state,
            "pid": spare.pid,
            "pid_start_ticks": spare.ticks,
            "device": spare.device or spare.device_asked,
            "since": spare.create_time,
            "ready_since": spare.ready_since,
            "reason": self.want.reason,
            "rss_mb": self.rss_mb,
        }


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    except OSError as exc:  # pragma: no cover - any other errno: the kill below still runs
        if exc.errno != errno.ESRCH:
            raise


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) else None


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)
