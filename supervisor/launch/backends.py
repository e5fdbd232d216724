"""Which launcher runs the workers: `[cluster] backend` = "local" (this host, with its warm
spare) or "ray" (the hosts of a Ray cluster; Ray is imported only then)."""

from __future__ import annotations

import sys

from supervisor.config import Config
from supervisor.launch.launcher import Launcher, LauncherSeam
from supervisor.launch.spare import SpareKeeper
from supervisor.launch.spawn import WORKER_MODULE


def make_launcher(cfg: Config) -> LauncherSeam:
    """The launcher of `[cluster] backend`: this host (with its spare), or a Ray cluster's."""
    if cfg.cluster.backend == "ray":
        from supervisor.launch.ray import RayLauncher  # imports Ray: only for this backend

        return RayLauncher(cfg)
    keeper = SpareKeeper(
        sys.executable,
        WORKER_MODULE,
        warm_timeout_s=cfg.watchdog.startup_grace_s,
        silent_after_s=cfg.watchdog.hang_timeout_s,
    )
    return Launcher(spare=keeper, stop_grace_s=cfg.stop_grace_s)
