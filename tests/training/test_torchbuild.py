"""training.torchbuild: the torch build and the NVIDIA driver, told without importing torch;
and the worker's side of the device truth (its heartbeat's `torch_build`, a loud CPU fallback,
`--device cuda` refused with the fix)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from workerutil import REPO, worker_cmd

from training import torchbuild
from training.torchbuild import InstalledTorch, build_of, cpu_fallback_reason, driver_version

pytestmark = pytest.mark.e2e

PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n"
CPU_TORCH = torch.version.cuda is None
CARTPOLE_PPO = (
    "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "64",
    "--batch-size", "64", "--threads", "1", "--eval-episodes", "1",
)  # fmt: skip


def fake_driver(tmp_path: Path, text: str = PROPRIETARY) -> Path:
    path = tmp_path / "nvidia-version"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "version"), [(PROPRIETARY, "550.54.14"), (OPEN, "570.86.15")])
def test_driver_version_is_read_from_the_proc_file(tmp_path, monkeypatch, text, version):
    monkeypatch.setenv(torchbuild.DRIVER_PATH_ENV, str(fake_driver(tmp_path, text)))
    assert driver_version() == version


def test_no_driver_file_means_no_driver(tmp_path, monkeypatch):
    monkeypatch.setenv(torchbuild.DRIVER_PATH_ENV, str(tmp_path / "absent"))
    assert driver_version() is None


def test_a_driver_file_without_a_version_is_still_a_driver(tmp_path, monkeypatch):
    monkeypatch.setenv(torchbuild.DRIVER_PATH_ENV, str(fake_driver(tmp_path, "garbage\n")))
    assert driver_version() == "unknown"


@pytest.mark.parametrize(
    ("version", "ships_lib", "cuda"),
    [
        ("2.13.0+cpu", True, False),  # the label wins over whatever is on disk
        ("2.13.0+cu128", False, True),
        ("2.13.0+rocm6.2", False, False),
        ("2.13.0", True, True),  # PyPI's Linux wheel: unlabelled, ships libtorch_cuda.so
        ("2.13.0", False, False),
    ],
)
def test_build_of_reads_the_local_label_then_the_shipped_library(version, ships_lib, cuda):
    assert build_of(version, lambda: ships_lib) == InstalledTorch(version, cuda)


def test_installed_torch_agrees_with_the_torch_that_imports():
    build = torchbuild.installed_torch()
    assert build.version == torch.__version__
    assert build.cuda == (torch.version.cuda is not None)
    assert build.public_version == torch.__version__.split("+")[0]


def test_cpu_fallback_reason_only_on_a_host_with_a_driver():
    assert cpu_fallback_reason(None, False) is None
    assert cpu_fallback_reason("550.54.14", False) == "no CUDA torch"
    assert cpu_fallback_reason("550.54.14", True, False) == "CUDA unavailable"
    assert cpu_fallback_reason("550.54.14", True, True) is None


def test_the_install_hint_names_make_torch_and_the_exact_cuda_build():
    hint = torchbuild.cuda_install_hint("2.13.0")
    assert "make torch" in hint
    assert "--index-url https://download.pytorch.org/whl/cu128 torch==2.13.0+cu128" in hint


def test_importing_torchbuild_loads_no_torch():
    code = "import sys, training.torchbuild as t; t.driver_version(); t.installed_torch(); "
    code += "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')])"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_the_runtime_probe_prints_one_json_document(tmp_path):
    env = {**os.environ, torchbuild.DRIVER_PATH_ENV: str(fake_driver(tmp_path))}
    r = subprocess.run(
        [sys.executable, "-m", "training.torchbuild"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["version"] == torch.__version__
    assert report["cuda"] == torch.version.cuda and report["driver"] == "550.54.14"
    assert report["cuda_available"] == torch.cuda.is_available()


# ---- the worker -----------------------------------------------------------------------------


def run_worker(run_dir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        worker_cmd(run_dir, *CARTPOLE_PPO, *args),
        cwd=REPO, env={**os.environ, "PYTHONWARNINGS": "ignore", **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.skipif(not CPU_TORCH, reason="plays a CPU-only torch on a driver host")
def test_auto_on_a_driver_host_with_cpu_torch_trains_on_cpu_and_says_so(tmp_path):
    env = {torchbuild.DRIVER_PATH_ENV: str(fake_driver(tmp_path))}
    r = run_worker(tmp_path / "run", env, "--device", "auto", "--total-steps", "512")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "cpu_fallback" in r.stderr and "no CUDA torch" in r.stderr
    hb = json.loads((tmp_path / "run" / "heartbeat.json").read_text())
    assert hb["device"] == "cpu"
    assert hb["torch_build"] == {
        "torch": torch.__version__,
        "cuda": None,
        "cuda_available": False,
        "driver": "550.54.14",
    }


@pytest.mark.skipif(not CPU_TORCH, reason="plays a CPU-only torch on a driver host")
def test_device_cuda_with_cpu_torch_on_a_driver_host_exits_78_naming_the_fix(tmp_path):
    env = {torchbuild.DRIVER_PATH_ENV: str(fake_driver(tmp_path))}
    r = run_worker(tmp_path / "run", env, "--device", "cuda", "--total-steps", "512")
    assert r.returncode == 78, r.stderr[-2000:]
    error = json.loads((tmp_path / "run" / "error.json").read_text())
    assert "CPU-only build" in error["message"] and "make torch" in error["message"]
