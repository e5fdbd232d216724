"""The supervisor's side of the device truth: `device = "cuda"` on a host with an NVIDIA driver
and a CPU-only torch is a configuration error naming the fix; `device = "auto"` there is a
warning (the `device_fallback` detail), never a silent CPU run. Torch is never imported."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from harness.runs import FakeNvml
from supervisor.config import ConfigError, load_config
from supervisor.daemon import Supervisor
from supervisor.gpu import devices
from supervisor.launch.launcher import Launcher
from supervisor.ledger import db
from training import torchbuild
from training.torchbuild import InstalledTorch

pytestmark = pytest.mark.e2e

CONFIG = """\
state_dir = "s"
[modes.light]
num_envs = 4
batch_size = 64
max_concurrent = 2
[[games]]
name = "cart"
env_id = "CartPole-v1"
total_steps = 1000
device = "{first}"
[[games]]
name = "acro"
env_id = "Acrobot-v1"
total_steps = 1000
device = "{second}"
"""
DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 2024\n"
CPU_TORCH = InstalledTorch("2.13.0+cpu", False)
CUDA_TORCH = InstalledTorch("2.13.0+cu128", True)


def write(tmp_path: Path, first: str, second: str = "cpu", extra: str = "") -> Path:
    path = tmp_path / "rlsup.toml"
    path.write_text(CONFIG.format(first=first, second=second) + extra)
    return path


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Plays the host: `host(driver=True, torch=CPU_TORCH)`."""

    def play(*, driver: bool, torch: InstalledTorch) -> None:
        proc = tmp_path / "nvidia-version"
        if driver:
            proc.write_text(DRIVER)
        monkeypatch.setenv(torchbuild.DRIVER_PATH_ENV, str(proc))
        monkeypatch.setattr(torchbuild, "installed_torch", lambda: torch)

    return play


def test_cuda_with_a_driver_and_cpu_torch_is_a_config_error_naming_the_fix(tmp_path, host):
    host(driver=True, torch=CPU_TORCH)
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "cpu", "cuda"))
    message = str(info.value)
    assert "games[1].device" in message and "line 15" in message
    assert "torch 2.13.0+cpu (CPU-only build)" in message and "550.54.14" in message
    assert "make torch" in message and "https://download.pytorch.org/whl/cu128" in message
    assert 'device = "auto"' in message


def test_cuda_with_a_cuda_torch_loads(tmp_path, host):
    host(driver=True, torch=CUDA_TORCH)
    assert load_config(write(tmp_path, "cuda")).games[0].device == "cuda"


def test_cuda_without_a_driver_is_left_to_the_worker(tmp_path, host):
    host(driver=False, torch=CPU_TORCH)
    assert load_config(write(tmp_path, "cuda")).games[0].device == "cuda"


def test_doctor_can_load_the_config_without_the_device_check(tmp_path, host):
    host(driver=True, torch=CPU_TORCH)
    cfg = load_config(write(tmp_path, "cuda"), check_devices=False)
    assert cfg.games[0].device == "cuda"


def test_the_check_reads_nothing_when_no_game_asks_for_cuda(tmp_path, monkeypatch):
    def boom() -> None:
        raise AssertionError("read torch's metadata for a config without cuda")

    monkeypatch.setattr(torchbuild, "installed_torch", boom)
    monkeypatch.setattr(torchbuild, "driver_version", boom)
    assert len(load_config(write(tmp_path, "auto", "cpu")).games) == 2


def test_auto_on_a_driver_host_with_cpu_torch_is_a_warning_per_auto_game(tmp_path, host):
    host(driver=True, torch=CPU_TORCH)
    cfg = load_config(write(tmp_path, "auto", "cpu"))
    warnings = devices.cpu_fallback_warnings(cfg.games)
    assert [game for game, _ in warnings] == ["cart"]
    detail = warnings[0][1]
    assert detail["reason"] == "no CUDA torch"
    assert (detail["torch"], detail["driver"]) == ("2.13.0+cpu", "550.54.14")
    assert "make torch" in detail["fix"]


@pytest.mark.parametrize(
    ("driver", "torch"), [(False, CPU_TORCH), (True, CUDA_TORCH)], ids=["no-driver", "cuda-torch"]
)
def test_no_fallback_warning_when_the_cpu_is_all_there_is_or_cuda_works(
    tmp_path, host, driver, torch
):
    host(driver=driver, torch=torch)
    assert devices.cpu_fallback_warnings(load_config(write(tmp_path, "auto")).games) == []


def test_the_supervisor_records_one_device_fallback_per_auto_game_at_start(
    tmp_path, host, monkeypatch
):
    host(driver=True, torch=CPU_TORCH)
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    launcher = Launcher(python=sys.executable, module="tests.supervisor.fake_worker")
    sup = Supervisor(
        load_config(write(tmp_path, "auto", "cpu")),
        launcher=launcher,
        cores=2,
        gpu_probe=FakeNvml(None),  # type: ignore[arg-type]
        policy=None,
    )
    try:
        sup.start()  # no tick: no worker is spawned
        assert sup.on.conn is not None
        fallbacks = db.events(sup.on.conn, kind="device_fallback")
    finally:
        sup.close()
        for s, h in saved.items():
            signal.signal(s, h)
    assert [(e.game, e.detail["reason"]) for e in fallbacks] == [("cart", "no CUDA torch")]
    assert fallbacks[0].detail["torch"] == "2.13.0+cpu"


def test_a_command_game_does_not_depend_on_rlsups_own_torch(tmp_path, host):
    """Its program brings its own torch (or none): on a driver host with rlsup's CPU-only
    torch, `device = "cuda"` loads and `device = "auto"` is no CPU fallback."""
    host(driver=True, torch=CPU_TORCH)
    path = tmp_path / "rlsup.toml"
    path.write_text(
        CONFIG.split("[[games]]")[0]
        + '[[games]]\nname = "mine"\ncommand = ["python", "train.py"]\ndevice = "cuda"\n'
        + '[[games]]\nname = "yours"\ncommand = ["python", "train.py"]\ndevice = "auto"\n'
    )
    cfg = load_config(path)
    assert [g.device for g in cfg.games] == ["cuda", "auto"]
    assert devices.cpu_fallback_warnings(cfg.games) == []
