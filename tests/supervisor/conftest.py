"""Shared fixtures of the supervisor tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _keep_signal_handlers() -> Iterator[None]:
    """An in-process Supervisor installs SIGTERM/SIGINT/SIGHUP handlers (its Waker): put back
    pytest's after each test."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
