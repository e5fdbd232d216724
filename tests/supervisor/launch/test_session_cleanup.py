"""A game is its whole session: what a command's wrapper started (`sh -c "sleep 1000 & sleep
1000 & exec python train.py"`, a forked child holding the run-dir lock) never outlives it:
not a stop, not a crash of its leader, not a `kill -9` of the supervisor and its restart.
Real processes; "nothing left" is checked by session id (/proc/<pid>/stat field 6)."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.runs import (
    env_for,
    events,
    kill_quietly,
    start_supervisor,
    stop_supervisor,
    wait_for,
)
from supervisor.launch import sessions
from supervisor.launch.launcher import Launcher
from training import protocol as P

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
SLEEPER = "import time\ntime.sleep(1000)\n"


def wrapped(script: Path) -> list[str]:
    return ["sh", "-c", f"sleep 1000 & sleep 1000 & exec {PY} {script}"]


def spawn(launcher: Launcher, argv: list[str], tmp: Path):  # type: ignore[no-untyped-def]
    return launcher.spawn(argv, tmp / "game.log", 0.0, cwd=tmp, command=True)


def test_a_stop_reaches_the_whole_group_and_nothing_of_the_session_is_left(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(SLEEPER)
    launcher = Launcher(stop_grace_s=5)
    proc = spawn(launcher, wrapped(tmp_path / "train.py"), tmp_path)
    try:
        wait_for(lambda: len(sessions.members(proc.pid)) == 3, 10, "the wrapper's children")
        launcher.terminate(proc)
        assert proc.wait(10) == -signal.SIGTERM
        launcher.forget(proc)
        assert wait_for(lambda: not sessions.members(proc.pid), 5, "the session empty")
    finally:
        launcher.kill(proc)
        proc.close()


def test_a_leader_that_dies_on_its_own_takes_its_session_with_it(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import time\ntime.sleep(0.5)\nraise SystemExit(3)\n")
    launcher = Launcher(stop_grace_s=5)
    proc = spawn(launcher, wrapped(tmp_path / "train.py"), tmp_path)
    try:
        assert proc.wait(10) == 3
        assert len(sessions.members(proc.pid)) == 2  # the two sleeps, orphaned
        launcher.forget(proc)
        assert not sessions.members(proc.pid)  # killed before the next start may come
    finally:
        launcher.kill(proc)
        proc.close()


CHECKPOINTS_ON_TERM = """
import signal, sys, time
def stop(*_):
    time.sleep(0.5)  # the final checkpoint
    open(sys.argv[1], "w").write("saved")
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
time.sleep(1000)
"""


def test_a_wrappers_child_may_finish_its_checkpoint_after_the_wrapper_died(
    tmp_path: Path,
) -> None:
    """`sh -c "python train.py; echo"`: the shell dies of the SIGTERM at once, its child
    writes its final checkpoint within the grace, and is not killed for the shell's exit."""
    (tmp_path / "train.py").write_text(CHECKPOINTS_ON_TERM)
    saved = tmp_path / "saved"
    launcher = Launcher(stop_grace_s=10)
    argv = ["sh", "-c", f"{PY} {tmp_path / 'train.py'} {saved}; echo done"]
    proc = spawn(launcher, argv, tmp_path)
    try:
        wait_for(lambda: len(sessions.members(proc.pid)) == 2, 10, "the shell's child")
        time.sleep(0.3)  # its handler installed
        launcher.terminate(proc)
        proc.wait(10)
        launcher.forget(proc)
        wait_for(saved.exists, 10, "the child's checkpoint")
        launcher.observe(0.0)
        wait_for(lambda: not sessions.members(proc.pid), 5, "the session empty")
    finally:
        launcher.kill(proc)
        launcher.close()
        proc.close()


def test_the_next_start_waits_for_the_remains_still_writing_their_checkpoint(
    tmp_path: Path,
) -> None:
    """A mode change restarts the game at once: its next worker must wait (no failure) while
    the last one's child writes its final checkpoint, never kill it for the new start."""
    from supervisor.launch.spawn import StillDraining

    (tmp_path / "train.py").write_text(CHECKPOINTS_ON_TERM.replace("0.5", "1.5"))
    saved = tmp_path / "saved"
    launcher = Launcher(stop_grace_s=10)
    argv = ["sh", "-c", f"{PY} {tmp_path / 'train.py'} {saved}; echo done"]
    proc = spawn(launcher, argv, tmp_path)
    nxt = None
    try:
        wait_for(lambda: len(sessions.members(proc.pid)) == 2, 10, "the shell's child")
        time.sleep(0.3)  # its handler installed
        launcher.terminate(proc)
        proc.wait(10)
        launcher.forget(proc)
        with pytest.raises(StillDraining, match="still finishing"):
            spawn(launcher, [PY, "-c", SLEEPER], tmp_path)
        assert not saved.exists() and sessions.members(proc.pid)  # not killed for it
        wait_for(saved.exists, 10, "the child's checkpoint")
        wait_for(lambda: not sessions.members(proc.pid), 5, "the session empty")
        nxt = spawn(launcher, [PY, "-c", SLEEPER], tmp_path)  # now it starts
    finally:
        launcher.kill(proc)
        if nxt is not None:
            launcher.kill(nxt)
            nxt.wait(5)
            nxt.close()
        launcher.close()
        proc.close()


