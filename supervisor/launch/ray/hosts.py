"""Several hosts: the joined hosts as the launcher last saw them, and where a game goes next.

`HostLedger` turns Ray's node list into the host events (node_joined, node_reboot, node_lost)
and chooses a host for each placement. It is told where the games' workers ran and which were
lost with their host; it asks Ray nothing itself (the launcher reads the nodes), so tests
hand it node lists written by hand (tests/cluster/test_ray_choose.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from supervisor.launch.ray.cluster import BOOT_LABEL, HOST_LABEL
from supervisor.launch.spawn import NoRoom

if TYPE_CHECKING:
    from supervisor.config import ClusterConfig

Event = tuple[str, str | None, dict[str, Any]]


@dataclasses.dataclass
class HostSeen:
    node_id: str
    boot_id: str
    alive: bool
    cpus: float
    gpus: float


class HostLedger:
    """The hosts that joined (`seen`), those in doubt, and each game's last host."""

    def __init__(self) -> None:
        self.seen: dict[str, HostSeen] = {}  # host -> as Ray listed it last
        self.lost_on: dict[str, set[str]] = {}  # host -> games whose worker was lost there
        # host -> when a worker's actor died there: the host may be dying while Ray's node
        # list still says alive (its health check takes seconds), so a new placement goes
        # elsewhere while another host has room, for host_lost_after_s or until it rejoins.
        self.doubted: dict[str, float] = {}
        self.last_host: dict[str, str] = {}  # game -> the host its last worker ran on

    def update(self, nodes: list[dict[str, Any]], placed: Mapping[str, str]) -> list[Event]:
        """Ray's labelled nodes now, and where the live placements are (game -> host): the
        events since the last update. Not `host_reboot`: that one is the supervisor's own
        host, and an incident of the stability policy."""
        alive: dict[str, dict[str, Any]] = {}
        for n in nodes:
            if n.get("Alive"):
                alive[n["Labels"][HOST_LABEL]] = n
        events: list[Event] = []
        for host, n in alive.items():
            boot = n["Labels"].get(BOOT_LABEL, "")
            res = n.get("Resources") or {}
            seen = HostSeen(n["NodeID"], boot, True, res.get("CPU", 0.0), res.get("GPU", 0.0))
            old = self.seen.get(host)
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
            self.seen[host] = seen
        for host, old in self.seen.items():
            if old.alive and host not in alive:
                old.alive = False
                self.doubted.pop(host, None)
                here = {game for game, on in placed.items() if on == host}
                games = sorted(here | self.lost_on.pop(host, set()))
                lost = {"host": host, "node_id": old.node_id, "boot_id": old.boot_id}
                events.append(("node_lost", None, {**lost, "games": games}))
        return events

    def live(self) -> dict[str, str]:
        """The hosts alive at the last update: name -> Ray node id."""
        return {host: seen.node_id for host, seen in self.seen.items() if seen.alive}

    def doubted_within(self, within_s: float) -> set[str]:
        """Hosts where a worker's actor died within `within_s` (see `doubted`)."""
        now = time.monotonic()
        return {host for host, at in self.doubted.items() if now - at < within_s}

    def left(self, game: str, host: str, lost: bool) -> None:
        """`game`'s worker on `host` is gone; `lost`: with its host (HOST_LOST_RC)."""
        self.last_host[game] = host
        if lost:  # for the host's node_lost event
            self.lost_on.setdefault(host, set()).add(game)
            self.last_host.pop(game, None)
            self.doubted[host] = time.monotonic()

    def choose(
        self,
        game: str,
        nodes: list[dict[str, Any]],
        counts: Mapping[str, int],
        cluster: ClusterConfig,
    ) -> tuple[str, str, float]:
        """(host, node id, its CPUs) for a new placement of `game`, given Ray's nodes and our
        other live games per host: the host its last worker ran on while that host is alive
        and has room (its checkpoints and replay buffer are there, and its spare: a restart
        in place needs nothing from the mirror), else the host with the fewest of our games,
        then the most CPUs. A host where an actor just died (`doubted`) comes last: Ray's
        node list says alive for seconds after a death. NoRoom when no host has room."""
        c = cluster
        doubted = self.doubted_within(c.host_lost_after_s)
        best: tuple[bool, int, float, str, str] | None = None
        for n in nodes:
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
