"""Several hosts: what runs on each joined host, inside the Ray actors the supervisor starts.

`WorkerHost` is one actor's body: it starts a game's worker in the host's own run dir
(`$RLSUP_NODE_DIR/runs/<game>`), mirrors its checkpoints from the host (the placement's epoch
checked before each manifest), says when the worker exited (`wait_exit(early=True)`,
`exited`) and, once the checkpoint the worker committed last is mirrored, publishes its exit
status (`rc`). A spare actor's `WorkerHost` is not yet any game's: its child is a standby
worker (`HostStandby`, training/standby.py) that becomes the next game placed there (`take`).

Plain classes with no Ray import: the supervisor side (cluster.py) wraps them in actors,
and the tests drive them directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from supervisor.files import rotate_log
from supervisor.launch import sessions
from supervisor.launch.process import start_ticks
from supervisor.launch.spare import STOP_GRACE_S
from supervisor.launch.spawn import WORKER_MODULE, start_worker_process
from training import args as worker_args
from training import protocol
from training.protocol import SPARE_MAX_MESSAGE, decode_message, encode_message

NODE_DIR_ENV = "RLSUP_NODE_DIR"  # a host's own state: runs/<game>, logs/
# The host looks for a newly committed checkpoint this often (a directory listing): the less
# a crash finds unmirrored, the less its exit waits for that upload (the final pass).
LOOK_EVERY_S = 0.25
UPLOAD_EVERY_S = 1.0  # after a failed upload, the next try
# A worker's final checkpoint is mirrored after it exits, for at most this long (its actor
# lives on meanwhile; the supervisor waits for it only to move the game to another host or to
# stop). Past it the checkpoint stays on its host (resumed there, or redone elsewhere).
FINAL_UPLOAD_TIMEOUT_S = 45.0
WARM_TIMEOUT_S = 180.0  # the watchdog's startup grace: a spare not ready by then is replaced
ACK_TIMEOUT_S = 5.0  # the standby acknowledges an assignment within this, else: a cold start
COMMAND_MODULE = "supervisor.launch.ray.command"  # a command game's first moments (command.py)
LOG_TAIL_BYTES = 16 << 10  # an exited command game's last words, for the supervisor's log
# What is left of a stopped command game's session (a wrapper gone, its child still writing
# the final checkpoint) may finish this long before it is killed; unasked, it is killed at once.
REMAINS_GRACE_S = 30.0


def node_dir() -> Path:
    """This host's rlsup state: $RLSUP_NODE_DIR, else /var/lib/rlsup-node (root) or
    ~/.local/state/rlsup-node."""
    if env := os.environ.get(NODE_DIR_ENV):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/rlsup-node")
    return Path.home() / ".local" / "state" / "rlsup-node"


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _read(path: Path) -> bytes | None:
    try:
        return protocol.read_regular_file(path)
    except OSError:
        return None


# ---- a spare actor's standby worker -----------------------------------------------------------


class HostStandby:
    """The standby worker process of one host's spare actor: started as the actor's child on a
    socketpair, its messages drained by a thread (so that its `alive` messages never fill the
    channel), handed one assignment."""

    def __init__(
        self, log_path: Path, cwd: Path, device: str = "cpu", python: str = sys.executable
    ) -> None:
        self.log_path, self.cwd, self.device, self.python = log_path, cwd, device, python
        self.popen: subprocess.Popen[bytes] | None = None
        self.chan: socket.socket | None = None
        self.ready: dict[str, Any] | None = None  # its "ready" message
        self.heard = 0.0  # monotonic: its last message
        self._ready = threading.Event()
        self._assigned = threading.Event()
        self._closed = threading.Event()  # end of file on the channel: it exited or took over

    def start(self) -> int:
        """Start the standby; its pid."""
        rotate_log(self.log_path)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [self.python, "-P", "-m", WORKER_MODULE, "--standby",
               "--channel-fd", str(theirs.fileno()), "--device", self.device,
               "--parent-pid", str(os.getpid()), "--warm-mirror"]  # fmt: skip
        try:
            # Ray's workers carry SPT_NOENV, which would cut the title the standby takes on
            # (the cold worker's whole command line) to the length of its own.
            self.popen = start_worker_process(
                cmd, self.log_path, self.cwd, pass_fds=(theirs.fileno(),), unset_env=("SPT_NOENV",)
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self.chan, self.heard = ours, time.monotonic()
        threading.Thread(target=self._drain, name="rlsup-standby", daemon=True).start()
        return self.popen.pid

    def _drain(self) -> None:
        assert self.chan is not None
        chan = self.chan
        while True:
            try:
                raw = chan.recv(SPARE_MAX_MESSAGE)
            except OSError:
                break
            if not raw:
                break
            self.heard = time.monotonic()
            msg = decode_message(raw)
            if msg is None:
                continue
            if msg["type"] == "ready":
                self.ready = msg
                self._ready.set()
            elif msg["type"] == "assigned":
                self._assigned.set()
        self._closed.set()

    def wait_ready(self, timeout: float = WARM_TIMEOUT_S) -> dict[str, Any]:
        """Its "ready" message; OSError when it exits or stays silent first (it is stopped)."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if self._closed.is_set() or self.exited() or time.monotonic() > deadline:
                rc = self.popen.poll() if self.popen else None
                self.stop()
                raise OSError(f"the spare worker did not get ready (exit status {rc})")
        assert self.ready is not None
        return self.ready

    def exited(self) -> bool:
        return self.popen is None or self.popen.poll() is not None

    def state(self) -> str:
        """ready, warming, or lost (exited, or silent past its watchdog)."""
        if self.exited() or self._closed.is_set():
            return "lost"
        return "ready" if self._ready.is_set() else "warming"

    def hand_over(
        self, argv: list[str], cwd: Path, log_path: Path, timeout: float = ACK_TIMEOUT_S
    ) -> subprocess.Popen[bytes] | None:
        """Make the ready standby the worker `argv` (run dir `cwd`, log `log_path`): its Popen
        once it has acknowledged; None (and it is stopped) when it cannot take it."""
        if self.state() != "ready" or self.chan is None or self.popen is None:
            self.stop()
            return None
        msg = {"type": "assign", "argv": argv, "cwd": str(cwd), "log": str(log_path)}
        try:
            self.chan.sendall(encode_message(msg))
        except (OSError, ValueError):
            self.stop()
            return None
        deadline = time.monotonic() + timeout
        while not self._assigned.wait(0.02):
            # Its acknowledgement comes before its channel closes: read the flag once more.
            if self._closed.is_set() or time.monotonic() > deadline:
                if self._assigned.is_set():
                    break
                self.stop()
                return None
        popen, self.popen = self.popen, None
        return popen

    def stop(self) -> None:
        """No longer wanted: SIGTERM, SIGKILL after a grace, reaped; the channel closed."""
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGTERM)
                os.killpg(popen.pid, signal.SIGCONT)  # a stopped one cannot act on it
            try:
                popen.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(STOP_GRACE_S)
        if self.chan is not None:
            with contextlib.suppress(OSError):
                self.chan.shutdown(socket.SHUT_RDWR)
            self.chan.close()
            self.chan = None


