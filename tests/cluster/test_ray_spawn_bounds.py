"""A placement's spawn never holds the tick past systemd's watchdog (WatchdogSec=60): a mirror
that accepts connections and never answers fails the spawn within the fence's bound (a
backoff), where botocore's own retries would wait minutes. No Ray cluster: the fence comes
before any actor."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from harness.runs import write_config
from harness.seaweed import TEST_AWS_ENV
from supervisor.config import load_config, worker_config
from supervisor.launch.ray import FENCE_TIMEOUT_S, RayLauncher

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_silent_mirror_fails_the_spawn_within_the_fence_bound(
    tmp_path: Path, silent_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in TEST_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    path = write_config(tmp_path, [("g", 1000)], extra="")
    path.write_text(
        path.read_text()
        + f'[mirror]\nurl = "s3://rlsup-test/f"\nendpoint_url = "{silent_endpoint}"\n'
        + '[cluster]\nbackend = "ray"\n'
    )
    cfg = load_config(path)
    launcher = RayLauncher(cfg)
    monkeypatch.setattr(launcher, "_choose", lambda game: ("host-a", "node-a", 4.0))
    wcfg = worker_config(cfg.games[0], cfg.modes[0], cfg.run_dir("g"), 60.0, 1, cfg.mirror)
    outcome: list[BaseException | None] = []

    def spawn() -> None:
        try:
            launcher.spawn(wcfg.to_argv(), tmp_path / "g.log", time.monotonic())
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=spawn, daemon=True)
    thread.start()
    thread.join(FENCE_TIMEOUT_S + 15)
    took = time.monotonic() - started
    assert outcome, f"the spawn still blocks after {took:.0f} s (the watchdog fires at 60 s)"
    [exc] = outcome
    assert isinstance(exc, OSError) and "fence" in str(exc), exc
    assert took < FENCE_TIMEOUT_S + 10


def test_the_launcher_given_another_mirror_fences_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor refuses a reload that moves the mirror; were the launcher given one
    anyway, its fence client follows it (never fences in one place while workers restore from
    another)."""
    for key, value in TEST_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    path = write_config(tmp_path, [("g", 1000)])
    base = path.read_text() + '[cluster]\nbackend = "ray"\n'
    path.write_text(base + '[mirror]\nurl = "s3://rlsup-test/one"\n')
    launcher = RayLauncher(load_config(path))
    launcher._remote = object()  # a fence client on the first location, as after a spawn
    path.write_text(base + '[mirror]\nurl = "s3://rlsup-test/one"\nkeep = 5\n')
    launcher.configure(load_config(path))
    assert launcher._remote is not None, "the same location: the client stays"
    path.write_text(base + '[mirror]\nurl = "s3://rlsup-test/two"\n')
    launcher.configure(load_config(path))
    assert launcher._remote is None
    assert launcher.cfg.mirror is not None and launcher.cfg.mirror.url == "s3://rlsup-test/two"
