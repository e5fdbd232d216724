"""Several hosts: the launcher seam on a Ray cluster (`[cluster] backend = "ray"`).

The tick loop, the state machine, the restart budget, hang detection and the stability policy
are the ones of a single host; only the launcher differs. `RayLauncher.spawn` places a game on
a host that joined with `rlsup join` (fewest of our games first, then most CPUs, at most
`games_per_host`), moves the game's placement fence in the mirror one epoch on, and starts a
detached, named actor there (`WorkerHost`, max_restarts=0: rlsup owns every restart decision).
The actor runs the same `python -P -m training.worker` in the host's own run dir
(`$RLSUP_NODE_DIR/runs/<game>`) with that epoch, and mirrors the game's checkpoints from the
host (the epoch checked before each manifest). A command game (the user's own program on the
SDK) is started the same way through command.py, always cold. Each tick `poll()` relays the worker's
heartbeat.json and error.json into the supervisor's run dir, so liveness, reports and errors
are read as on one host. A host that dies (Ray reports the actor dead) or stays unreachable for
`host_lost_after_s` gives HOST_LOST_RC: the game is placed again on another host and resumes
from the mirror; a worker left running on a host declared lost commits nothing more (the
fence).

- launcher.py: `RayLauncher`, the seam; it holds the parts below and ties them together.
- hosts.py: the joined hosts (node events) and the choice of a host for a placement.
- mirroring.py: the placement fence, and mirror.json from the hosts' reports.
- process.py: a placed worker seen through its actor, and the exit watch.
- spare.py: a spare actor on every live host (the supervisor's side).
- cluster.py: the calls into Ray (joining, nodes, actors), and the labels `rlsup join` sets.
- host.py: what runs inside the actors on each host (no Ray import).
- command.py: a command game's first moments on its host, in the process that becomes it: its
  paths checked (the same absolute path on every host), the mirror's newest checkpoint
  restored where the host has none, then the program exec'd with the placement's epoch.

Ray is optional (`pip install 'rlsup[ray]'`) and imported only inside this package's calls,
only by this backend. The names below are handed on lazily: each host's actors import host.py
through this package, and must not load the supervisor's side with it (structlog with its
console renderer, the mirror's state: ~110 ms more for a bare interpreter, at every actor's
start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.launch.ray.cluster import (
        BOOT_LABEL,
        HOST_LABEL,
        RAY_VERSION,
        START_TIMEOUT_S,
        actor_name,
    )
    from supervisor.launch.ray.hosts import HostSeen
    from supervisor.launch.ray.launcher import (
        CLOSE_WAIT_S,
        OBSERVE_EVERY_S,
        SETTLE_WAIT_S,
        RayLauncher,
    )
    from supervisor.launch.ray.mirroring import FENCE_TIMEOUT_S
    from supervisor.launch.ray.process import (
        EXIT_WAIT_S,
        NOTICE_WAIT_S,
        ExitWatch,
        RayWorkerProcess,
    )

_HOME = {  # name -> the module of this package that defines it
    "BOOT_LABEL": "cluster",
    "HOST_LABEL": "cluster",
    "RAY_VERSION": "cluster",
    "START_TIMEOUT_S": "cluster",
    "actor_name": "cluster",
    "HostSeen": "hosts",
    "CLOSE_WAIT_S": "launcher",
    "OBSERVE_EVERY_S": "launcher",
    "SETTLE_WAIT_S": "launcher",
    "RayLauncher": "launcher",
    "FENCE_TIMEOUT_S": "mirroring",
    "EXIT_WAIT_S": "process",
    "NOTICE_WAIT_S": "process",
    "ExitWatch": "process",
    "RayWorkerProcess": "process",
}

__all__ = [
    "BOOT_LABEL", "CLOSE_WAIT_S", "EXIT_WAIT_S", "FENCE_TIMEOUT_S", "HOST_LABEL",
    "NOTICE_WAIT_S", "OBSERVE_EVERY_S", "RAY_VERSION", "SETTLE_WAIT_S", "START_TIMEOUT_S",
    "ExitWatch", "HostSeen", "RayLauncher", "RayWorkerProcess", "actor_name",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
