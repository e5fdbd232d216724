"""`rlsup doctor` and the `status` flag: the truth about the device a game trains on.

Real runs here (no GPU, the CPU build of torch; a driver played with the test-only
RLSUP_NVIDIA_DRIVER_PATH), and the diagnosis as a pure function of fakes for what only a GPU
host has: NVML's GPUs and a CUDA torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import REPO, Cli

from harness.state_fixture import StateFixture
from supervisor.commands import doctor
from supervisor.config import load_config
from training import torchbuild
from training.torchbuild import InstalledTorch

pytestmark = pytest.mark.e2e

DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 2024\n"
CPU_TORCH = InstalledTorch("2.13.0+cpu", False)
CUDA_TORCH = InstalledTorch("2.13.0+cu128", True)
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
device = "auto"
[[games]]
name = "acro"
env_id = "Acrobot-v1"
total_steps = 1000
device = "{second}"
"""
A100 = ("GPU-aaaa-1111", "NVIDIA A100-SXM4-80GB", (8, 0))
H100 = ("GPU-bbbb-2222", "NVIDIA H100 80GB HBM3", (9, 0))


def installed_is_cpu() -> bool:
    return torchbuild.installed_torch().cuda is False


def doctor_cli(tmp_path: Path, *args: str, driver: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RLSUP_CONFIG"}
    proc = tmp_path / "nvidia-version"
    if driver:
        proc.write_text(DRIVER)
    env[torchbuild.DRIVER_PATH_ENV] = str(proc)
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "doctor", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


# ---- real runs on this host -------------------------------------------------------------------


@pytest.mark.skipif(not installed_is_cpu(), reason="reports on a host with the CPU torch")
def test_doctor_here_reports_cpu_torch_and_no_gpu_and_exits_0(tmp_path: Path) -> None:
    r = doctor_cli(tmp_path, "--json", driver=False)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["problems"] == [] and doc["config"] is None
    assert doc["torch"]["build"] == "cpu" and doc["torch"]["ok"]
    assert doc["torch"]["cuda"] is None and doc["torch"]["cuda_available"] is False
    assert doc["driver"]["version"] is None and doc["gpus"] == []
    assert doc["python"]["version"] == sys.version.split()[0]
    assert doc["envpool"] and doc["rlsup"]


@pytest.mark.skipif(not installed_is_cpu(), reason="plays a CPU-only torch on a driver host")
def test_doctor_on_a_driver_host_with_cpu_torch_fails_a_cuda_game(tmp_path: Path) -> None:
    config = tmp_path / "rlsup.toml"
    config.write_text(CONFIG.format(second="cuda"))
    r = doctor_cli(tmp_path, "--json", "--config", str(config), driver=True)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    games = {g["name"]: g for g in doc["games"]}
    assert games["cart"]["ok"] and games["cart"]["uses"] == "cpu"
    assert "no CUDA torch" in games["cart"]["note"]
    assert not games["acro"]["ok"] and games["acro"]["uses"] is None
    assert any("game acro" in p and "make torch" in p for p in doc["problems"])
    assert any("no CUDA torch" in w for w in doc["warnings"])
    human = doctor_cli(tmp_path, "--config", str(config), driver=True)
    assert human.returncode == 1
    for text in (
        "driver    550.54.14",
        "cpu build",
        "cart: device = auto -> cpu (no CUDA torch)",
        "acro: device = cuda -> nothing usable",
        "NOT ok",
    ):
        assert text in human.stdout, human.stdout


def test_doctor_imports_no_torch_in_its_own_process() -> None:
    code = (
        "import sys; from supervisor import cli; cli.build_parser(['doctor']); "
        "import supervisor.commands.doctor; "
        "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'envpool')])"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ---- the diagnosis, from fakes ------------------------------------------------------------------


class FakeNvml:
    """The part of pynvml that doctor reads."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[tuple[str, str, tuple[int, int]]], cuda: int = 12040) -> None:
        self.gpus, self.cuda = gpus, cuda

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.14"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 * 2**30, free=60 * 2**30, used=20 * 2**30)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self.gpus[h][2]

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h][0]

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h][1].encode()


class NoDriverNvml(FakeNvml):
    def nvmlInit(self) -> None:
        raise self.NVMLError("Driver Not Loaded")


def cuda_runtime(*gpus: tuple[str, str, tuple[int, int]], arch: str = "sm_80 sm_90") -> dict:
    devices = [
        {"index": i, "name": n, "uuid": u.removeprefix("GPU-"), "capability": f"{c[0]}.{c[1]}"}
        for i, (u, n, c) in enumerate(gpus)
    ]
    return {"ok": True, "version": "2.13.0+cu128", "cuda": "12.8", "cudnn": 91000,
            "cuda_available": bool(devices), "device_count": len(devices),
            "arch_list": arch.split(), "devices": devices}  # fmt: skip


CPU_RUNTIME = {
    "ok": True,
    "version": "2.13.0+cpu",
    "cuda": None,
    "cudnn": None,
    "cuda_available": False,
    "device_count": 0,
    "arch_list": [],
    "devices": [],
}


def diagnose(tmp_path: Path, second: str, nvml: Any, installed: InstalledTorch, runtime: dict):
    config = tmp_path / "rlsup.toml"
    config.write_text(CONFIG.format(second=second))
    return doctor.diagnose(
        config=load_config(config, check_devices=False),
        driver="550.54.14",
        nvml=doctor.nvml_report(nvml),
        installed=installed,
        runtime=runtime,
    )


def test_gpus_with_a_cpu_torch_are_listed_and_not_usable(tmp_path: Path) -> None:
    doc = diagnose(tmp_path, "cuda", FakeNvml([A100, H100]), CPU_TORCH, CPU_RUNTIME)
    assert doc["nvml"]["cuda_driver_version"] == "12.4"
    assert [(g["index"], g["uuid"], g["name"]) for g in doc["gpus"]] == [
        (0, A100[0], A100[1]),
        (1, H100[0], H100[1]),
    ]
    assert doc["gpus"][0]["memory_total_mb"] == 80 * 1024.0
    assert all(not g["torch_usable"] and "no CUDA torch" in g["why"] for g in doc["gpus"])
    assert not doc["ok"] and doc["games"][1]["uses"] is None
    assert doc["games"][0]["uses"] == "cpu" and "no CUDA torch" in doc["games"][0]["note"]


def test_a_cuda_torch_uses_the_gpus_matched_by_uuid(tmp_path: Path) -> None:
    runtime = cuda_runtime(H100, A100)  # torch's order is not NVML's
    doc = diagnose(tmp_path, "cuda", FakeNvml([A100, H100]), CUDA_TORCH, runtime)
    assert doc["ok"] and doc["problems"] == [] and doc["warnings"] == []
    assert [(g["index"], g["torch_index"], g["torch_usable"]) for g in doc["gpus"]] == [
        (0, 1, True),
        (1, 0, True),
    ]
    assert [g["uses"] for g in doc["games"]] == ["cuda", "cuda"]
    text = doctor.render_human(doc)
    assert "1 [torch 0] NVIDIA H100 80GB HBM3 GPU-bbbb-2222, 80.0 GiB (60.0 free)" in text


def test_a_gpu_newer_than_the_torch_kernels_is_not_usable(tmp_path: Path) -> None:
    blackwell = ("GPU-cccc-3333", "NVIDIA B200", (12, 0))
    runtime = cuda_runtime(blackwell)
    doc = diagnose(tmp_path, "cuda", FakeNvml([blackwell]), CUDA_TORCH, runtime)
    assert not doc["gpus"][0]["torch_usable"] and "12.0" in doc["gpus"][0]["why"]
    assert not doc["ok"] and "no usable CUDA device" in doc["problems"][0]
    ptx = cuda_runtime(blackwell, arch="sm_80 sm_90 compute_90")
    assert diagnose(tmp_path, "cuda", FakeNvml([blackwell]), CUDA_TORCH, ptx)["ok"]


def test_a_cuda_torch_that_cannot_initialise_cuda_fails_a_cuda_game(tmp_path: Path) -> None:
    runtime = {**cuda_runtime(), "cuda_available": False}
    doc = diagnose(tmp_path, "cuda", FakeNvml([A100], cuda=12020), CUDA_TORCH, runtime)
    assert "cannot initialise CUDA" in doc["gpus"][0]["why"]
    assert not doc["ok"] and "CUDA unavailable" in doc["problems"][0]


def test_a_driver_without_nvml_is_a_warning(tmp_path: Path) -> None:
    doc = diagnose(tmp_path, "cpu", NoDriverNvml([]), CPU_TORCH, CPU_RUNTIME)
    assert doc["ok"] and doc["nvml"] == {"available": False, "reason": "Driver Not Loaded"}
    assert any("NVML does not answer" in w for w in doc["warnings"])


def test_a_torch_that_does_not_import_is_a_problem(tmp_path: Path) -> None:
    broken = {"ok": False, "error": "ImportError: libcudnn.so.9: cannot open shared object"}
    doc = diagnose(tmp_path, "cpu", FakeNvml([]), CUDA_TORCH, broken)
    assert not doc["ok"] and "libcudnn" in doc["problems"][0]


def test_the_torch_probe_failing_is_reported_not_raised() -> None:
    def crashed(*args: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, -11, stdout="", stderr="Segmentation fault")

    report = doctor.torch_runtime(runner=crashed)
    assert not report["ok"] and "Segmentation fault" in report["error"]


# ---- status: `cpu (no CUDA torch)` ------------------------------------------------------------


def test_status_flags_an_auto_game_on_cpu_of_a_driver_host(cli: Cli, state: StateFixture) -> None:
    hb_path = state.state_dir / "runs" / "pong" / "heartbeat.json"
    hb = json.loads(hb_path.read_text())
    build = {"torch": "2.13.0+cpu", "cuda": None, "cuda_available": False, "driver": "550.54.14"}
    hb.update(device="cpu", torch_build=build, time=time.time())
    hb_path.write_text(json.dumps(hb))
    r = cli("status", "--json")
    games = {g["name"]: g for g in json.loads(r.stdout)["games"]}
    assert games["pong"]["device"] == "cpu"
    assert games["pong"]["device_note"] == "no CUDA torch"
    assert all(g["device_note"] is None for name, g in games.items() if name != "pong")
    assert "cpu (no CUDA torch)" in cli("status").stdout


PRECISION_CONFIG = """\
state_dir = "s"
[modes.light]
num_envs = 4
batch_size = 64
max_concurrent = 4
[[games]]
name = "pong"
env_id = "Pong-v5"
total_steps = 1000
device = "cpu"
[[games]]
name = "pong32"
env_id = "Pong-v5"
total_steps = 1000
device = "cpu"
args = { precision = "fp32" }
[[games]]
name = "cart"
env_id = "CartPole-v1"
total_steps = 1000
device = "cpu"
[[games]]
name = "gpu"
env_id = "Breakout-v5"
total_steps = 1000
device = "cuda"
"""


def test_each_game_says_the_arithmetic_its_worker_will_pick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--precision auto` as the worker resolves it: bf16 for the Atari CNN on a CPU with
    native bf16 (fp32 without), fp32 for MLPs and where asked; on CUDA bf16 on Ampere and
    newer, fp16 on older GPUs (emulated bf16 is slower); none where the game cannot train."""
    config = tmp_path / "rlsup.toml"
    config.write_text(PRECISION_CONFIG)
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setenv(torchbuild.CPUINFO_PATH_ENV, str(cpuinfo))
    v100 = ("GPU-dddd-4444", "Tesla V100-SXM2-32GB", (7, 0))

    def precisions(flags: str, gpus: list[Any], installed: InstalledTorch, runtime: dict) -> dict:
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        doc = doctor.diagnose(
            config=load_config(config, check_devices=False), driver="550.54.14",
            nvml=doctor.nvml_report(FakeNvml(gpus)), installed=installed, runtime=runtime,
        )  # fmt: skip
        return {g["name"]: g["precision"] for g in doc["games"]}

    a100 = precisions("avx512f avx512_bf16", [A100], CUDA_TORCH, cuda_runtime(A100))
    assert a100 == {"pong": "bf16", "pong32": "fp32", "cart": "fp32", "gpu": "bf16"}
    both = cuda_runtime(A100, v100, arch="sm_70 sm_80 sm_90")
    old = precisions("avx512f", [A100, v100], CUDA_TORCH, both)
    assert old == {"pong": "fp32", "pong32": "fp32", "cart": "fp32", "gpu": "fp16"}
    no_nvml = precisions("avx512f", [], CUDA_TORCH, cuda_runtime(H100))  # torch's view stands in
    assert no_nvml["gpu"] == "bf16"
    cpu_only = precisions("avx512_bf16", [A100], CPU_TORCH, CPU_RUNTIME)
    assert cpu_only["gpu"] is None and cpu_only["pong"] == "bf16"
    cpuinfo.write_text("flags\t\t: avx512_bf16\n")
    here = doctor.diagnose(
        config=load_config(config, check_devices=False), driver=None,
        nvml=doctor.nvml_report(NoDriverNvml([])), installed=CPU_TORCH, runtime=CPU_RUNTIME,
    )  # fmt: skip
    text = doctor.render_human(here)
    for line in (
        "pong: device = cpu -> cpu, bf16",
        "pong32: device = cpu -> cpu, fp32",
        "cart: device = cpu -> cpu, fp32",
        "gpu: device = cuda -> nothing usable",
    ):
        assert line in text, text


@pytest.mark.skipif(not installed_is_cpu(), reason="plays a CPU-only torch on a driver host")
def test_doctor_does_not_judge_a_command_game_by_rlsups_torch(tmp_path: Path) -> None:
    """A command game brings its own torch (or none): `device = "cuda"` is no problem on a
    driver host where rlsup's own torch is CPU-only."""
    config = tmp_path / "rlsup.toml"
    config.write_text(
        CONFIG.format(second="cpu")
        + '[[games]]\nname = "mine"\ncommand = ["python", "train.py"]\ndevice = "cuda"\n'
    )
    r = doctor_cli(tmp_path, "--json", "--config", str(config), driver=True)
    assert r.returncode == 0, r.stdout + r.stderr
    mine = {g["name"]: g for g in json.loads(r.stdout)["games"]}["mine"]
    assert (mine["ok"], mine["kind"], mine["uses"], mine["note"]) == (True, "command", None, None)
    human = doctor_cli(tmp_path, "--config", str(config), driver=True)
    assert "mine: device = cuda -> its own program's choice (a command game)" in human.stdout
