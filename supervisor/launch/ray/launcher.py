"""Several hosts: `RayLauncher`, the launcher seam on a Ray cluster (`[cluster] backend = "ray"`).

It answers the daemon's `LauncherSeam` as this host's `Launcher` does, without being one: it
holds its parts and keeps only what ties them together, the live placements and the final
uploads still running behind an exit. The host ledger chooses the host (hosts.py), the
mirroring moves the fence and books the hosts' reports (mirroring.py), cluster.py makes the
Ray calls, the spares wait on every host (spare.py), and each placed worker is seen through
its actor (process.py), its exit heard by the exit watch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from supervisor.config import Config
from supervisor.launch.process import HOST_LOST_RC
from supervisor.launch.ray import cluster
from supervisor.launch.ray.cluster import START_TIMEOUT_S, SpareActors
from supervisor.launch.ray.host import FINAL_UPLOAD_TIMEOUT_S
from supervisor.launch.ray.hosts import HostLedger
from supervisor.launch.ray.mirroring import MirrorBook, advance_fence, mirror_location
from supervisor.launch.ray.process import ExitWatch, RayWorkerProcess
from supervisor.launch.ray.spare import RaySpares
from supervisor.launch.spare import SpareWant
from supervisor.launch.spawn import NoRoom, WorkerProcess
from training import args as worker_args
from training import protocol

log = structlog.get_logger("rlsup.ray")

Event = tuple[str, str | None, dict[str, Any]]

OBSERVE_EVERY_S = 2.0
# A game that leaves a host while its last worker's final upload runs there waits this long
# in the tick for it; past it the placement waits for a later tick (`no_host`).
SETTLE_WAIT_S = 2.0
CLOSE_WAIT_S = 10.0  # at the supervisor's exit, final uploads still running get this long


@dataclasses.dataclass
class _Draining:
    """An exited worker's actor that still mirrors its final checkpoint."""

    proc: RayWorkerProcess
    until: float  # monotonic: given up past it
    ref: Any = None  # a pending status() call


