"""Several hosts: the launcher seam on a Ray cluster (`[cluster] backend = "ray"`).

The tick loop, the state machine, the restart budget, hang detection and the stability policy
are the ones of a single host; only the launcher differs. `RayLauncher.spawn` places a game on
a host that joined with `rlsup join` (fewest of our games first, then most CPUs, at most
`games_per_host`), moves the game's placement fence in the mirror one epoch on, and starts a
detached, named actor there (`WorkerHost`, max_restarts=0: rlsup owns every restart decision).
The actor runs the same `python -P -m training.worker` in the host's own run dir
(`$RLSUP_NODE_DIR/runs/<game>`) with that epoch, and mirrors the game's checkpoints from the
host (the epoch checked before each manifest). Each tick `poll()` relays the worker's
heartbeat.json and error.json into the supervisor's run dir, so liveness, reports and errors
are read as on one host. A host that dies (Ray reports the actor dead) or stays unreachable for
`host_lost_after_s` gives HOST_LOST_RC: the game is placed again on another host and resumes
from the mirror; a worker left running on a host declared lost commits nothing more (the
fence).

Ray is optional (`pip install 'rlsup[ray]'`) and imported only here, only by this backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from supervisor.config import MIRROR_LOCATION_KEYS, Config
from supervisor.launch.launcher import Launcher
from supervisor.launch.process import HOST_LOST_RC
from supervisor.launch.ray_host import (
    FINAL_UPLOAD_TIMEOUT_S,
    WorkerHost,
)
from supervisor.launch.ray_spare import RaySpares
from supervisor.launch.spare import SpareWant
from supervisor.launch.spawn import (
    NoRoom,
    WorkerProcess,
)
from supervisor.mirror.state import GameMirror, MirrorState
from training import args as worker_args
from training import protocol

log = structlog.get_logger("rlsup.ray")

RAY_VERSION = "2.60.0"  # the one version a head and its hosts run (checked by `rlsup join`)
HOST_LABEL = "rlsup-host"  # node label: the host's name
BOOT_LABEL = "rlsup-boot"  # node label: the host's boot id when it joined
START_TIMEOUT_S = 30.0  # actor placed, worker process started (the tick waits: < WatchdogSec)
# The mirror's answer to a placement's fence, at most (the tick waits: with START_TIMEOUT_S,
# one spawn stays well below WatchdogSec=60, where botocore's own retries take minutes).
FENCE_TIMEOUT_S = 10.0
OBSERVE_EVERY_S = 2.0
# A game that leaves a host while its last worker's final upload runs there waits this long
# in the tick for it; past it the placement waits for a later tick (`no_host`).
SETTLE_WAIT_S = 2.0
CLOSE_WAIT_S = 10.0  # at the supervisor's exit, final uploads still running get this long
EXIT_WAIT_S = 30.0  # how long one `wait_exit()` call waits on its host before it is renewed
NOTICE_WAIT_S = 2.0  # a notified exit: the tick waits this long for the actor's status


_ACTOR: Any = None


def _actor_class() -> Any:
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(WorkerHost)
    return _ACTOR


# ---- the supervisor side ------------------------------------------------------------------


class _SpareApi:
    """The Ray calls `RaySpares` makes (ray_spare.py), for the launcher's cluster."""

    def __init__(self, launcher: RayLauncher) -> None:
        self.launcher = launcher

    def create(self, host: str, node_id: str, name: str) -> Any:
        """A spare actor on `host`: no CPU of Ray's accounting (an idle spare is niced and
        single-threaded; the launcher counts each host's games itself, `_choose`)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return (
            _actor_class()
            .options(
                name=name,
                namespace=self.launcher.cfg.cluster.namespace,
                lifetime="detached",
                max_restarts=0,
                max_concurrency=4,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote("", 0, None)
        )

    @staticmethod
    def warm(actor: Any, device: str) -> Any:
        return actor.warm.remote(device)

    @staticmethod
    def check(actor: Any) -> Any:
        return actor.spare_state.remote()

    @staticmethod
    def done(ref: Any) -> bool:
        import ray

        ready, _ = ray.wait([ref], timeout=0)
        return bool(ready)

    @staticmethod
    def get(ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=5)

    @staticmethod
    def kill(actor: Any) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


def _location(cfg: Config) -> tuple[str, ...] | None:
    """Where the mirror is: what the fence client is built from."""
    m = cfg.mirror
    return None if m is None else tuple(getattr(m, k) for k in MIRROR_LOCATION_KEYS)


def actor_name(game: str, epoch: int) -> str:
    return f"{game}@{epoch}"


def _game_of(name: str) -> str:
    return name.rsplit("@", 1)[0]


@dataclasses.dataclass(eq=False)
class RayWorkerProcess(WorkerProcess):
    """A worker on another host, seen through its actor. `pid` is its pid on that host;
    `pidfd` a pipe that turns readable when the launcher's exit watch hears that the worker
    exited or its actor died (`notify`): the tick wakes as for a local pidfd and asks at once.
    Without that notice it is polled once a tick."""

    game: str = ""
    host: str = ""
    same_clock: bool = False  # another host's monotonic clock
    node_id: str = ""
    epoch: int = 0
    actor: Any = None
    view_dir: Path = Path()  # the supervisor's run dir of the game: relayed files land here
    lost_after_s: float = 30.0
    remote_pid: int = 0
    returncode: int | None = None
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    _ref: Any = None
    _ok_at: float = 0.0
    _killed: bool = False
    stopping: bool = False  # asked to stop: its exit is reported once its final upload is done
    # It exited by itself and is restarted at once: its actor still mirrors its final
    # checkpoint (the launcher's `draining`).
    draining: bool = False
    _write_fd: int = -1
    on_report: Any = None  # (proc, status) -> None: the launcher's mirror bookkeeping

    @property
    def pid(self) -> int:
        return self.remote_pid

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        now = time.monotonic()
        if self._ref is None:
            self._ref = self.actor.status.remote()
        # Told it exited (or its actor died): wait for the answer now, not a tick later.
        ready, _ = ray.wait([self._ref], timeout=NOTICE_WAIT_S if self._noticed() else 0)
        if not ready:
            return self._unreachable(now)
        ref, self._ref = self._ref, None
        try:
            st = ray.get(ref, timeout=5)
        except (ActorUnavailableError, GetTimeoutError):
            return self._unreachable(now)
        except RayActorError as exc:
            # Dead: its host died or was removed (or we killed it after a kill_at).
            self._exit(-signal.SIGKILL if self._killed else HOST_LOST_RC, str(exc))
            return self.returncode
        self._ok_at = now
        self.report = st
        if self.on_report is not None:
            self.on_report(self, st)
        self._relay(protocol.HEARTBEAT_FILE, st.get("heartbeat"), host=self.host)
        self._relay(protocol.ERROR_FILE, st.get("error"))
        if st.get("rc") is not None:
            self._exit(int(st["rc"]), None)
        elif st.get("exited") is not None and not (self.stopping or self._killed):
            # It exited by itself: the game restarts now, on this host mostly, where the
            # checkpoint it committed last lies; its actor mirrors that one behind it.
            self.returncode, self.draining = int(st["exited"]), True
        return self.returncode

    def notify(self) -> None:
        """The exit watch's notice (from its thread): the pipe turns readable."""
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"x")

    def _noticed(self) -> bool:
        """Drain the notice pipe; True when it held one."""
        try:
            return bool(os.read(self.pidfd, 64))
        except (BlockingIOError, OSError):
            return False

    def _unreachable(self, now: float) -> int | None:
        if now - self._ok_at < self.lost_after_s:
            return None
        log.warning("host_unreachable", game=self.game, host=self.host, after_s=self.lost_after_s)
        self._exit(HOST_LOST_RC, f"unreachable for {self.lost_after_s:g} s")
        return self.returncode

    def _exit(self, rc: int, why: str | None) -> None:
        self.returncode = rc
        if why:
            self.report = {**self.report, "lost": why}
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)  # done with it (or gone): free its name

    def _relay(self, name: str, data: bytes | None, host: str | None = None) -> None:
        if data is None:
            return
        if host is not None:
            with contextlib.suppress(ValueError, TypeError):
                hb = json.loads(data)
                if isinstance(hb, dict):
                    data = json.dumps({**hb, "host": host}).encode()
        path = self.view_dir / name
        tmp = path.with_name(f".{name}.relay")
        with contextlib.suppress(OSError):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, path)

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = time.monotonic() + (timeout if timeout is not None else 60.0)
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.returncode

    def placement(self) -> dict[str, Any]:
        return {"host": self.host, "epoch": self.epoch}

    def close(self) -> None:
        super().close()
        if self._write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._write_fd)
            self._write_fd = -1


