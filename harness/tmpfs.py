"""A small tmpfs for a test that needs a real ENOSPC: mounted at `path`, unmounted after; the
test is skipped where it cannot be mounted (not root, or no mount in this sandbox)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str) -> Iterator[Path]:
    """`options`: mount's -o, e.g. "size=1m" or "size=2m,mode=0700"."""
    if os.geteuid() != 0:
        pytest.skip("a real ENOSPC needs root to mount a tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
