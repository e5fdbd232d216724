"""Session-wide harness rules: how children see signals, and that nothing outlives the run.

- SIGINT: a test run started from a background job of a non-interactive shell (`make test &`,
  a CI runner) inherits SIGINT ignored, and an ignored signal stays ignored across exec: every
  `rlsup events -f`, `logs -f` or `status --watch` a test starts would then be deaf to the
  operator's Ctrl-C that the test sends. The run restores SIGINT's default, as a foreground job
  has it, so children start with it too (Python then installs its KeyboardInterrupt handler).
- Leftovers: the run puts a marker in its environment (RLSUP_TEST_RUN=<uuid>) that every process
  it starts inherits, however far it is re-parented (a follower, a worker, a server whose parent
  died). After the last test, any process still carrying the marker is killed and the session
  fails, naming it: a test that leaks a process is a failing test. (A marker, not a subreaper:
  a subreaper would keep orphans as zombies here, and tests that wait for a pid to vanish would
  wait forever.)
- The `e2e` marker: a test that starts a process (a supervisor, a worker, a server, a `mount`, a
  probe of an interpreter) says so with `pytest.mark.e2e`; `make check` runs the others. A test
  without it that starts one anyway fails, naming the marker: the fast lane stays honest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any, NoReturn

import psutil
import pytest

MARKER = "RLSUP_TEST_RUN"


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.setdefault(MARKER, uuid.uuid4().hex)


def _marked() -> list[psutil.Process]:
    """Live processes other than this one whose environment carries this run's marker."""
    mark, me = os.environ[MARKER], os.getpid()
    found = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARKER) == mark:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:160]}"
    except psutil.Error:
        return str(p.pid)


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Fails the session if any process started by a test is still running after the last one."""
    yield
    # A process being torn down by the last fixture may need a moment to exit (tests of this
    # guard itself wait less: RLSUP_LEFTOVER_WAIT_S).
    deadline = time.monotonic() + float(os.environ.get("RLSUP_LEFTOVER_WAIT_S", "10"))
    left = _marked()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _marked()
    if not left:
        return
    names = [_describe(p) for p in left]
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(left, timeout=10)
    pytest.fail("processes left behind by the test run (now killed):\n" + "\n".join(names))


class StartsAProcess(RuntimeError):
    """A test without the `e2e` marker started a process."""


@pytest.fixture(autouse=True)
def e2e_marks_every_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside `e2e` tests, starting a process (subprocess, fork, posix_spawn) raises."""
    if request.node.get_closest_marker("e2e") is not None:
        return

    def refuse(*_: Any, **__: Any) -> NoReturn:
        raise StartsAProcess(
            f"{request.node.nodeid} starts a process: mark it `pytest.mark.e2e` (the fast lane, "
            "`make check`, leaves such tests out)"
        )

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
