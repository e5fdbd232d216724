"""constraints/torch_build.py and the Makefile: which torch build an install chooses.

No torch is installed here: the choice is checked with a fake `nvidia-smi`, `--dry-run`, and
`make -n`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "constraints" / "torch_build.py"
SMI_HEADER = "| NVIDIA-SMI 550.54.14     Driver Version: 550.54.14     CUDA Version: {cuda}     |\n"

_spec = importlib.util.spec_from_file_location("torch_build", SCRIPT)
assert _spec is not None and _spec.loader is not None
torch_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_build)
PIN = torch_build.torch_pin()


@pytest.mark.parametrize(
    ("cuda", "index"),
    [
        ("12.4", "cu126"),  # older than every 12.x build: minor-version compatibility
        ("12.6", "cu126"),
        ("12.7", "cu126"),
        ("12.8", "cu128"),
        ("12.9", "cu128"),
        ("13.0", "cu130"),
        ("13.2", "cu130"),
    ],
)
def test_the_drivers_cuda_version_picks_the_nearest_index_not_above_it(cuda, index):
    chosen, why = torch_build.choose("auto", SMI_HEADER.format(cuda=cuda))
    assert chosen == f"https://download.pytorch.org/whl/{index}"
    assert f"CUDA {cuda}" in why


def test_a_driver_older_than_every_build_is_an_error_naming_the_way_out():
    with pytest.raises(torch_build.NoBuild, match=r"upgrade the driver.*whl/cpu"):
        torch_build.choose("auto", SMI_HEADER.format(cuda="11.8"))


def test_no_nvidia_smi_means_the_cpu_pin():
    assert torch_build.choose("auto", None)[0] is None


def test_an_nvidia_smi_that_reports_no_cuda_version_falls_back_to_the_pin_and_says_so():
    index, why = torch_build.choose("auto", "")
    assert index is None and "TORCH_INDEX=" in why


def test_an_explicit_index_is_taken_as_given():
    assert torch_build.choose("https://example.invalid/simple", "ignored")[0] == (
        "https://example.invalid/simple"
    )
    assert torch_build.choose("", "ignored")[0] is None


def test_pytorch_indexes_get_the_exact_build_others_the_version():
    assert torch_build.requirement("https://download.pytorch.org/whl/cu128", "2.13.0") == (
        "torch==2.13.0+cu128"
    )
    assert torch_build.requirement("https://download.pytorch.org/whl/cpu/", "2.13.0") == (
        "torch==2.13.0+cpu"
    )
    assert torch_build.requirement("https://mirror.example/simple", "2.13.0") == "torch==2.13.0"


def test_the_pin_is_read_from_the_constraints_file():
    text = (REPO / "constraints" / "cpu-torch.txt").read_text()
    assert f"torch=={PIN}" in text


def run_script(tmp_path: Path, *args: str, cuda: str | None) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if cuda is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nprintf '{SMI_HEADER.format(cuda=cuda)}'\n")
        smi.chmod(0o755)
    path = os.pathsep.join(
        [str(bin_dir)] + [p for p in os.environ["PATH"].split(os.pathsep) if p and
                          not (Path(p) / "nvidia-smi").exists()]
    )  # fmt: skip
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_install_with_a_driver_installs_the_matching_cuda_build_and_prints_why(tmp_path):
    r = run_script(tmp_path, "install", "--dry-run", cuda="12.8")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-4:] == [
        "-q",
        "--index-url",
        "https://download.pytorch.org/whl/cu128",
        f"torch=={PIN}+cu128",
    ]
    assert "the NVIDIA driver supports CUDA 12.8" in r.stderr


def test_install_without_a_driver_leaves_it_to_the_pin(tmp_path):
    r = run_script(tmp_path, "install", "--dry-run", cuda=None)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "no nvidia-smi" in r.stderr


def test_install_with_a_too_old_driver_fails(tmp_path):
    r = run_script(tmp_path, "install", "--dry-run", cuda="11.8")
    assert r.returncode == 2 and "upgrade the driver" in r.stderr


def make_n(*args: str) -> subprocess.CompletedProcess[str]:
    """`make -n ARGS` as from a shell: not as a sub-make of the `make test` that runs this
    suite (its MAKEFLAGS/MAKELEVEL would add "Entering directory" lines)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", "--no-print-directory", "-n", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("target", [".installed-run", ".installed-test"])
def test_the_makefile_chooses_the_build_before_installing_the_project(tmp_path, target):
    venv = tmp_path / "venv"
    r = make_n(
        f"VENV={venv}", "TORCH_INDEX=https://download.pytorch.org/whl/cu128", str(venv / target)
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    build = next(i for i, x in enumerate(lines) if "constraints/torch_build.py install" in x)
    project = next(i for i, x in enumerate(lines) if "-c constraints/cpu-torch.txt -e" in x)
    assert build < project
    assert "--index 'https://download.pytorch.org/whl/cu128'" in lines[build]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_doctor_runs_rlsup_doctor(tmp_path):
    venv = tmp_path / "venv"
    r = make_n(f"VENV={venv}", "CONFIG=/nonexistent.toml", "doctor")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].strip() == f"{venv}/bin/rlsup doctor"
