"""What a command game's death is told as: a signal by its name (not its stderr's info lines),
a traceback from its first line through the exception line, the exception named in the FATAL
reason; and an ImportError at start-up ends the game FATAL at once (a later one is a crash)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.runs import env_for, events, rlsup
from supervisor.config import load_config
from supervisor.launch import spawn as sp
from supervisor.lifecycle.exits import Route, WorkerExit, route_exit
from supervisor.lifecycle.restart import ExitKind, classify_exit
from supervisor.lifecycle.states import WorkerState
from training.protocol import Heartbeat

pytestmark = pytest.mark.e2e

CONFIG = """\
state_dir = "state"
[modes.light]
num_envs = 1
batch_size = 1
n_steps = 1
max_concurrent = 4
[[games]]
name = "mine"
command = ["python", "train.py"]
"""
INFO = "".join(f'{{"event": "step", "step": {i}, "level": "info"}}\n' for i in range(200))
FRAMES = "".join(f'  File "/x/train.py", line {i}, in f{i}\n    f{i + 1}()\n' for i in range(80))
TRACEBACK = "Traceback (most recent call last):\n" + FRAMES + "ValueError: boom at step 7\n"
IMPORT = (
    "Traceback (most recent call last):\n"
    '  File "/x/train.py", line 1, in <module>\n'
    "    import rlsup\n"
    '  File "/x/rlsup/__init__.py", line 3, in <module>\n'
    "    import structlog\n"
    "ModuleNotFoundError: No module named 'structlog'\n"
)


def mine(tmp_path: Path, log_text: str):  # type: ignore[no-untyped-def]
    (tmp_path / "rlsup.toml").write_text(CONFIG)
    cfg = load_config(tmp_path / "rlsup.toml")
    cfg.logs_dir.mkdir(parents=True)
    (cfg.logs_dir / "mine.log").write_text(log_text)
    return cfg, cfg.game("mine")


def test_a_sigkilled_command_game_is_told_by_its_signal_not_its_info_lines(
    tmp_path: Path,
) -> None:
    cfg, spec = mine(tmp_path, INFO)
    error = sp.worker_error(cfg, spec, 123, -9)
    assert error is not None and error["message"] == "killed by signal 9 (SIGKILL)"


def test_a_traceback_is_shown_from_its_first_line_through_the_exception(tmp_path: Path) -> None:
    cfg, spec = mine(tmp_path, INFO + TRACEBACK)
    error = sp.worker_error(cfg, spec, 123, 1)
    assert error is not None
    lines = error["message"].splitlines()
    assert lines[0] == "Traceback (most recent call last):", lines[:3]
    assert lines[-1] == "ValueError: boom at step 7"
    assert error["exception"] == "ValueError: boom at step 7"
    assert len(error["message"]) <= 4096
    assert '"event": "step"' not in error["message"]


def test_an_import_error_as_last_words_is_recognised(tmp_path: Path) -> None:
    cfg, spec = mine(tmp_path, "starting\n" + IMPORT)
    error = sp.worker_error(cfg, spec, 123, 1)
    assert error is not None and error["kind"] == "import_error"
    assert error["exception"] == "ModuleNotFoundError: No module named 'structlog'"
    # The same traceback followed by more output is no start-up failure of the interpreter.
    (cfg.logs_dir / "mine.log").write_text(IMPORT + "retrying without it\n")
    assert sp.worker_error(cfg, spec, 123, 1)["kind"] == "command_exit"  # type: ignore[index]


def beat(step: int) -> Heartbeat:
    return Heartbeat(
        seq=1, pid=1, phase="training", phase_deadline_s=0.0, global_step=step,
        total_steps=10, episodes=0, sps=0.0, mean_return=None, last_checkpoint_step=None,
        resumed_from_step=None, num_envs=1, batch_size=1, device="cpu", gpu_mem_mb=None,
    )  # fmt: skip


IMPORT_ERROR = {
    "kind": "import_error",
    "message": IMPORT.strip(),
    "exception": "ModuleNotFoundError: No module named 'structlog'",
}


def test_an_import_error_at_start_up_is_fatal_at_once_and_later_a_crash() -> None:
    early = WorkerExit(classify_exit(1), 0.8, IMPORT_ERROR, None, False, None)
    assert early.start_import_error(startup_grace_s=180)
    route = route_exit(ExitKind.CRASH, None, removed=False, stopping=False, import_error=True)
    assert route is Route.IMPORT_ERROR
    state, why = early.settle(route, None)  # type: ignore[misc]
    assert state is WorkerState.FATAL
    assert "ModuleNotFoundError: No module named 'structlog'" in why
    # After a heartbeat, or past the start-up grace: a crash like any other.
    after_beat = WorkerExit(classify_exit(1), 0.8, IMPORT_ERROR, beat(5), False, None)
    assert not after_beat.start_import_error(startup_grace_s=180)
    late = WorkerExit(classify_exit(1), 400.0, IMPORT_ERROR, None, False, None)
    assert not late.start_import_error(startup_grace_s=180)
    assert route_exit(ExitKind.CRASH, None, removed=False, stopping=False) is Route.FAILURE


def test_a_failure_reason_names_the_exception() -> None:
    error = {"kind": "command_exit", "message": TRACEBACK, "exception": "ValueError: boom"}
    why, _ = WorkerExit(classify_exit(1), 5.0, error, None, False, None).failure(None)
    assert why == "crash: exit status 1 (crash): ValueError: boom"
    builtin = {"kind": "crash", "message": "RuntimeError: cuda broke\nmore"}
    why, _ = WorkerExit(classify_exit(1), 5.0, builtin, None, False, None).failure(None)
    assert why == "crash: exit status 1 (crash): RuntimeError: cuda broke"


LATE_IMPORT = """
import time, rlsup
run = rlsup.attach()
run.heartbeat(10)
time.sleep(1.5)
import not_a_module_rlsup_test
"""
KILLED = """
import os
for i in range(50):
    print('{"event": "step", "level": "info"}', flush=True)