HEAD = """\
state_dir = "state"
checkpoint_every_s = 1
stop_grace_s = 10
tick_s = 0.1
[modes.light]
num_envs = 1
batch_size = 1
n_steps = 1
max_concurrent = 4
[restart]
backoff_base_s = 0.2
backoff_max_s = 0.5
budget = 3
budget_window_s = 600
"""


def game_leader(state: Path, game: str) -> int | None:
    rows = events(state, None, game)
    starts = [e for e in rows if e["kind"] in ("worker_start", "restart")]
    return int(starts[-1]["detail"]["pid"]) if starts else None


def test_a_wrapped_games_children_survive_no_kill_restart_or_stop(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SLEEPER)
    argv = wrapped(tmp_path / "train.py")
    config = tmp_path / "rlsup.toml"
    config.write_text(HEAD + f'[[games]]\nname = "wrapped"\ncommand = {json.dumps(argv)}\n')
    state, env = tmp_path / "state", env_for(tmp_path)
    sup = start_supervisor(config, env)
    try:
        first = wait_for(lambda: game_leader(state, "wrapped"), 30, "the game started")
        wait_for(lambda: len(sessions.members(first)) == 3, 10, "its three processes")
        kill_quietly(sup.pid, signal.SIGKILL)
        sup.wait()
        sup = start_supervisor(config, env)
        second = wait_for(
            lambda: (pid := game_leader(state, "wrapped")) != first and pid, 60, "a new start"
        )
        assert not sessions.members(first), "the old session outlived the restart"
        wait_for(lambda: len(sessions.members(second)) == 3, 10, "the new three")
    finally:
        stop_supervisor(sup)
    assert not sessions.members(second), "the session outlived a clean stop"


LOCKS_AND_FORKS = """
import os, sys, time, rlsup
run = rlsup.attach()
if os.fork() == 0:  # a child (a data loader, a logger) that inherits the run dir's lock
    time.sleep(1000)
    os._exit(0)
step = 0
while True:
    step += 10
    run.heartbeat(step)
    time.sleep(0.02)
    if run.should_stop():
        with run.checkpoint(step) as d:
            (d / "step").write_text(str(step))
        run.exit_stopped()
    if run.resume_count == 0 and step >= 300:
        raise SystemExit(3)  # the first one crashes; its forked child lives on
"""


def test_a_forked_child_holding_the_run_dir_lock_never_blocks_the_next_start(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(LOCKS_AND_FORKS))
    config = tmp_path / "rlsup.toml"
    argv = [PY, str(tmp_path / "train.py")]
    config.write_text(
        HEAD + f'[[games]]\nname = "forks"\ncommand = {json.dumps(argv)}\nheartbeat = true\n'
    )
    state, env = tmp_path / "state", env_for(tmp_path)
    sup = start_supervisor(config, env)
    try:
        wait_for(lambda: events(state, "worker_crash", "forks"), 30, "the first crash")
        second = wait_for(
            lambda: (h := P.read_heartbeat(state / "runs" / "forks")) and h.resume_count == 1 and h,
            20,
            "the restart holding the lock",
        )
        # The supervisor dies: the SDK sees it, checkpoints and exits 75; its child stays.
        kill_quietly(sup.pid, signal.SIGKILL)
        sup.wait()
        wait_for(lambda: sessions.session_of(second.pid) is None, 20, "the SDK's own exit")
        assert sessions.members(second.pid), "the forked child should outlive its parent"
        sup = start_supervisor(config, env)
        wait_for(
            lambda: (h := P.read_heartbeat(state / "runs" / "forks")) and h.resume_count == 2,
            20,
            "the next start, past the lock",
        )
        assert not sessions.members(second.pid)
    finally:
        stop_supervisor(sup)
    assert len(events(state, "worker_crash", "forks")) == 1  # never RunDirLocked
    assert not [e for e in events(state, "fatal", "forks")]