class ExitWatch:
    """One thread that holds a pending `wait_exit()` call on every placed worker's actor and
    notifies the worker's process object when one returns (the worker exited) or fails (the
    actor died: its host, mostly). The tick then wakes on that worker's pipe and asks at once:
    an exit costs no tick's wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Any, RayWorkerProcess] = {}  # wait_exit ref -> its process
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, proc: RayWorkerProcess) -> None:
        with contextlib.suppress(Exception):  # no watch: it is polled once a tick
            ref = proc.actor.wait_exit.remote(EXIT_WAIT_S, True)
            with self._lock:
                self._pending[ref] = proc
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="rlsup-exits", daemon=True
                    )
                    self._thread.start()

    def unwatch(self, proc: RayWorkerProcess) -> None:
        with self._lock:
            for ref in [r for r, p in self._pending.items() if p is proc]:
                del self._pending[ref]

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            self._pending.clear()

    def _run(self) -> None:
        import ray

        while not self._closing.is_set():
            with self._lock:
                refs = list(self._pending)
            if not refs:
                self._closing.wait(0.2)
                continue
            try:
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.25)
            except Exception:  # the cluster unreachable: the ticks' polls tell
                self._closing.wait(1.0)
                continue
            for ref in ready:
                with self._lock:
                    proc = self._pending.pop(ref, None)
                if proc is None:
                    continue
                try:
                    rc = ray.get(ref, timeout=1)
                except Exception:
                    rc = -1  # the actor died: its poll says how
                if rc is None and proc.returncode is None:  # not yet: wait again
                    self.watch(proc)
                else:
                    proc.notify()


@dataclasses.dataclass
class _Draining:
    """An exited worker's actor that still mirrors its final checkpoint."""

    proc: RayWorkerProcess
    until: float  # monotonic: given up past it
    ref: Any = None  # a pending status() call


