"""`supervisor` is this project's package (PyPI's supervisord also ships one), and the CLI
stays light: importing it loads no torch, numpy or envpool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import supervisor
from harness.runs import REPO

pytestmark = pytest.mark.e2e


def test_supervisor_package_is_rlsups() -> None:
    assert getattr(supervisor, "RLSUP_SUPERVISOR", False) is True
    assert Path(supervisor.__file__).resolve().parent == REPO / "supervisor"


def test_cli_and_daemon_import_no_heavy_modules() -> None:
    code = (
        "import sys, supervisor.cli, supervisor.daemon, supervisor.cli as c; c.build_parser();"
        "bad = [m for m in ('torch', 'numpy', 'envpool') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def test_help_works_for_every_subcommand() -> None:
    from supervisor.cli import COMMANDS

    for name, _ in COMMANDS:
        out = subprocess.run(
            [sys.executable, "-m", "supervisor.cli", name, "--help"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, (name, out.stderr)