os.kill(os.getpid(), 9)
"""


@pytest.mark.timeout(120)
def test_import_errors_and_signals_under_a_real_supervisor(tmp_path: Path) -> None:
    (tmp_path / "late.py").write_text(LATE_IMPORT)
    (tmp_path / "killed.py").write_text(KILLED)
    py = json.dumps(sys.executable)
    config = tmp_path / "rlsup.toml"
    config.write_text(
        'state_dir = "state"\nstop_grace_s = 5\ntick_s = 0.05\n'
        "[modes.light]\nnum_envs = 1\nbatch_size = 1\nn_steps = 1\nmax_concurrent = 4\n"
        "[restart]\nbackoff_base_s = 0.1\nbackoff_max_s = 0.2\nbudget = 1\n"
        "budget_window_s = 600\n"
        f'[[games]]\nname = "early"\ncommand = [{py}, "-c", "import not_a_module_rlsup_test"]\n'
        f'[[games]]\nname = "late"\ncommand = [{py}, "{tmp_path / "late.py"}"]\n'
        "heartbeat = true\n"
        f'[[games]]\nname = "killed"\ncommand = [{py}, "{tmp_path / "killed.py"}"]\n'
    )
    env = env_for(tmp_path)
    rlsup("run", "--exit-when-done", "--config", str(config), env=env, timeout=90)
    state = tmp_path / "state"
    missing = "ModuleNotFoundError: No module named 'not_a_module_rlsup_test'"
    # At start-up: FATAL after one start, the exception in the fatal event and in status.
    assert len(events(state, "worker_start", "early")) == 1
    assert not events(state, "restart", "early")
    (fatal,) = events(state, "fatal", "early")
    assert missing in fatal["detail"]["reason"]
    text = rlsup("status", "--config", str(config), env=env).stdout
    assert "! early: fatal: " in text and missing in text.split("! early: fatal: ")[1]
    # After its first heartbeat: a crash like any other (restarted, then the budget).
    assert events(state, "restart", "late")
    (fatal,) = events(state, "fatal", "late")
    assert (
        "restart budget spent" in fatal["detail"]["reason"] and missing in fatal["detail"]["reason"]
    )
    crash = events(state, "worker_crash", "killed")[0]["detail"]
    assert crash["message"] == "killed by signal 9 (SIGKILL)"
