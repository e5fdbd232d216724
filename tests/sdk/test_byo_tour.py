"""The own-trainer tour as a newcomer runs it (docs/own-trainer.md): a fresh virtual environment
of their own (none of rlsup's dependencies in it), `rlsup init --example byo`, the command
pointed at that venv's python, `rlsup check-config`, `rlsup run`, kill the script mid-run, and
it resumes from its checkpoint rather than from zero; then it finishes and
`rlsup run --exit-when-done` exits 0. Real supervisor, real interpreter, real script."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.runs import (
    env_for,
    events,
    heartbeat,
    kill_quietly,
    start_supervisor,
    stop_supervisor,
    training_pid,
    wait_for,
)
from supervisor.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def committed_step(state: Path) -> int:
    ckpts = sorted((state / "runs" / "mine" / "checkpoints").glob("ckpt-*"))
    return int(ckpts[-1].name.split("-")[1]) if ckpts else 0


def fresh_venv(where: Path) -> Path:
    """`python3 -m venv` from the base interpreter: the standard library and nothing else."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    python = where / "bin" / "python"
    probe = "import importlib.util as u; print(u.find_spec('structlog') is None)"
    assert subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout == "True\n"
    return python


def test_the_byo_example_resumes_after_a_kill_in_its_tour(tmp_path: Path) -> None:
    config = tmp_path / "rlsup.toml"
    assert main(["init", "--example", "byo", str(config)]) == 0
    python = fresh_venv(tmp_path / "agent-venv")
    text = config.read_text().replace(json.dumps(sys.executable), json.dumps(str(python)), 1)
    assert str(python) in text
    config.write_text(text)
    assert main(["check-config", "--config", str(config)]) == 0
    state = tmp_path / "state"
    sup = start_supervisor(config, env_for(tmp_path), "--exit-when-done")
    try:
        # Killed once its first periodic checkpoint is in (a few seconds into a ~30 s run).
        wait_for(lambda: committed_step(state) > 0, 60, "a periodic checkpoint")
        pid = wait_for(lambda: training_pid(state, "mine"), 30, "the script training")
        kill_quietly(pid, signal.SIGKILL)
        at_kill = committed_step(state)
        hb = wait_for(
            lambda: (h := heartbeat(state, "mine")) and h["pid"] != pid and h["global_step"] and h,
            60,
            "the script training again",
        )
        assert hb["resumed_from_step"] is not None and hb["resumed_from_step"] >= at_kill > 0
        assert sup.wait(120) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        stop_supervisor(sup)
    [done] = events(state, "game_done", "mine")
    assert json.loads((state / "runs" / "mine" / "heartbeat.json").read_text())["global_step"] >= (
        200_000
    ), done
