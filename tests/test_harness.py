"""The harness's own rules (tests/conftest.py): a leaked process fails the run and is killed;
children of a run started with SIGINT ignored still get Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")

# The inner tests start processes: e2e, as the guard in conftest.py asks of every such test.
LEAKY = """
import subprocess, sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.e2e

def test_leaks_a_process(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(__file__).with_name("leaked.pid").write_text(str(p.pid))
"""

FOLLOWER = """
import signal, subprocess, sys
import pytest

pytestmark = pytest.mark.e2e

def test_a_child_gets_sigint():
    p = subprocess.Popen([sys.executable, "-c",
        "import sys, time\\ntry:\\n print('up', flush=True)\\n time.sleep(60)\\n"
        "except KeyboardInterrupt:\\n sys.exit(7)"], stdout=subprocess.PIPE, text=True)
    # 'up' is printed inside the try: a Ctrl-C that lands right after it is caught too (CI
    # once delivered it between the print and the try, and the child died of it).
    assert p.stdout.readline() == "up\\n"
    p.send_signal(signal.SIGINT)
    assert p.wait(20) == 7
"""


def _inner_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RLSUP_TEST_RUN"}
    return {**env, "RLSUP_LEFTOVER_WAIT_S": "1"}


def _inner(pytester: pytest.Pytester, body: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, pytester.path / "conftest.py")
    pytester.makepyfile(test_inner=body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pytester.path)],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=120,
        # A separate run: its own marker, so this run's guard does not count its children.
        # The leftover waits 1 s, not 10, before it is named.
        env=_inner_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


def test_a_process_left_behind_fails_the_run_and_is_killed(pytester: pytest.Pytester) -> None:
    r = _inner(pytester, LEAKY)
    pid = int((pytester.path / "leaked.pid").read_text())
    assert r.returncode != 0, r.stdout
    assert "processes left behind" in r.stdout and str(pid) in r.stdout, r.stdout
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_children_of_a_run_started_with_sigint_ignored_get_ctrl_c(
    pytester: pytest.Pytester,
) -> None:
    r = _inner(pytester, FOLLOWER)
    assert r.returncode == 0, r.stdout