# ---- one actor's body: a game's worker, or a spare not yet any game's -------------------------


class WorkerHost:
    """Runs one game's worker on its host and mirrors its checkpoints (a Ray actor's class;
    a plain class, so it is tested without Ray too)."""

    def __init__(self, game: str, epoch: int, mirror: dict[str, Any] | None) -> None:
        self.game, self.epoch, self.mirror = game, epoch, mirror
        self.root = node_dir()
        self.run_dir = self.root / "runs" / game
        self.log_path = self.root / "logs" / f"{game}.log"
        self.host = os.environ.get("RLSUP_HOST") or os.uname().nodename
        self.popen: subprocess.Popen[bytes] | None = None
        self.rc: int | None = None
        self.mirror_step: int | None = None
        self.mirror_created: float | None = None
        self.mirror_error: str | None = None
        self.mirror_failures = 0
        self.fenced = False
        self._remote: Any = None
        self.standby: HostStandby | None = None  # a spare actor's: not yet any game's
        self.command = False  # a command game's program (start_command), not rlsup's worker
        self._ticks: int | None = None  # its start: the identity of its session
        self._stop_asked: float | None = None  # monotonic: when a stop was asked (SIGTERM)
        self.exited: int | None = None  # the worker's exit status, as soon as it exits
        self._gone = threading.Event()  # `exited` is set
        self._exited = threading.Event()  # rc is published (its final checkpoint mirrored)

    def warm(self, device: str = "cpu") -> dict[str, Any]:
        """A spare actor (not yet any game's): start the standby worker for `device` and wait
        until it is ready (spare.py); what it reported. OSError when it did not get ready."""
        _private_dir(self.root / "logs")
        self.standby = HostStandby(self.root / "logs" / "spare.log", self.root, device)
        pid = self.standby.start()
        ready = self.standby.wait_ready()
        return {"pid": pid, "host": self.host, "device": ready.get("device"),
                "warm_s": ready.get("warm_s"), "priority": ready.get("priority")}  # fmt: skip

    def spare_state(self) -> str:
        """A spare actor's standby: ready, warming or lost."""
        return self.standby.state() if self.standby is not None else "lost"

    def take(
        self, game: str, epoch: int, mirror: dict[str, Any] | None, cfg_json: dict[str, Any]
    ) -> dict[str, Any]:
        """A spare actor becomes `game`'s at `epoch`: its standby becomes the worker (a cold
        start here when the standby cannot take it)."""
        self.game, self.epoch, self.mirror = game, epoch, mirror
        self.run_dir = self.root / "runs" / game
        self.log_path = self.root / "logs" / f"{game}.log"
        return self.start(cfg_json)

    def start(self, cfg_json: dict[str, Any]) -> dict[str, Any]:
        cfg = worker_args.WorkerConfig.from_json(
            {**cfg_json, "run_dir": str(self.run_dir), "epoch": self.epoch}
        )
        _private_dir(self.run_dir)
        _private_dir(self.log_path.parent)
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / protocol.HEARTBEAT_FILE).unlink()
        argv, served = cfg.to_argv(), "cold"
        standby, self.standby = self.standby, None
        if standby is not None:
            rotate_log(self.log_path)
            self.popen = standby.hand_over(argv, self.run_dir, self.log_path)
            served = "spare" if self.popen is not None else "cold"
        if self.popen is None:
            self.popen = start_worker_process(
                [sys.executable, "-P", "-m", WORKER_MODULE, *argv], self.log_path, self.run_dir
            )
        threading.Thread(target=self._watch, name="rlsup-watch", daemon=True).start()
        return {"pid": self.popen.pid, "host": self.host, "node_dir": str(self.root),
                "served": served}  # fmt: skip

    def start_command(
        self, argv: list[str], cwd: str | None, env: dict[str, str], threads: int | None = None
    ) -> dict[str, Any]:
        """A command game (its own program, the SDK): started through command.py in the host's
        run dir, in a session of its own, with the RLSUP_* environment the supervisor made
        (`env`) and this placement's own: the run dir on this host, the epoch, the mirror. Its
        working directory is `cwd` (the same absolute path on every host), else the run dir."""
        self.command = True
        _private_dir(self.run_dir)
        _private_dir(self.log_path.parent)
        for name in (protocol.HEARTBEAT_FILE, protocol.ERROR_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.run_dir / name).unlink()
        own = {protocol.RUN_DIR_ENV: str(self.run_dir), protocol.EPOCH_ENV: str(self.epoch)}
        if self.mirror is not None:
            own[protocol.MIRROR_URL_ENV] = str(self.mirror["url"])
            own[protocol.MIRROR_ENDPOINT_URL_ENV] = str(self.mirror.get("endpoint_url") or "")
            own[protocol.MIRROR_REGION_ENV] = str(self.mirror.get("region") or "")
        if threads:
            for name in (protocol.THREADS_ENV, "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                own[name] = str(threads)
        # Ray places a GPU game with its GPU: this actor's CUDA_VISIBLE_DEVICES is the one.
        given = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        rotate_log(self.log_path)
        cmd = [sys.executable, "-P", "-m", COMMAND_MODULE, "--cwd", cwd or str(self.run_dir),
               "--host", self.host, "--", *argv]  # fmt: skip
        self.popen = start_worker_process(
            cmd, self.log_path, self.run_dir, extra_env={**given, **own}
        )
        self._ticks = start_ticks(self.popen.pid)
        threading.Thread(target=self._watch, name="rlsup-watch", daemon=True).start()
        return {"pid": self.popen.pid, "host": self.host, "node_dir": str(self.root),
                "served": "cold"}  # fmt: skip

    def _heartbeat(self) -> bytes | None:
        """The run dir's heartbeat, for the supervisor. A command game's may be written by a
        child of its program (`sh -c "python train.py"`: the SDK runs in the child): one of its
        session is relayed as the program's (its pid, the one the supervisor knows, which
        cannot look into this host's sessions); one of any other process is not relayed."""
        data = _read(self.run_dir / protocol.HEARTBEAT_FILE)
        if data is None or not self.command or self.popen is None:
            return data
        try:
            hb = json.loads(data)
            pid = int(hb["pid"])
        except (ValueError, TypeError, KeyError):
            return data  # the supervisor's reading says what is wrong with it
        if pid == self.popen.pid:
            return data
        try:
            ours = os.getsid(pid) == self.popen.pid
        except ProcessLookupError:
            ours = True  # its last words, read after it exited (spawn.heartbeat_of)
        except OSError:
            ours = False
        return json.dumps({**hb, "pid": self.popen.pid}).encode() if ours else None

    def _log_tail(self) -> str | None:
        """An exited command game's last words (the supervisor reads why it died in its log)."""
        if not self.command or self.exited is None:
            return None
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return None

    def _watch(self) -> None:
        """Mirror the newest checkpoint while the worker runs; once it exited (`_reap`, a
        thread of its own: an upload that hangs never hides an exit), mirror once more (its
        final checkpoint), then publish its exit status (`rc`)."""
        assert self.popen is not None
        threading.Thread(target=self._reap, name="rlsup-reap", daemon=True).start()
        retry_at = 0.0
        while not self._gone.wait(LOOK_EVERY_S):
            if time.monotonic() < retry_at:
                continue
            failures = self.mirror_failures
            self._upload()
            if self.mirror_failures > failures:  # the next try in a while
                retry_at = time.monotonic() + UPLOAD_EVERY_S
        if self.command:
            self._end_session()
        deadline = time.monotonic() + FINAL_UPLOAD_TIMEOUT_S
        while time.monotonic() < deadline and not self.fenced:
            before = self.mirror_step
            if self._upload():
                break
            if self.mirror_step == before:  # it failed: again in a while (an upload that
                time.sleep(UPLOAD_EVERY_S)  # worked is looked after at once: nothing newer)
        self.rc = self.exited
        self._exited.set()

    def _end_session(self) -> None:
        """A command game's program exited: nothing of its session outlives it (as on one
        host: `Launcher.forget`). Asked to stop, what remains may finish its final checkpoint
        within REMAINS_GRACE_S; then, or at once, it is killed."""
        assert self.popen is not None
        sid = self.popen.pid
        if not sessions.is_ours(sid, self._ticks) or not sessions.members(sid):
            return
        if self._stop_asked is not None:
            left = self._stop_asked + REMAINS_GRACE_S - time.monotonic()
            sessions.wait_empty([sid], max(0.0, left), poll_s=0.1)
        sessions.kill_session(sid)

    def _reap(self) -> None:
        """Say the worker exited as soon as it did (`exited`, `wait_exit(early=True)`)."""
        assert self.popen is not None
        self.exited = self.popen.wait()
        self._gone.set()

    def wait_exit(self, timeout: float, early: bool = False) -> int | None:
        """Block until the worker's exit status is published (its final checkpoint mirrored;
        `early`: until it exited), at most `timeout` s: the supervisor learns of an exit at
        once, not at its next poll."""
        if early:
            self._gone.wait(timeout)
            return self.exited
        self._exited.wait(timeout)
        return self.rc

    def _upload(self) -> bool:
        """Mirror the newest committed checkpoint if it is newer than the last mirrored one.
        True when nothing is left to mirror (or mirroring is off or fenced)."""
        if self.mirror is None or self.fenced:
            return True
        from checkpoints import CheckpointError, CheckpointStore
        from checkpoints.errors import PlacementFenced
        from checkpoints.mirror import upload_checkpoint
        from checkpoints.remote import RemoteLocation, RemoteStore, make_client

        try:
            ref = CheckpointStore(self.run_dir / protocol.CHECKPOINT_DIR).latest()
        except OSError:
            return False
        if ref is None or (self.mirror_step is not None and ref.step <= self.mirror_step):
            return True
        try:
            manifest = json.loads((ref.path / "MANIFEST.json").read_bytes())
        except FileNotFoundError:
            return False  # retention removed it meanwhile: the next pass takes the newer one
        except (OSError, ValueError) as exc:
            self.mirror_failures += 1
            self.mirror_error = f"{ref.path.name}: {exc}"[:500]
            return False
        meta = manifest.get("meta") if isinstance(manifest, dict) else None
        written_at = meta.get("epoch") if isinstance(meta, dict) else None
        if isinstance(written_at, int) and written_at < self.epoch - 1:
            # A placement older than the one before this (the game ran elsewhere since): the
            # worker moves it aside for the mirror's newer one; never mirrored over it.
            return True
        try:
            if self._remote is None:
                client = make_client(self.mirror["endpoint_url"], self.mirror["region"])
                self._remote = RemoteStore(client, RemoteLocation.parse(self.mirror["url"]))
                self._remote.ensure_bucket()
            upload_checkpoint(self._remote, self.game, ref, epoch=self.epoch)
            created = manifest.get("created")
        except FileNotFoundError:
            return False  # retention removed it meanwhile: the next pass takes the newer one
        except PlacementFenced as exc:
            self.fenced, self.mirror_error = True, str(exc)
            return True
        except (CheckpointError, OSError, ValueError) as exc:
            self.mirror_failures += 1
            self.mirror_error = f"{ref.path.name}: {exc}"[:500]
            return False
        self.mirror_step, self.mirror_created, self.mirror_error = ref.step, created, None
        return False  # look again: a newer one may have been committed meanwhile

    def status(self) -> dict[str, Any]:
        return {
            "game": self.game,  # "" for a spare actor not yet any game's
            "epoch": self.epoch,
            "rc": self.rc,  # published once its final checkpoint is mirrored (or given up)
            "exited": self.exited,  # as soon as the worker exited
            "pid": self.popen.pid if self.popen else None,
            "heartbeat": self._heartbeat(),
            "error": _read(self.run_dir / protocol.ERROR_FILE),
            "eval": _read(self.run_dir / protocol.EVAL_FILE),  # the final evaluation (results)
            "mirror_step": self.mirror_step,
            "mirror_created": self.mirror_created,
            "mirror_error": self.mirror_error,
            "mirror_failures": self.mirror_failures,
            "fenced": self.fenced,
            "log_tail": self._log_tail(),  # a command game's, once it exited
        }

    def signal(self, sig: int) -> None:
        """SIGTERM (+SIGCONT: a stopped process cannot act on it) or SIGKILL its group. A spare
        actor's standby is stopped instead (it ran nothing: exit status 0)."""
        if self.popen is None and self.standby is not None:
            standby, self.standby = self.standby, None
            standby.stop()
            self.rc = self.exited = 0
            self._gone.set()
            self._exited.set()
            return
        if self.popen is None:
            return
        if sig == signal.SIGTERM and self._stop_asked is None:
            self._stop_asked = time.monotonic()
        if self.command and sig == signal.SIGKILL and sessions.is_ours(self.popen.pid, self._ticks):
            sessions.signal_members(self.popen.pid, sig)  # what left its group, too
        if self.popen.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)
            if sig == signal.SIGTERM:
                os.killpg(self.popen.pid, signal.SIGCONT)
