"""Choose the torch build for this host, and install it: the Makefile's bootstrap runs this.

    python constraints/torch_build.py choose  [--index INDEX]   # print the choice, install nothing
    python constraints/torch_build.py install [--index INDEX] [--dry-run]

INDEX (the Makefile's TORCH_INDEX):
  auto (default)  without `nvidia-smi`: nothing to do here; the project install that follows
                  pins torch with cpu-torch.txt (the CPU build: the local wheel where pip's
                  find-links has one, as on CI and the developers' machines).
                  with `nvidia-smi`: the CUDA version its header reports ("CUDA Version: 12.8")
                  picks PyTorch's wheel index: the newest cuXY not above it (same major), else
                  the oldest of the same major (CUDA minor-version compatibility); a driver
                  older than every index is an error that says what to do.
  "" (empty)      the version pin only (as auto without nvidia-smi).
  URL             that index: torch==<pin>+<label> where the URL ends in /cpu or /cuXYZ
                  (PyTorch's), else torch==<pin>.

The torch version is always the one cpu-torch.txt pins, whichever the build, so every host
trains with the same torch. Stdlib only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

PYTORCH_INDEX = "https://download.pytorch.org/whl"
# PyTorch's CUDA wheel indexes for the torch that cpu-torch.txt pins (oldest first): update
# both together.
CUDA_INDEXES: tuple[tuple[int, int], ...] = ((12, 6), (12, 8), (13, 0))
CONSTRAINTS = Path(__file__).with_name("cpu-torch.txt")
_CUDA_RE = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")


class NoBuild(Exception):
    """No torch build fits this host; str() says what to do."""


def torch_pin(constraints: Path = CONSTRAINTS) -> str:
    """The pinned version ("2.13.0") from the constraints file's `torch==` line."""
    for line in constraints.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"\s*torch\s*==\s*([^\s#;+]+)\s*(#.*)?", line)
        if match:
            return match.group(1)
    raise NoBuild(f"{constraints}: no torch== line")


def driver_cuda(smi_output: str) -> tuple[int, int] | None:
    """The CUDA version the driver supports, from `nvidia-smi`'s header."""
    match = _CUDA_RE.search(smi_output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def nvidia_smi() -> str | None:
    """`nvidia-smi`'s output; None when it is not installed, "" when it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def cuda_index_for(cuda: tuple[int, int]) -> tuple[str, str]:
    """(index URL, why) for a driver supporting CUDA `cuda`."""
    same_major = [v for v in CUDA_INDEXES if v[0] == cuda[0]]
    fitting = [v for v in same_major if v <= cuda]
    have = f"the NVIDIA driver supports CUDA {cuda[0]}.{cuda[1]}"
    if fitting:
        chosen, why = fitting[-1], f"{have}: the newest CUDA build not above it"
    elif same_major:
        chosen = same_major[0]
        why = f"{have}: the oldest CUDA {cuda[0]} build (CUDA minor-version compatibility)"
    else:
        builds = ", ".join(f"{a}.{b}" for a, b in CUDA_INDEXES)
        raise NoBuild(
            f"{have}, and this torch is built for CUDA {builds} only: upgrade the driver, or "
            f"choose a build yourself (make TORCH_INDEX={PYTORCH_INDEX}/cpu ...)"
        )
    return f"{PYTORCH_INDEX}/cu{chosen[0]}{chosen[1]}", why


def choose(index: str, smi: str | None) -> tuple[str | None, str]:
    """(index URL or None for the pin only, why) for TORCH_INDEX=`index`."""
    if index != "auto":
        return (index or None), f"TORCH_INDEX={index or '(empty)'}"
    if smi is None:
        return None, "no nvidia-smi: the CPU build, pinned by constraints/cpu-torch.txt"
    cuda = driver_cuda(smi)
    if cuda is None:
        return None, (
            "nvidia-smi is installed but reports no CUDA version (is the driver loaded?): the "
            f"CPU build; set TORCH_INDEX={PYTORCH_INDEX}/cu128 (say) to choose a CUDA build"
        )
    return cuda_index_for(cuda)


def requirement(index: str | None, version: str) -> str:
    """`torch==2.13.0+cu128` for PyTorch's /cpu and /cuXYZ indexes: the exact build, which
    also replaces another build of the same version; `torch==2.13.0` otherwise."""
    label = re.search(r"/(cpu|cu\d+)/?$", index or "")
    return f"torch=={version}+{label.group(1)}" if label else f"torch=={version}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("choose", "install"))
    parser.add_argument("--index", default="auto", help="auto | '' | an index URL")
    parser.add_argument("--constraints", type=Path, default=CONSTRAINTS)
    parser.add_argument("--dry-run", action="store_true", help="print the pip command only")
    args = parser.parse_args(argv)
    try:
        version = torch_pin(args.constraints)
        index, why = choose(args.index.strip(), nvidia_smi() if args.index == "auto" else None)
    except NoBuild as exc:
        print(f"torch: {exc}", file=sys.stderr)
        return 2
    req = requirement(index, version)
    where = f"from {index}" if index else "with the version pin"
    print(f"torch: {req} {where} ({why})", file=sys.stderr)
    if args.action == "choose":
        print(index or "")
        return 0
    if index is None:  # the project's install applies the pin
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--index-url", index, req]
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
