"""Device truth on the supervisor's side: which games will not get the GPU they could have.

Torch-free (it reads torch's metadata and /proc through `training.torchbuild`), so the daemon
can call it at start. The worker reports the runtime truth itself (its heartbeat's
`torch_build`, which `rlsup status` reads); `rlsup doctor` reports both at length.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from supervisor.config import GameSpec
from training import torchbuild


def cpu_fallback_warnings(games: Iterable[GameSpec]) -> list[tuple[str, dict[str, Any]]]:
    """Each `device = "auto"` game that will train on the CPU although this host has an NVIDIA
    driver (a CPU-only torch is installed), with the detail of its `device_fallback` event:
    reason, torch, driver, fix. Empty without a driver, with a CUDA torch, or with no auto game
    (`device = "cuda"` there is refused by the configuration check instead)."""
    auto = [game.name for game in games if game.device == "auto"]
    if not auto:
        return []
    driver = torchbuild.driver_version()
    if driver is None:
        return []
    build = torchbuild.installed_torch()
    reason = torchbuild.cpu_fallback_reason(driver, build.cuda)
    if reason is None:
        return []
    detail = {
        "reason": reason,
        "torch": build.version,
        "driver": driver,
        "fix": torchbuild.cuda_install_hint(build.public_version),
    }
    return [(name, dict(detail)) for name in auto]
