"""Several hosts: the calls into Ray, in one place. The pinned version and the node labels
`rlsup join` sets, joining the cluster, its labelled nodes, a game's actor started cold on a
host, the spare actors' calls, and a predecessor's actors stopped.

Ray is imported inside each call, never at import: `rlsup join --dry-run` and the tests of
the plain classes beside it (host.py, spare.py) run without it.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from supervisor.launch.ray.host import WorkerHost

if TYPE_CHECKING:
    from supervisor.config import ClusterConfig

log = structlog.get_logger("rlsup.ray")

RAY_VERSION = "2.60.0"  # the one version a head and its hosts run (checked by `rlsup join`)
HOST_LABEL = "rlsup-host"  # node label: the host's name
BOOT_LABEL = "rlsup-boot"  # node label: the host's boot id when it joined
START_TIMEOUT_S = 30.0  # actor placed, worker process started (the tick waits: < WatchdogSec)

_ACTOR: Any = None


def actor_class() -> Any:
    """`WorkerHost` as a Ray actor class (made once: it imports Ray)."""
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(WorkerHost)
    return _ACTOR


def actor_name(game: str, epoch: int) -> str:
    return f"{game}@{epoch}"


def connect(address: str, namespace: str) -> None:
    """Join the cluster at `address` as its driver; OSError when Ray is missing, of another
    version, or the cluster cannot be reached."""
    try:
        import ray
    except ImportError as exc:
        raise OSError(
            f"[cluster] backend = \"ray\" needs Ray: pip install 'rlsup[ray]' (ray=={RAY_VERSION})"
        ) from exc
    if ray.__version__ != RAY_VERSION:
        raise OSError(f"Ray {ray.__version__} is installed; rlsup needs ray=={RAY_VERSION}")
    # ray.init installs its own SIGTERM/SIGINT handlers (exit at once): the supervisor's
    # (a flag: stop the workers, then exit) must stay in force.
    ours = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        ray.init(
            address=address,
            namespace=namespace,
            log_to_driver=False,
            configure_logging=False,
            ignore_reinit_error=True,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise OSError(f"cannot reach the Ray cluster at {address}: {exc}") from exc
    finally:
        for sig, handler in ours.items():
            if handler is not None:
                signal.signal(sig, handler)


def labelled_nodes() -> list[dict[str, Any]]:
    """Ray's nodes that joined with `rlsup join` (the head, unlabelled, places no game)."""
    import ray

    nodes = ray.nodes()  # type: ignore[no-untyped-call]
    return [n for n in nodes if (n.get("Labels") or {}).get(HOST_LABEL)]


def kill_actor(actor: Any) -> None:
    """Done with `actor` (or it is gone already): free its name; never raises."""
    import ray

    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


def start_cold(
    cluster: ClusterConfig,
    game: str,
    epoch: int,
    host: str,
    node_id: str,
    mirror: dict[str, Any] | None,
    cfg_json: dict[str, Any],
    command: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """A new actor for `game` on `host` (Ray's node `node_id`), its worker started there:
    (actor, what it said). `command`: a command game's program instead (the arguments of
    `WorkerHost.start_command`). max_restarts=0: rlsup owns every restart decision. OSError
    when it did not start (the actor killed)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = (
        actor_class()
        .options(
            name=actor_name(game, epoch),
            namespace=cluster.namespace,
            lifetime="detached",
            max_restarts=0,
            max_concurrency=4,
            num_cpus=cluster.cpus_per_game,
            num_gpus=cluster.gpus_per_game,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote(game, epoch, mirror)
    )
    try:
        started = (
            actor.start.remote(cfg_json)
            if command is None
            else actor.start_command.remote(**command)
        )
        info = ray.get(started, timeout=START_TIMEOUT_S)
    except Exception as exc:
        kill_actor(actor)
        raise OSError(f"cannot start {game} on host {host}: {exc}") from exc
    return actor, info


def stop_leftover_actors(namespace: str, grace_s: float) -> list[str]:
    """Every named actor a predecessor left running: SIGTERM, its final checkpoint mirrored
    within `grace_s`, then killed. Their names (a spare that became a game's: game@epoch)."""
    import ray
    from ray.util import list_named_actors

    names = list_named_actors()
    if not names:
        return []
    actors = {}
    for name in names:
        with contextlib.suppress(Exception):
            actors[name] = ray.get_actor(name, namespace=namespace)
    for actor in actors.values():
        with contextlib.suppress(Exception):
            actor.signal.remote(int(signal.SIGTERM))
    deadline = time.monotonic() + grace_s
    pending = dict(actors)
    seen = {name: name for name in actors}
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
        kill_actor(actor)
    log.info("leftover_actors_stopped", actors=sorted(seen.values()),
             unfinished=sorted(pending))  # fmt: skip
    return sorted(seen.values())


class SpareActors:
    """The Ray calls `RaySpares` makes (spare.py), on the cluster the launcher joined.
    `namespace`: the launcher's configuration in force, asked at each spare's creation."""

    def __init__(self, namespace: Callable[[], str]) -> None:
        self.namespace = namespace

    def create(self, host: str, node_id: str, name: str) -> Any:
        """A spare actor on `host`: no CPU of Ray's accounting (an idle spare is niced and
        single-threaded; the launcher counts each host's games itself, `_choose`)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return (
            actor_class()
            .options(
                name=name,
                namespace=self.namespace(),
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
        kill_actor(actor)
