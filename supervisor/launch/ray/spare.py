"""Several hosts: a pre-warmed spare worker on every host of a Ray cluster.

On one host the supervisor keeps the spare itself (`spare.SpareKeeper`); on a Ray cluster
each joined host keeps one inside an actor of its own: a `WorkerHost` that is not yet any
game's (`warm()`), whose child is the standby worker (`python -m training.worker --standby`,
training/standby.py) on a private channel. Placing a game on a host that has a ready spare
gives the game that actor (`take()`): the standby becomes the worker, and the actor runs,
relays and mirrors it exactly as an actor started for the game would. A worker crash on a Ray
host then costs what it costs on one host, and a host's death costs Ray's death notice plus a
spare's hand-over on the host the game moves to, not a cold start there.

This module is the supervisor side: `RaySpares` keeps one spare actor per live host, its
events and the `spare` row; the host side (`HostStandby`, inside the actor) is in host.py.
A plain class, tested without Ray: its Ray calls are handed in (cluster.py's `SpareActors`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Any

from supervisor.launch.ray.host import WARM_TIMEOUT_S
from supervisor.launch.spare import (
    RESPAWN_BASE_S,
    RESPAWN_MAX_S,
    SpareWant,
    device_matches,
)

Event = tuple[str, str | None, dict[str, Any]]

CHECK_EVERY_S = 2.0  # how often the supervisor asks a ready spare's actor how its spare is


@dataclass
class RemoteSpare:
    """One host's spare actor, as the supervisor sees it."""

    host: str
    name: str
    actor: Any
    spawned: float  # monotonic
    warm_ref: Any  # the pending `warm()` call
    device_asked: str = "cpu"
    device: str | None = None  # what it warmed (cpu also where cuda was asked and none is)
    state: str = "warming"  # warming -> ready
    pid: int | None = None  # on its host
    ready_since: float | None = None  # wall clock
    check_ref: Any = None  # a pending `spare_state()` call
    next_check: float = 0.0


