"""Fixtures of the real-systemd tests: a booted sandbox per test, and rlsup installed in it
as an operator would (see sandbox.py)."""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.systemd.sandbox import Sandbox, game, install, unavailable


@pytest.fixture
def sandbox(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    why = unavailable()
    if why:
        pytest.skip(f"no real systemd here: {why}")
    tag = re.sub(r"[^a-z0-9]", "", request.node.name.removeprefix("test_").lower())[:16]
    box = Sandbox(tmp_path / "sdlab", f"rlsup-{os.getpid()}-{tag}")
    box.boot()
    try:
        # The service account must reach the interpreter: open the way inside the overlay
        # (what an operator does by installing into /opt), never on the host.
        # One shell for every directory (each `sh` enters the sandbox: ~0.2 s apiece). Some
        # are read-only there (a checkout bound in): chmod goes on past them, as before.
        ways = {*Path(sys.executable).resolve().parents, *Path(sys.executable).parents}
        box.sh("chmod o+x " + " ".join(shlex.quote(str(d)) for d in sorted(ways)))
        yield box
    finally:
        if box.sh("systemctl is-active rlsup").stdout.strip() == "active":
            print(box.sh("journalctl -u rlsup --no-pager -n 60").stdout[-6000:])
        done = box.tool("destroy")
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def service(sandbox: Sandbox) -> Iterator[Sandbox]:
    """rlsup installed as a system service (user rlsup), enabled, one game training."""
    install(sandbox, game("cart"))
    yield sandbox
