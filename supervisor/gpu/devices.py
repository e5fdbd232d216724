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
    (`device = "cuda"` there is refused by the configuration check instead). Command games
    never: rlsup's torch is not theirs."""
    # A command game runs its own program, maybe with another torch (or none): what rlsup's
    # torch can do says nothing about it, and it is placed on a GPU as any other.
    auto = [game.name for game in games if game.device == "auto" and game.command is None]
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


def no_driver_refusal(nvml_reason: str) -> str:
    """The FATAL reason of a `device = "cuda"` game on a host with no NVIDIA driver installed
    (NVML's library is missing: no driver is coming, unlike one not loaded yet late at boot),
    naming both ways out. `nvml_reason`: what NVML said."""
    said = nvml_reason.split(" (next try", 1)[0]  # the probe's retry note says nothing here
    return (
        f'device = "cuda", but this host has no NVIDIA driver (NVML: {said}): a CUDA worker '
        "can never start here. Either install the NVIDIA driver (then `rlsup doctor` says "
        'whether torch can use the GPUs), or set device = "auto" (trains on the CPU) or '
        '"cpu" for this game; then restart rlsup'
    )