class RaySpares:
    """Keeps one spare actor on every live host while the policy wants a spare (`tend`), and
    hands a host's ready one to the next game placed there (`take`). `api` is the Ray calls
    it needs (`cluster.SpareActors`, the real ones; unit tests give fakes):

    - `create(host, node_id, name) -> actor` (its `warm()` not yet called);
    - `warm(actor, device) -> ref`, `check(actor) -> ref` (`spare_state()`);
    - `done(ref) -> bool`, `get(ref) -> Any` (raises when the actor died or the call failed);
    - `kill(actor)`.
    """

    def __init__(self, api: Any, wall: Callable[[], float] = time.time) -> None:
        self.api, self.wall = api, wall
        self.spares: dict[str, RemoteSpare] = {}  # host -> its spare actor
        self.want = SpareWant(False, "not started")
        self.lost_in_a_row: dict[str, int] = {}  # host -> spares lost before ready, in a row
        self.next_spawn: dict[str, float] = {}
        self.seq = 0

    def tend(
        self, want: SpareWant, hosts: dict[str, str], now: float, hold: Set[str] = frozenset()
    ) -> list[Event]:
        """Once a tick, with the live hosts (name -> Ray node id): read the spares' warm-ups
        and checks, replace a lost one (after a backoff while spares keep dying before they
        are ready), start one where a host has none (but on the hosts of `hold`, where an
        actor just died: Ray lists a dying host alive for seconds), or stop them all as `want`
        says."""
        events: list[Event] = []
        if want.want != self.want.want:
            kind = "spare_enabled" if want.want else "spare_disabled"
            events.append((kind, None, {"reason": want.reason}))
        self.want = want
        for host, sp in list(self.spares.items()):
            if host not in hosts:
                del self.spares[host]
                self.api.kill(sp.actor)
                detail = {"host": host, "pid": sp.pid, "state": sp.state, "reason": "host lost"}
                events.append(("spare_lost", None, detail))
                continue
            events += self._watch(sp, now)
        for host, sp in list(self.spares.items()):
            if not want.want or sp.device_asked != want.device:
                del self.spares[host]
                self.api.kill(sp.actor)
                why = want.reason if not want.want else f"device now {want.device}"
                events.append(("spare_stopped", None, {"host": host, "pid": sp.pid,
                                                       "reason": why}))  # fmt: skip
        if not want.want:
            return events
        for host, node_id in sorted(hosts.items()):
            if (
                host not in self.spares
                and host not in hold
                and now >= self.next_spawn.get(host, 0.0)
            ):
                events += self._spawn(host, node_id, want.device, now)
        return events

    def _spawn(self, host: str, node_id: str, device: str, now: float) -> list[Event]:
        self.seq += 1
        name = f"spare@{host}#{os.getpid()}.{self.seq}"
        try:
            actor = self.api.create(host, node_id, name)
            ref = self.api.warm(actor, device)
        except Exception as exc:  # Ray refused the actor: try again after a backoff
            return self._lost_before_ready(host, None, "spawn", str(exc)[:300], now)
        self.spares[host] = RemoteSpare(host, name, actor, now, ref, device_asked=device)
        return [("spare_spawned", None, {"host": host, "pid": None, "device": device})]

    def _watch(self, sp: RemoteSpare, now: float) -> list[Event]:
        if sp.state == "warming":
            if self.api.done(sp.warm_ref):
                try:
                    info = self.api.get(sp.warm_ref)
                except Exception as exc:
                    return self._drop(sp, f"its warm-up failed: {str(exc)[:300]}", now)
                sp.state, sp.pid, sp.ready_since = "ready", info.get("pid"), self.wall()
                sp.device = str(info.get("device") or "cpu")
                sp.next_check = now + CHECK_EVERY_S
                self.lost_in_a_row.pop(sp.host, None)
                return [("spare_ready", None, {
                    "host": sp.host, "pid": sp.pid, "device": info.get("device"),
                    "warm_s": info.get("warm_s"), "ready_after_s": round(now - sp.spawned, 3),
                    "priority": info.get("priority"),
                })]  # fmt: skip
            if now - sp.spawned > WARM_TIMEOUT_S + 10.0:
                return self._drop(sp, f"not ready within {WARM_TIMEOUT_S:g} s", now)
            return []
        if sp.check_ref is not None and self.api.done(sp.check_ref):
            ref, sp.check_ref = sp.check_ref, None
            try:
                state = self.api.get(ref)
            except Exception as exc:
                return self._drop(sp, f"its actor is gone: {str(exc)[:300]}", now)
            if state != "ready":
                return self._drop(sp, f"its spare worker is {state}", now)
        if sp.check_ref is None and now >= sp.next_check:
            sp.next_check = now + CHECK_EVERY_S
            with contextlib.suppress(Exception):
                sp.check_ref = self.api.check(sp.actor)
        return []

    def _drop(self, sp: RemoteSpare, reason: str, now: float) -> list[Event]:
        del self.spares[sp.host]
        self.api.kill(sp.actor)
        if sp.state == "warming":
            return self._lost_before_ready(sp.host, sp.pid, sp.state, reason, now)
        self.next_spawn[sp.host] = now
        return [("spare_lost", None, {"host": sp.host, "pid": sp.pid, "state": sp.state,
                                      "reason": reason, "respawn_in_s": 0.0})]  # fmt: skip

    def _lost_before_ready(
        self, host: str, pid: int | None, state: str, reason: str, now: float
    ) -> list[Event]:
        n = self.lost_in_a_row[host] = self.lost_in_a_row.get(host, 0) + 1
        delay = min(RESPAWN_MAX_S, RESPAWN_BASE_S * 2.0 ** (n - 1))
        self.next_spawn[host] = now + delay
        detail = {"host": host, "pid": pid, "state": state, "reason": reason,
                  "respawn_in_s": round(delay, 3)}  # fmt: skip
        return [("spare_lost", None, detail)]

    def take(self, host: str, device: str = "auto") -> RemoteSpare | None:
        """The host's ready spare actor for a worker of `device`, now no spare of ours (the
        caller hands it the game); the host's next spare starts at the next tick."""
        sp = self.spares.get(host)
        if sp is None or sp.state != "ready" or sp.device is None:
            return None
        if not device_matches(sp.device, device):
            return None
        del self.spares[host]
        return sp

    def row(self) -> dict[str, Any]:
        """The `spare` row of `rlsup status`: the hosts' spares in one line (they are not this
        host's processes: no pid), each host's own in `nodes[].spare`."""
        ready = sorted(h for h, sp in self.spares.items() if sp.state == "ready")
        warming = sorted(h for h, sp in self.spares.items() if sp.state == "warming")
        if ready:
            state = "ready"
        elif warming:
            state = "warming"
        else:
            state = "starting" if self.want.want else "off"
        where = "; ".join(
            part
            for part in (
                f"ready on {', '.join(ready)}" if ready else "",
                f"warming on {', '.join(warming)}" if warming else "",
            )
            if part
        )
        reason = f"{self.want.reason} (several hosts: {where})" if where else self.want.reason
        since = [sp.ready_since for sp in self.spares.values() if sp.ready_since is not None]
        devices = sorted({sp.device or sp.device_asked for sp in self.spares.values()})
        return {"state": state, "pid": None, "pid_start_ticks": None,
                "device": ", ".join(devices) or self.want.device,
                "since": None, "ready_since": min(since) if since else None,
                "reason": reason, "rss_mb": None}  # fmt: skip

    def close(self) -> None:
        """At the supervisor's exit: no spare outlives it (the actors are detached)."""
        for sp in self.spares.values():
            self.api.kill(sp.actor)
        self.spares.clear()
