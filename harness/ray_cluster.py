"""A real Ray cluster on loopback for the several-hosts tests: `ray.cluster_utils.Cluster` with a
head that places nothing (num_cpus 0, no dashboard) and N hosts labelled as `rlsup join` labels
them (name, boot id), each with its own RLSUP_NODE_DIR, one CPU, a small object store, and
short health checks so that a removed node is declared dead within seconds."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from supervisor.launch.ray import BOOT_LABEL, HOST_LABEL
from supervisor.launch.ray.host import NODE_DIR_ENV
from supervisor.launch.spawn import process_argv

STORE = 80 << 20
FAST_HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 4,
}


@dataclass
class LoopbackCluster:
    cluster: Any
    root: Path
    env: dict[str, str]
    nodes: dict[str, Any] = field(default_factory=dict)  # host -> ray node

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def node_dir(self, host: str) -> Path:
        return self.root / host

    def add_host(self, host: str, boot: int = 1) -> None:
        self.nodes[host] = self.cluster.add_node(
            num_cpus=1,
            object_store_memory=STORE,
            labels={HOST_LABEL: host, BOOT_LABEL: f"boot-{host}-{boot}"},
            env_vars={**self.env, NODE_DIR_ENV: str(self.node_dir(host)), "RLSUP_HOST": host},
        )

    def kill_host(self, host: str) -> None:
        """The host dies: every process of its node at once, no goodbye. Its raylet, the
        actors under it and their workers and standbys are frozen first (SIGSTOP: none of
        them reports anything from then on, as none would from a host that lost its power),
        then Ray's node is removed and all of them SIGKILLed. The workers (each in a session
        of its own) and idle spares would outlive the node on one machine, so they are
        found by their run dirs too."""
        node = self.nodes.pop(host)
        doomed: dict[int, psutil.Process] = {}
        for infos in node.all_processes.values():
            for info in infos:
                with contextlib.suppress(psutil.Error, AttributeError):
                    top = psutil.Process(info.process.pid)
                    for p in [top, *top.children(recursive=True)]:
                        doomed[p.pid] = p
        here = str(self.node_dir(host)) + os.sep
        for p in psutil.process_iter(["cmdline", "cwd"]):
            cmd = process_argv(p.info["cmdline"] or [])
            cwd = str(p.info["cwd"] or "") + os.sep
            if "training.worker" in cmd and (
                cwd.startswith(here) or any(c.startswith(here) for c in cmd)
            ):
                doomed[p.pid] = p
        for p in _command_games(self.node_dir(host)):
            doomed[p.pid] = p
        for p in doomed.values():
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGSTOP)
        self.cluster.remove_node(node, allow_graceful=False)
        for p in doomed.values():
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)


def _ray_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "ray" in cmd and ("raylet" in cmd or "gcs_server" in cmd or "ray::" in cmd):
            out.append(p)
    return out


@contextlib.contextmanager
def loopback_cluster(
    root: Path, hosts: list[str], env: dict[str, str]
) -> Iterator[LoopbackCluster]:
    from ray.cluster_utils import Cluster

    before = {p.pid for p in _ray_processes()}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": STORE,
            "_system_config": FAST_HEALTH,
        },
    )
    lc = LoopbackCluster(cluster, root, env)
    try:
        for host in hosts:
            lc.add_host(host)
        yield lc
    finally:
        with contextlib.suppress(Exception):
            cluster.shutdown()
        # Nothing left behind: Ray's own processes of this cluster, and any worker of ours.
        for p in _ray_processes():
            if p.pid not in before:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)
        for p in psutil.process_iter(["cmdline"]):
            cmd = process_argv(p.info["cmdline"] or [])
            if "training.worker" in cmd and any(str(root) in c for c in cmd):
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)
        for p in _command_games(root):
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)


def _command_games(root: Path) -> list[psutil.Process]:
    """Live command games (started by a host's actor) whose run dir lies under `root`."""
    here = str(root) + os.sep
    out = []
    for p in psutil.process_iter(["status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error):
            if (p.environ().get("RLSUP_RUN_DIR") or "").startswith(here):
                out.append(p)
    return out


def command_processes(root: Path, game: str) -> list[psutil.Process]:
    """Live processes of the command game `game` on any loopback host: its program (or, for
    its first moments, the host's check and restore before it: the same process)."""
    out = []
    for p in _command_games(root):
        with contextlib.suppress(psutil.Error):
            if p.environ()["RLSUP_RUN_DIR"].endswith(f"/runs/{game}"):
                out.append(p)
    return out


def worker_processes(root: Path, game: str) -> list[psutil.Process]:
    """Live training workers of `game` on any loopback host (their run dirs lie under root)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        # A worker that began as a host's spare carries its command line as one string.
        cmd = process_argv(p.info["cmdline"] or [])
        if (
            "training.worker" in cmd
            and any(c.startswith(str(root)) and c.endswith(f"/runs/{game}") for c in cmd)
            and p.info["status"] != psutil.STATUS_ZOMBIE
        ):
            out.append(p)
    return out


def python_env(base: dict[str, str]) -> dict[str, str]:
    """What the hosts' raylets (and so the actors and workers) need from the test's env."""
    keep = (
        "PYTHONPATH",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_EC2_METADATA_DISABLED",
    )
    out = {k: base[k] for k in keep if k in base}
    out["RAY_USAGE_STATS_ENABLED"] = "0"
    out.setdefault("PYTHONPATH", os.pathsep.join(sys.path))
    return out


class MostAtOnce:
    """Samples `count()` every `poll_s` until stopped: the most seen at once (a game's live
    processes on every host: never two of one game)."""

    def __init__(self, count: Callable[[], int], poll_s: float) -> None:
        self.count, self.poll_s, self.most = count, poll_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, self.count())
            self._stop.wait(self.poll_s)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.most
