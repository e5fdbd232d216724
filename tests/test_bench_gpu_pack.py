"""benchmarks/gpu_pack.py trims envpool for a GPU lease: Atari's and CartPole's engines and
Atari's ROMs stay; every other engine (.so) and asset goes, but `import envpool` still imports
every registration, which reads its package's Python, its tasks' JSON lists and the names in
its asset folders. Checked on a wheel laid out as envpool's (no download)."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks_import import benchmark_module

FILES = {
    "envpool/__init__.py": b"import envpool.entry\n",
    "envpool/atari/__init__.py": b"from .atari_envpool import _AtariEnvPool\n",
    "envpool/atari/atari_envpool.so": b"\x7fELF" + bytes(100),
    "envpool/classic_control/classic_control_envpool.so": b"\x7fELF" + bytes(50),
    "envpool/mujoco/__init__.py": b"from .mujoco_envpool import X\n",
    "envpool/mujoco/dmc/__init__.py": b"from .dmc_envpool import Y\n",
    "envpool/mujoco/dmc/registration.py": b"from .tasks import TASKS\n",
    "envpool/mujoco/dmc/tasks.py": b"TASKS = []\n",
    "envpool/mujoco/dmc/dmc_envpool.so": b"\x7fELF" + bytes(5000),
    "envpool/vizdoom/bin/vizdoom": b"\x7fELF" + bytes(5000),
    "envpool_assets/atari/roms/breakout.bin": b"rom" * 100,
    "envpool_assets/vizdoom/maps/D1_basic.wad": b"wad" * 1000,
    "envpool_assets_mujoco_large/mujoco/myosuite/assets/metadata/tasks.json": b"[]",
    "envpool_assets_mujoco_large/mujoco/myosuite/assets/model.xml": b"<mujoco/>" * 100,
}


@pytest.fixture(scope="module")
def pack() -> Iterator[ModuleType]:
    with benchmark_module("gpu_pack.py", "bench_gpu_pack") as module:
        yield module


def test_the_unpacked_envpool_keeps_atari_and_every_registration(
    pack: ModuleType, tmp_path: Path
) -> None:
    wheel = tmp_path / "envpool-1.2.5-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in FILES.items():
            zf.writestr(name, data)
    site = tmp_path / "site"
    pack.unpack([wheel], site)

    def content(name: str) -> bytes:
        return (site / name).read_bytes()

    kept = [n for n in FILES if n.endswith((".py", ".json", ".bin")) or "atari" in n]
    kept += ["envpool/classic_control/classic_control_envpool.so"]
    for name in kept:
        if name.endswith("__init__.py") and "mujoco" in name:
            continue  # stubbed: below
        assert content(name) == FILES[name], name
    assert not (site / "envpool/mujoco/dmc/dmc_envpool.so").exists()
    assert not (site / "envpool/vizdoom/bin/vizdoom").exists()
    # The packages whose engines left no longer load them on import.
    for init in ("envpool/mujoco/__init__.py", "envpool/mujoco/dmc/__init__.py"):
        assert b"import" not in content(init)
    # A listed folder keeps its names, empty.
    assert content("envpool_assets/vizdoom/maps/D1_basic.wad") == b""
    assert content("envpool_assets_mujoco_large/mujoco/myosuite/assets/model.xml") == b""
