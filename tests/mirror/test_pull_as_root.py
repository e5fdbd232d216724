"""`sudo rlsup pull`: what it writes in the run dir belongs to the state dir's owner (the
service's account), so the service can still use it; and a mirror it cannot reach is one
clear line, not a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.runs import REPO, env_for, write_config
from harness.seaweed import TEST_AWS_ENV
from tests.mirror.endpoints import closed_endpoint
from training.protocol import LOCK_FILE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: it runs as sudo would"),
]
NOBODY = 65534


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another account can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="rlsup-pull-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_pull_as_root_leaves_the_run_dir_to_the_state_dirs_owner(shared_dir: Path) -> None:
    config = write_config(shared_dir, [("g", 1000)])
    state = shared_dir / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)  # the service's account owns its state
    # Held bound (never listening) for the whole run: no other process of a full test run
    # can answer there, so the refusal is certain.
    with closed_endpoint() as endpoint:
        config.write_text(
            config.read_text()
            + f'[mirror]\nurl = "s3://rlsup-test/p"\nendpoint_url = "{endpoint}"\n'
        )
        pull = ["pull", "--config", str(config), "--game", "g"]
        done = subprocess.run(
            [sys.executable, "-m", "supervisor.cli", *pull],
            cwd=REPO,
            env=env_for(shared_dir, **TEST_AWS_ENV, AWS_MAX_ATTEMPTS="1"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "rlsup pull: g:" in done.stderr
    assert endpoint in done.stderr, done.stderr
    for path in (state / "runs", state / "runs" / "g", state / "runs" / "g" / LOCK_FILE):
        if path.exists():
            assert path.stat().st_uid == NOBODY, (
                f"{path} belongs to root: the service cannot use it"
            )
    assert (state / "runs" / "g").exists()
