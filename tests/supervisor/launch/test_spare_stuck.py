"""A spare stuck in the GPU driver (uninterruptible: a SIGKILL takes effect only once the
driver call returns) must never freeze the tick: it is killed, reported lost and reaped by a
later tick, not waited for. The kill is the one seam faked (a D-state process cannot be made
on demand); the spare is a real, silent process."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.runs import REPO
from supervisor.launch.spare import Spare, SpareKeeper, SpareWant

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def test_a_spare_that_cannot_die_yet_never_blocks_the_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    keeper = SpareKeeper(sys.executable, "tests.supervisor.fake_spare", warm_timeout_s=0.5)
    want = SpareWant(True, "test", "cuda", tmp_path / "spare.log", tmp_path)
    now = time.monotonic()
    kinds = [kind for kind, _, _ in keeper.tend(want, now)]
    stuck = keeper.spare
    try:
        assert kinds == ["spare_enabled", "spare_spawned"] and stuck is not None
        real_kill = SpareKeeper._kill
        monkeypatch.setattr(SpareKeeper, "_kill", staticmethod(lambda spare: None))  # pending
        got: dict[str, Any] = {}
        tick = threading.Thread(target=lambda: got.update(events=keeper.tend(want, now + 1.0)))
        tick.start()
        tick.join(5.0)
        blocked = tick.is_alive()
        os.kill(stuck.pid, signal.SIGKILL)  # the driver call returns: the kill takes effect
        tick.join(10.0)
        assert not blocked, "the tick waited for a spare that could not die yet"
        [lost] = [d for kind, _, d in got["events"] if kind == "spare_lost"]
        assert lost["pid"] == stuck.pid and "silent" in lost["reason"]
        assert keeper.spare is None and keeper.retiring == [stuck], "reaped later"
        monkeypatch.setattr(SpareKeeper, "_kill", real_kill)
        deadline = time.monotonic() + 10
        while keeper.retiring and time.monotonic() < deadline:
            keeper.tend(SpareWant(False, "test over"), now + 2.0)
            time.sleep(0.05)
        assert keeper.retiring == [] and stuck.popen.returncode == -signal.SIGKILL
    finally:
        keeper.close()
        if stuck is not None:
            _reap(stuck)


def _reap(spare: Spare) -> None:
    if spare.popen.poll() is None:
        spare.popen.kill()
        spare.popen.wait(10)
