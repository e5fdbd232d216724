"""A worker's log stays bounded while the worker lives (not only at its next start): the
launcher moves the old content to `.1` and truncates the live file in place (the worker's fd
is O_APPEND), so the crash message still finds the traceback at the end. A real process
writing fast."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from supervisor.launch.crashlog import death_from_log
from supervisor.launch.launcher import Launcher

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

LIMIT = 256 << 10

WRITES_FAST = """
import sys, time
line = "x" * 100
for i in range(40_000):  # 4 MiB, 16 times the limit
    print(f"{i:08d} {line}")
    if i % 1000 == 999:
        sys.stdout.flush()
        time.sleep(0.02)
sys.stdout.flush()
raise ValueError(f"boom after {i + 1} lines")
"""


def test_a_log_written_fast_stays_bounded_and_keeps_its_crash(tmp_path: Path) -> None:
    script = tmp_path / "fast.py"
    script.write_text(WRITES_FAST)
    log = tmp_path / "fast.log"
    launcher = Launcher(log_limit_bytes=LIMIT, log_check_s=0.0)
    proc = launcher.spawn([sys.executable, str(script)], log, 0.0, cwd=tmp_path, command=True)
    biggest = 0
    try:
        while proc.poll() is None:
            launcher.observe(0.0)
            biggest = max(biggest, log.stat().st_size)
            time.sleep(0.05)
        launcher.forget(proc)
    finally:
        launcher.kill(proc)
        proc.close()
    assert proc.poll() == 1
    rotated = log.with_name("fast.log.1")
    assert rotated.exists()
    # Between two checks it grows by what it writes in a tick; never far past the limit.
    assert biggest < 8 * LIMIT, biggest
    assert log.stat().st_size < 8 * LIMIT and rotated.stat().st_size < 8 * LIMIT
    death = death_from_log(log, 1)
    assert death is not None and death.exception is not None
    assert death.exception.startswith("ValueError: boom after")
    assert death.message.startswith("Traceback (most recent call last):")