class RayLauncher:
    """Places games on the hosts of a Ray cluster; see the package's docstring."""

    backend = "ray"
    local = False

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.placed: dict[str, RayWorkerProcess] = {}  # game -> its live placement
        self.draining: dict[str, _Draining] = {}  # game -> its exited worker's actor, uploading
        self.missed: list[Event] = []  # final uploads given up, for the next observe()
        self.hosts = HostLedger()  # the joined hosts, and where a game goes next
        self.next_observe = 0.0
        self._remote: Any = None  # the fence's client of the mirror (`remote()`)
        self.book = MirrorBook(cfg.state_dir, cfg.mirror.url if cfg.mirror else "")
        self._spare_api = SpareActors(lambda: self.cfg.cluster.namespace)
        self.spares = RaySpares(self._spare_api)  # a spare actor on every live host
        self.exits = ExitWatch()  # the placed workers' exits, heard as they happen

    def configure(self, cfg: Config) -> None:
        """A reload: the configuration now in force. The supervisor refuses a reload that
        moves the mirror (`config.mirror_reload_refusal`); were one given anyway, the fence
        client follows it rather than fencing in one place while workers restore from another."""
        if mirror_location(cfg) != mirror_location(self.cfg):
            self._remote = None
        self.cfg = cfg

    def connect(self) -> None:
        cluster.connect(self.cfg.cluster.address, self.cfg.cluster.namespace)

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
        (spare.py). None where each game takes a GPU (`gpus_per_game`): Ray places such
        a worker with its GPU, which an actor made before the placement does not hold."""
        if want.want and self.cfg.cluster.gpus_per_game:
            want = dataclasses.replace(
                want, want=False,
                reason="each game takes a GPU ([cluster] gpus_per_game): its worker starts cold",
            )  # fmt: skip
        return self.spares.tend(want, self.hosts.live(), now, hold=self._doubted())

    def spare_row(self) -> dict[str, Any] | None:
        return self.spares.row()

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
                self.book.record(d.proc, st)
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

    # ---- the mirror's fence ---------------------------------------------------------------
    def remote(self) -> Any:
        from checkpoints.remote import RemoteLocation, RemoteStore, make_client

        m = self.cfg.mirror
        assert m is not None  # config: backend "ray" requires [mirror]
        if self._remote is None:
            client = make_client(m.endpoint_url or None, m.region or None)
            self._remote = RemoteStore(client, RemoteLocation.parse(m.url))
            self._remote.ensure_bucket()
        return self._remote

    def _advance_fence(self, game: str, host: str) -> int:
        return advance_fence(self.remote, game, host)

    # ---- hosts ----------------------------------------------------------------------------
    def _nodes(self) -> list[dict[str, Any]]:
        return cluster.labelled_nodes()

    def observe(self, now: float) -> list[Event]:
        """The host ledger, as events: node_joined, node_reboot (back with a new boot id),
        node_lost (with the games it ran). Every tick: the final uploads still running
        behind an exit (`final_upload_missed` for one given up)."""
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
        return missed + self.hosts.update(nodes, {g: p.host for g, p in self.placed.items()})

    def _doubted(self) -> set[str]:
        """Hosts where a worker's actor died within host_lost_after_s (`HostLedger.doubted`)."""
        return self.hosts.doubted_within(self.cfg.cluster.host_lost_after_s)

    def _choose(self, game: str) -> tuple[str, str, float]:
        """(host, node id, its CPUs) for a new placement of `game` (`HostLedger.choose`),
        counting our other live games on each host."""
        counts: dict[str, int] = {}
        for g, p in self.placed.items():
            if g != game and p.returncode is None:
                counts[p.host] = counts.get(p.host, 0) + 1
        c = self.cfg.cluster
        if c.cpus_per_game or c.gpus_per_game:
            # An exited worker's actor still mirroring its final checkpoint holds its Ray
            # resources: another game's actor could not be scheduled there until it is let go
            # (the start would time out, holding the tick), so that host is full meanwhile.
            for g, d in self.draining.items():
                if g != game:
                    counts[d.proc.host] = counts.get(d.proc.host, 0) + 1
        return self.hosts.choose(game, self._nodes(), counts, c)

    # ---- the seam -------------------------------------------------------------------------
    def spawn(
        self,
        argv: list[str],
        log_path: Path,
        now_mono: float,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,  # a command game's; Ray's num_gpus places GPUs
        command: bool = False,
    ) -> WorkerProcess:
        if command:
            return self._spawn_command(argv, log_path, now_mono, cwd, dict(env or {}))
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
        mirror = self._mirror_json()
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
            actor, info = cluster.start_cold(c, game, epoch, host, node_id, mirror, cfg_json)
        return self._placed(game, host, node_id, epoch, actor, info, view_dir, now_mono)

    def _mirror_json(self) -> dict[str, Any] | None:
        m = self.cfg.mirror
        return None if m is None else {"url": m.url, "endpoint_url": m.endpoint_url or None,
                                       "region": m.region or None}  # fmt: skip

    def _spawn_command(
        self, argv: list[str], log_path: Path, now_mono: float, cwd: Path | None,
        env: dict[str, str],
    ) -> WorkerProcess:  # fmt: skip
        """A command game (its own program through the SDK) on a host: always cold (no spare
        runs a user's program), started by its actor through command.py, which checks that
        the program reached the host (the same absolute path on every host), restores the
        mirror's newest checkpoint where the host has none, then execs it with the placement's
        epoch (`RLSUP_EPOCH`: the SDK commits nothing once fenced, and exits 77)."""
        game = env[protocol.GAME_ENV]
        view_dir = Path(env[protocol.RUN_DIR_ENV])  # the supervisor's run dir of the game
        c = self.cfg.cluster
        host, node_id, _ = self._choose(game)
        self._settle(game, host, cold=False)
        epoch = self._advance_fence(game, host)
        self._settle(game, host, cold=True)
        threads = max(1, round(c.cpus_per_game)) if c.cpus_per_game else None
        # No `cwd` of its own: the game's run dir, which on a host is that host's.
        where = None if cwd is None or Path(cwd) == view_dir else str(cwd)
        start = {"argv": list(argv), "cwd": where, "env": env, "threads": threads}
        actor, info = cluster.start_cold(
            c, game, epoch, host, node_id, self._mirror_json(), {}, command=start
        )
        proc = self._placed(game, host, node_id, epoch, actor, info, view_dir, now_mono)
        proc.view_log = log_path
        return proc

    def _placed(
        self, game: str, host: str, node_id: str, epoch: int, actor: Any,
        info: dict[str, Any], view_dir: Path, now_mono: float,
    ) -> RayWorkerProcess:  # fmt: skip
        """The new placement, watched: its exit heard as it happens."""
        c = self.cfg.cluster
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
            on_report=self.book.record,
        )
        self.placed[game] = proc
        self.exits.watch(proc)
        log.info("placed", game=game, host=proc.host, epoch=epoch, pid=proc.pid,
                 served=proc.served)  # fmt: skip
        return proc

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
        cluster.kill_actor(proc.actor)

    def stop_leftovers(self, grace_s: float) -> list[str]:
        """A new supervisor: stop every actor of ours a predecessor left running (SIGTERM, its
        final checkpoint mirrored, then killed) before any game is placed again."""
        return cluster.stop_leftover_actors(self.cfg.cluster.namespace, grace_s)

    def forget(self, proc: WorkerProcess) -> None:
        if not isinstance(proc, RayWorkerProcess):
            return
        self.book.forget(proc)
        self.exits.unwatch(proc)
        if proc.draining:
            if (old := self.draining.pop(proc.game, None)) is not None:
                self._end_draining(old, "a newer worker of the game exited", event=False)
            self.draining[proc.game] = _Draining(proc, time.monotonic() + FINAL_UPLOAD_TIMEOUT_S)
        if self.placed.get(proc.game) is proc:
            del self.placed[proc.game]
            self.hosts.left(proc.game, proc.host, lost=proc.returncode == HOST_LOST_RC)
