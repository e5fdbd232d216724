"""Fixtures of the CLI tests: a built state directory and a runner of `python -m supervisor.cli`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.state_fixture import StateFixture, build_state

REPO = Path(__file__).resolve().parents[2]
Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(autouse=True)
def _followers_killed() -> Iterator[None]:
    """No `-f` follower outlives its test, whether the test passed or not."""
    from follow import Follow

    yield
    Follow.kill_all()


@pytest.fixture
def state(tmp_path: Path) -> StateFixture:
    return build_state(tmp_path / "site", n_games=6, n_events=2_000, cost_per_hour=0.9)


@pytest.fixture
def cli(state: StateFixture) -> Cli:
    """Run `rlsup ARGS...` in a subprocess against the fixture (its config unless given)."""

    def run(
        *args: str, config: bool = True, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "supervisor.cli", *args]
        if config:
            argv += ["--config", str(state.config)]
        return subprocess.run(
            argv, cwd=REPO, env=env or state.env(), capture_output=True, text=True, timeout=timeout
        )

    return run
