"""Following a real `rlsup run`: `logs -f` and `events -f` across a worker killed and
restarted, and the supervisor's own log on a (simulated) journal."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from conftest import REPO
from follow import Follow

# tests/cli is no package: the repository root makes the supervisor tests' helpers importable.
sys.path.insert(0, str(REPO))
from harness.runs import (
    env_for,
    kill_quietly,
    start_supervisor,
    training_pid,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
GAME = "cartpole"


def pids_in(lines: list[str]) -> list[int]:
    """The worker pids of the JSON lines, in order of first appearance."""
    seen: list[int] = []
    for line in lines:
        try:
            pid = json.loads(line).get("pid")
        except ValueError:
            continue
        if pid is not None and pid not in seen:
            seen.append(pid)
    return seen


def trained(lines: list[str]) -> list[int]:
    """The pids of the `worker_training` events among these JSON lines."""
    found = [json.loads(ln) for ln in lines]
    return [e["detail"]["pid"] for e in found if e["kind"] == "worker_training"]


def test_followers_see_both_lives_of_a_killed_worker(tmp_path: Path) -> None:
    config = write_config(tmp_path, [(GAME, 10_000_000)])
    state = tmp_path / "state"
    env = env_for(tmp_path)
    cli = [sys.executable, "-m", "supervisor.cli"]
    # Both start before anything exists: they wait for the log and for the database.
    logs = Follow([*cli, "logs", GAME, "-f", "--json", "--config", str(config)], env)
    events = Follow([*cli, "events", "-f", "--json", "--game", GAME, "--config", str(config)], env)
    logs.wait_stderr("waiting for")
    events.wait_stderr("waiting for")

    # The supervisor's stderr is "the journal": JOURNAL_STREAM names that very file.
    journal = tmp_path / "journal"
    journal.touch()
    st = journal.stat()
    sup_env = {**env, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    sup = start_supervisor(config, sup_env, "--log-level", "debug", log=journal)
    try:
        first = wait_for(lambda: training_pid(state, GAME), 120, "the worker training")
        logs.wait_for(lambda got: first in pids_in(got), 60)
        events.wait_for(lambda got: trained(got) == [first], 60)  # recorded before the kill
        kill_quietly(first, signal.SIGKILL)
        second = wait_for(
            lambda: training_pid(state, GAME, not_pid=first), 120, "the restarted worker"
        )
        got = logs.wait_for(lambda got: second in pids_in(got), 60)
        assert pids_in(got) == [first, second]
        # Nothing lost, nothing twice: what it printed is the file, line for line.
        written = (state / "logs" / f"{GAME}.log").read_text().splitlines()
        assert got == written[: len(got)]

        seen = events.wait_for(lambda got: trained(got) == [first, second], 60)
        kinds = [json.loads(ln)["kind"] for ln in seen]
        assert kinds.index("worker_start") < kinds.index("worker_crash") < kinds.index("restart")
        assert {json.loads(ln)["game"] for ln in seen} == {GAME}
    finally:
        os.killpg(sup.pid, signal.SIGTERM)
        assert sup.wait(60) == 0
        assert logs.interrupt() == 0
        assert events.interrupt() == 0

    lines = journal.read_text().splitlines()
    assert lines and all(re.match(r"<[2-7]>\{", ln) for ln in lines), lines[:5]
    crash = [ln for ln in lines if '"event": "worker_crash"' in ln]
    assert crash and all(ln.startswith("<3>") for ln in crash)
    assert any(ln.startswith("<6>") for ln in lines)
