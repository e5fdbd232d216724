"""Exit codes for scripts: `rlsup run --exit-when-done` fails (1) when a game ended FATAL;
`rlsup status` does not alert (0) on a run that finished cleanly; `rlsup status --done` asks
"did every game finish" (0 yes, 4 a game is FATAL, 5 not yet). A real `rlsup run` on command
games that exit 0 and 78, and the pure exit-code decision."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.runs import env_for, rlsup
from supervisor.commands.status import EXIT_NOT_DONE, done_code, exit_code

pytestmark = pytest.mark.e2e


def doc(state: str, clean: bool, *games: str) -> Any:
    return {
        "supervisor": {"state": state, "clean_stop": clean},
        "games": [{"name": f"g{i}", "state": s, "in_config": True} for i, s in enumerate(games)],
    }


@pytest.mark.parametrize(
    ("document", "code"),
    [
        (doc("running", False, "running", "done"), 0),
        (doc("running", False, "fatal", "done"), 4),
        (doc("stopped", True, "done", "done"), 0),  # finished cleanly: nothing to alert on
        (doc("stopped", True, "done", "fatal"), 3),
        (doc("stopped", True, "done", "stopped"), 3),  # stopped before the end
        (doc("stopped", False, "done", "done"), 3),  # died, even if every game was done
        (doc("stale", False, "done", "done"), 3),
        (doc("absent", False), 3),
    ],
)
def test_status_exit_code(document: Any, code: int) -> None:
    assert exit_code(document) == code


@pytest.mark.parametrize(
    ("document", "code"),
    [
        (doc("stopped", True, "done", "done"), 0),
        (doc("running", False, "done", "done"), 0),
        (doc("running", False, "done", "running"), EXIT_NOT_DONE),
        (doc("stopped", True, "done", "fatal"), 4),
        (doc("absent", False), EXIT_NOT_DONE),
    ],
)
def test_status_done_code(document: Any, code: int) -> None:
    assert done_code(document) == code


HEAD = (
    'state_dir = "state"\nstop_grace_s = 5\ntick_s = 0.05\n'
    "[modes.light]\nnum_envs = 1\nbatch_size = 1\nn_steps = 1\nmax_concurrent = 4\n"
)


def game(name: str, code: int) -> str:
    argv = [sys.executable, "-c", f"raise SystemExit({code})"]
    return f'[[games]]\nname = "{name}"\ncommand = {json.dumps(argv)}\n'


@pytest.mark.timeout(120)
def test_scripts_can_tell_a_finished_run_from_a_failed_one(tmp_path: Path) -> None:
    for case, games, run_code, status_code, done in (
        ("ok", [game("a", 0), game("b", 0)], 0, 0, 0),
        ("bad", [game("a", 0), game("conf", 78)], 1, 3, 4),
    ):
        config = tmp_path / case / "rlsup.toml"
        config.parent.mkdir()
        config.write_text(HEAD + "".join(games))
        env = env_for(config.parent)
        run = rlsup("run", "--exit-when-done", "--config", str(config), env=env, timeout=60)
        assert run.returncode == run_code, run.stderr[-2000:]
        if run_code:
            assert "conf" in run.stderr and "FATAL" in run.stderr
        status = rlsup("status", "--config", str(config), env=env)
        assert status.returncode == status_code, status.stdout
        assert rlsup("status", "--done", "--config", str(config), env=env).returncode == done