@dataclasses.dataclass
class HostSeen:
    node_id: str
    boot_id: str
    alive: bool
    cpus: float
    gpus: float


class RayLauncher(Launcher):
    """Places games on the hosts of a Ray cluster; see the module's docstring."""

    backend = "ray"
    local = False

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.placed: dict[str, RayWorkerProcess] = {}  # game -> its live placement
        self.lost_on: dict[str, set[str]] = {}  # host -> games whose worker was lost there
        # host -> when a worker's actor died there: the host may be dying while Ray's node
        # list still says alive (its health check takes seconds), so a new placement goes
        # elsewhere while another host has room, for host_lost_after_s or until it rejoins.
        self.doubted: dict[str, float] = {}
        self.draining: dict[str, _Draining] = {}  # game -> its exited worker's actor, uploading
        self.missed: list[tuple[str, str | None, dict[str, Any]]] = []  # final uploads given up
        self.hosts: dict[str, HostSeen] = {}
        self.next_observe = 0.0
        self._remote: Any = None
        url = cfg.mirror.url if cfg.mirror else ""
        state = MirrorState.read(cfg.state_dir)
        self.mirror_state = (
            state if state is not None and state.url == url else MirrorState(url=url)
        )
        self._failures_seen: dict[int, int] = {}  # id(proc) -> its actor's failures reported
        self._spare_api = _SpareApi(self)
        self.spares = RaySpares(self._spare_api)  # a spare actor on every live host
        self.exits = ExitWatch()  # the placed workers' exits, heard as they happen
        self.last_host: dict[str, str] = {}  # game -> the host its last worker ran on

    def configure(self, cfg: Config) -> None:
        """A reload: the configuration now in force. The supervisor refuses a reload that
        moves the mirror (`config.mirror_reload_refusal`); were one given anyway, the fence
        client follows it rather than fencing in one place while workers restore from another."""
        if _location(cfg) != _location(self.cfg):
            self._remote = None
        self.cfg = cfg

    # ---- connection ---------------------------------------------------------------------
    def connect(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise OSError(
                "[cluster] backend = \"ray\" needs Ray: pip install 'rlsup[ray]' "
                f"(ray=={RAY_VERSION})"
            ) from exc
        if ray.__version__ != RAY_VERSION:
            raise OSError(f"Ray {ray.__version__} is installed; rlsup needs ray=={RAY_VERSION}")
        c = self.cfg.cluster
        # ray.init installs its own SIGTERM/SIGINT handlers (exit at once): the supervisor's
        # (a flag: stop the workers, then exit) must stay in force.
        ours = {
            sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        try:
            ray.init(
                address=c.address,
                namespace=c.namespace,
                log_to_driver=False,
                configure_logging=False,
                ignore_reinit_error=True,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise OSError(f"cannot reach the Ray cluster at {c.address}: {exc}") from exc
        finally:
            for sig, handler in ours.items():
                if handler is not None:
                    signal.signal(sig, handler)

    def close(self) -> None:
        """At the supervisor's exit: no spare actor outlives it (they are detached)."""
        with contextlib.suppress(Exception):
            import ray

            if ray.is_initialized():
                until = time.monotonic() + CLOSE_WAIT_S  # the final uploads still running
                for d in list(self.draining.values()):
                    if not self._drained(d, max(0.0, until - time.monotonic())):
                        self._end_draining(d, "the supervisor exits", event=False)
                self.exits.close()
                self.spares.close()
                ray.shutdown()

    # ---- the hosts' spares ----------------------------------------------------------------
    def tend_spare(self, want: SpareWant, now: float) -> list[tuple[str, str | None, Any]]:
        """Once a tick: a spare actor on every live host while the policy wants a spare
        (ray_spare.py). None where each game takes a GPU (`gpus_per_game`): Ray places such
        a worker with its GPU, which an actor made before the placement does not hold."""
        if want.want and self.cfg.cluster.gpus_per_game:
            want = dataclasses.replace(
                want, want=False,
                reason="each game takes a GPU ([cluster] gpus_per_game): its worker starts cold",
            )  # fmt: skip
        hosts = {h: seen.node_id for h, seen in self.hosts.items() if seen.alive}
        return self.spares.tend(want, hosts, now, hold=self._doubted())

    # ---- final uploads behind an exit -----------------------------------------------------
    def _drained(self, d: _Draining, wait_s: float) -> bool:
        """Is the exited worker's final checkpoint mirrored (or given up)? Waits up to
        `wait_s`. Once it is, its actor is killed and forgotten."""
        import ray

        deadline = time.monotonic() + wait_s
        while True:
            if d.ref is None:
                try:
                    d.ref = d.proc.actor.status.remote()
                except Exception:
                    return self._end_draining(d, "its actor is gone")
            ready, _ = ray.wait([d.ref], timeout=max(0.0, min(0.25, deadline - time.monotonic())))
            if ready:
                ref, d.ref = d.ref, None
                try:
                    st = ray.get(ref, timeout=5)
                except Exception:
                    return self._end_draining(d, "its actor is gone")
                d.proc.report = st
                self._on_report(d.proc, st)
                if st.get("rc") is not None:
                    return self._end_draining(d, None)
            if time.monotonic() >= d.until:
                return self._end_draining(d, f"not mirrored within {FINAL_UPLOAD_TIMEOUT_S:g} s")
            if time.monotonic() >= deadline:
                return False

    def _end_draining(self, d: _Draining, lost: str | None, event: bool = True) -> bool:
        """Done with an exited worker's actor: its final upload finished (`lost` None) or is
        given up (an event, `final_upload_missed`, where the game may resume elsewhere from an
        older mirrored checkpoint; none where the newer placement in place mirrors it)."""
        if self.draining.get(d.proc.game) is d:
            del self.draining[d.proc.game]
        self._spare_api.kill(d.proc.actor)
        if lost is None:
            log.info("final_upload_done", game=d.proc.game, host=d.proc.host,
                     mirror_step=d.proc.report.get("mirror_step"))  # fmt: skip
        else:
            log.warning("final_upload_missed", game=d.proc.game, host=d.proc.host, why=lost)
        if lost is not None and event:
            self.missed.append(("final_upload_missed", d.proc.game, {
                "host": d.proc.host, "epoch": d.proc.epoch, "reason": lost,
                "mirror_step": d.proc.report.get("mirror_step"),
            }))  # fmt: skip
        return True

    def _settle(self, game: str, host: str, cold: bool) -> None:
        """Before `game` is placed on `host`: a final upload of its last worker still
        running elsewhere is waited for (the move resumes from the mirror; `NoRoom` past
        SETTLE_WAIT_S: a later tick places it). In place it is not: the checkpoint is on
        this host, and the new placement's actor mirrors it (the old one's upload is fenced
        out). A cold start in place that needs the CPUs the old actor holds ends it."""
        d = self.draining.get(game)
        if d is None or self._drained(d, 0.0):
            return
        if d.proc.host == host:
            if cold and self.cfg.cluster.cpus_per_game and not self._drained(d, SETTLE_WAIT_S):
                # In place: the new placement's actor mirrors that checkpoint.
                self._end_draining(d, "a cold restart in place needs its CPUs", event=False)
            return
        if not self._drained(d, SETTLE_WAIT_S):
            raise NoRoom(
                f"{game} moves from {d.proc.host} to {host} once the checkpoint its last "
                "worker committed there is mirrored"
            )

    def spare_row(self) -> dict[str, Any] | None:
        return self.spares.row()

    def remote(self) -> Any:
        from checkpoints.remote import RemoteLocation, RemoteStore, make_client

        m = self.cfg.mirror
        assert m is not None  # config: backend "ray" requires [mirror]
        if self._remote is None:
            client = make_client(m.endpoint_url or None, m.region or None)
            self._remote = RemoteStore(client, RemoteLocation.parse(m.url))
            self._remote.ensure_bucket()
        return self._remote

    # ---- hosts ----------------------------------------------------------------------------
    def _nodes(self) -> list[dict[str, Any]]:
        import ray

        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        return [n for n in nodes if (n.get("Labels") or {}).get(HOST_LABEL)]

    def observe(self, now: float) -> list[tuple[str, str | None, dict[str, Any]]]:
        """The host ledger, as events: node_joined, node_reboot (back with a new boot id),
        node_lost (with the games it ran). Not `host_reboot`: that one is the supervisor's
        own host, and an incident of the stability policy. Every tick: the final uploads still
        running behind an exit (`final_upload_missed` for one given up)."""
        for d in list(self.draining.values()):
            self._drained(d, 0.0)
        missed, self.missed = self.missed, []
        if now < self.next_observe:
            return missed
        self.next_observe = now + OBSERVE_EVERY_S
        try:
            nodes = self._nodes()
        except Exception as exc:  # the GCS unreachable: say so, keep supervising
            log.warning("ray_nodes_unreadable", error=str(exc))
            return []
        alive: dict[str, dict[str, Any]] = {}
        for n in nodes:
            if n.get("Alive"):
                alive[n["Labels"][HOST_LABEL]] = n
        events: list[tuple[str, str | None, dict[str, Any]]] = []
        for host, n in alive.items():
            boot = n["Labels"].get(BOOT_LABEL, "")
            res = n.get("Resources") or {}
            seen = HostSeen(n["NodeID"], boot, True, res.get("CPU", 0.0), res.get("GPU", 0.0))
            old = self.hosts.get(host)
            detail = {"host": host, "node_id": seen.node_id, "boot_id": boot,
                      "cpus": seen.cpus, "gpus": seen.gpus}  # fmt: skip
            if old is None:
                events.append(("node_joined", None, detail))
            elif old.boot_id and boot and old.boot_id != boot:  # back from a reboot
                events.append(("node_reboot", None, {**detail, "previous_boot_id": old.boot_id}))
            elif not old.alive or old.node_id != seen.node_id:
                events.append(("node_joined", None, {**detail, "rejoined": True}))
            if old is not None and (not old.alive or old.node_id != seen.node_id):
                self.doubted.pop(host, None)  # a new node of that host: nothing to doubt
            self.hosts[host] = seen
        for host, old in self.hosts.items():
            if old.alive and host not in alive:
                old.alive = False
                self.doubted.pop(host, None)
                here = {g for g, p in self.placed.items() if p.host == host}
                games = sorted(here | self.lost_on.pop(host, set()))
                lost = {"host": host, "node_id": old.node_id, "boot_id": old.boot_id}
                events.append(("node_lost", None, {**lost, "games": games}))
        return missed + events

    def _doubted(self) -> set[str]:
        """Hosts where a worker's actor died within host_lost_after_s (see `doubted`)."""
        now, within = time.monotonic(), self.cfg.cluster.host_lost_after_s
        return {host for host, at in self.doubted.items() if now - at < within}

    def _choose(self, game: str) -> tuple[str, str, float]:
        """(host, node id, its CPUs) for a new placement of `game`: the host its last worker
        ran on while that host is alive and has room (its checkpoints and replay buffer are
        there, and its spare: a restart in place needs nothing from the mirror), else the
        host with the fewest of our games, then the most CPUs. A host where an actor just
        died (`doubted`) comes last: Ray's node list says alive for seconds after a death."""
        c = self.cfg.cluster
        doubted = self._doubted()
        counts: dict[str, int] = {}
        for g, p in self.placed.items():
            if g != game and p.returncode is None:
                counts[p.host] = counts.get(p.host, 0) + 1
        best: tuple[bool, int, float, str, str] | None = None
        for n in self._nodes():
            if not n.get("Alive"):
                continue
            host, res = n["Labels"][HOST_LABEL], n.get("Resources") or {}
            cpus, gpus = res.get("CPU", 0.0), res.get("GPU", 0.0)
            room = c.games_per_host or (int(cpus // c.cpus_per_game) if c.cpus_per_game else 64)
            if c.gpus_per_game:
                room = min(room, int(gpus // c.gpus_per_game))
            have = counts.get(host, 0)
            if have >= room:
                continue
            if host == self.last_host.get(game) and host not in doubted:
                return host, n["NodeID"], cpus
            key = (host in doubted, have, -cpus, host, n["NodeID"])
            if best is None or key < best:
                best = key
        if best is None:
            raise NoRoom(f"no joined host has room for {game} (hosts: {sorted(counts) or 'none'})")
        return best[3], best[4], -best[2]

    # ---- the seam -------------------------------------------------------------------------
    def spawn(
        self,
        argv: list[str],
        log_path: Path,
        now_mono: float,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,  # unused: Ray's num_gpus places GPU games
        command: bool = False,  # never: the config refuses command games on Ray
    ) -> WorkerProcess:
        import ray

        cfg = worker_args.WorkerConfig.from_argv(argv)
        game = cfg.mirror_name or Path(cfg.run_dir).name
        view_dir = Path(cwd or cfg.run_dir)
        c = self.cfg.cluster
        host, node_id, _ = self._choose(game)
        self._settle(game, host, cold=False)
        epoch = self._advance_fence(game, host)
        threads = max(1, round(c.cpus_per_game)) if c.cpus_per_game else cfg.threads
        cfg = dataclasses.replace(cfg, threads=threads, epoch=epoch)
        m = self.cfg.mirror
        mirror = None if m is None else {"url": m.url, "endpoint_url": m.endpoint_url or None,
                                          "region": m.region or None}  # fmt: skip
        cfg_json = cfg.to_json()
        actor, info = None, None
        if (spare := self.spares.take(host, cfg.device)) is not None:
            try:  # the host's ready spare becomes the game's worker
                info = ray.get(spare.actor.take.remote(game, epoch, mirror, cfg_json),
                               timeout=START_TIMEOUT_S)  # fmt: skip
                actor = spare.actor
            except Exception as exc:  # gone since its last check: a cold start below
                log.warning("spare_take_failed", game=game, host=host, error=str(exc)[:300])
                self._spare_api.kill(spare.actor)
                # A worker it may still have started is fenced out: the cold one gets the
                # next epoch.
                epoch = self._advance_fence(game, host)
                cfg = dataclasses.replace(cfg, epoch=epoch)
                cfg_json = cfg.to_json()
        if actor is None or info is None:
            self._settle(game, host, cold=True)
            actor, info = self._start_cold(game, epoch, host, node_id, mirror, cfg_json)
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        proc = RayWorkerProcess(
            popen=None,  # type: ignore[arg-type]
            pidfd=read_fd,
            create_time=0.0,  # not a process of this host: never a local leftover
            started_mono=now_mono,
            start_ticks=None,
            served=str(info.get("served") or "cold"),
            game=game,
            host=str(info.get("host") or host),
            node_id=node_id,
            epoch=epoch,
            actor=actor,
            view_dir=view_dir,
            lost_after_s=c.host_lost_after_s,
            remote_pid=int(info["pid"]),
            _ok_at=time.monotonic(),
            _write_fd=write_fd,
            on_report=self._on_report,
        )
        self.placed[game] = proc
        self.exits.watch(proc)
        log.info("placed", game=game, host=proc.host, epoch=epoch, pid=proc.pid,
                 served=proc.served)  # fmt: skip
        return proc

    def _start_cold(
        self,
        game: str,
        epoch: int,
        host: str,
        node_id: str,
        mirror: dict[str, Any] | None,
        cfg_json: dict[str, Any],
    ) -> tuple[Any, dict[str, Any]]:
        """A new actor for `game` on `host`, its worker started there: (actor, what it said)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        c = self.cfg.cluster
        actor = (
            _actor_class()
            .options(
                name=actor_name(game, epoch),
                namespace=c.namespace,
                lifetime="detached",
                max_restarts=0,
                max_concurrency=4,
                num_cpus=c.cpus_per_game,
                num_gpus=c.gpus_per_game,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(game, epoch, mirror)
        )
        try:
            info = ray.get(actor.start.remote(cfg_json), timeout=START_TIMEOUT_S)
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise OSError(f"cannot start {game} on host {host}: {exc}") from exc
        return actor, info

    def _advance_fence(self, game: str, host: str) -> int:
        """The game's new placement epoch, within FENCE_TIMEOUT_S; OSError (a spawn failure:
        a backoff) past it, rather than a tick held past systemd's watchdog. The request runs
        in a daemon thread (an abandoned one never delays the supervisor's exit) and may still
        move the fence later: harmless, an epoch no worker was given."""
        from checkpoints.remote import RemoteError

        got: list[int | BaseException] = []
        done = threading.Event()

        def advance() -> None:
            try:
                got.append(self.remote().advance_fence(game, {"host": host, "at": time.time()}))
            except BaseException as exc:  # handed to the waiting tick
                got.append(exc)
            finally:
                done.set()

        threading.Thread(target=advance, name="rlsup-fence", daemon=True).start()
        if not done.wait(FENCE_TIMEOUT_S):
            raise OSError(
                f"the mirror did not move the placement fence of {game} within "
                f"{FENCE_TIMEOUT_S:g} s"
            )
        [outcome] = got
        if isinstance(outcome, RemoteError | ValueError):
            raise OSError(
                f"cannot move the placement fence of {game} in the mirror: {outcome}"
            ) from outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def terminate(self, proc: WorkerProcess) -> None:
        assert isinstance(proc, RayWorkerProcess)
        proc.stopping = True  # its exit is heard once its final checkpoint is mirrored
        with contextlib.suppress(Exception):
            proc.actor.signal.remote(int(signal.SIGTERM))

    def kill(self, proc: WorkerProcess) -> None:
        assert isinstance(proc, RayWorkerProcess)
        import ray

        proc._killed = True
        with contextlib.suppress(Exception):
            ray.get(proc.actor.signal.remote(int(signal.SIGKILL)), timeout=5)
        with contextlib.suppress(Exception):
            ray.kill(proc.actor, no_restart=True)

    def stop_leftovers(self, grace_s: float) -> list[str]:
        """A new supervisor: stop every actor of ours a predecessor left running (SIGTERM, its
        final checkpoint mirrored, then killed) before any game is placed again."""
        import ray
        from ray.util import list_named_actors

        names = list_named_actors()
        if not names:
            return []
        actors = {}
        for name in names:
            with contextlib.suppress(Exception):
                actors[name] = ray.get_actor(name, namespace=self.cfg.cluster.namespace)
        for actor in actors.values():
            with contextlib.suppress(Exception):
                actor.signal.remote(int(signal.SIGTERM))
        deadline = time.monotonic() + grace_s
        pending = dict(actors)
        seen = {name: name for name in actors}  # a spare that became a game's: game@epoch
        while pending and time.monotonic() < deadline:
            for name, actor in list(pending.items()):
                try:
                    st = ray.get(actor.status.remote(), timeout=5)
                except Exception:
                    del pending[name]  # dead already
                    continue
                if st.get("game"):
                    seen[name] = actor_name(str(st["game"]), int(st.get("epoch") or 0))
                if st["rc"] is not None:
                    del pending[name]
            if pending:
                time.sleep(0.5)
        for actor in actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        log.info("leftover_actors_stopped", actors=sorted(seen.values()),
                 unfinished=sorted(pending))  # fmt: skip
        return sorted(seen.values())

    def _on_report(self, proc: RayWorkerProcess, st: dict[str, Any]) -> None:
        """mirror.json for `rlsup status` and the mirror events, from the hosts' reports."""
        gm = self.mirror_state.games.setdefault(proc.game, GameMirror())
        changed = False
        step = st.get("mirror_step")
        if step is not None and step != gm.step:
            gm.step, gm.created, gm.uploaded_at = step, st.get("mirror_created"), time.time()
            gm.uploads += 1
            gm.last_error = None
            changed = True
        failures = int(st.get("mirror_failures") or 0)
        new = failures - self._failures_seen.get(id(proc), 0)
        if new > 0:
            self._failures_seen[id(proc)] = failures
            gm.failures += new
            gm.last_error, gm.error_at = st.get("mirror_error"), time.time()
            changed = True
        if changed:
            self.mirror_state.pid = os.getpid()
            self.mirror_state.write(self.cfg.state_dir)

    def forget(self, proc: WorkerProcess) -> None:
        if isinstance(proc, RayWorkerProcess):
            self._failures_seen.pop(id(proc), None)
            self.exits.unwatch(proc)
        if isinstance(proc, RayWorkerProcess) and proc.draining:
            if (old := self.draining.pop(proc.game, None)) is not None:
                self._end_draining(old, "a newer worker of the game exited", event=False)
            self.draining[proc.game] = _Draining(proc, time.monotonic() + FINAL_UPLOAD_TIMEOUT_S)
        if isinstance(proc, RayWorkerProcess) and self.placed.get(proc.game) is proc:
            del self.placed[proc.game]
            self.last_host[proc.game] = proc.host
            if proc.returncode == HOST_LOST_RC:  # for the host's node_lost event
                self.lost_on.setdefault(proc.host, set()).add(proc.game)
                self.last_host.pop(proc.game, None)
                self.doubted[proc.host] = time.monotonic()
