"""Every SDK test runs as a script outside rlsup would: no RLSUP_* variable of the shell that
started pytest (the test run's own marker aside) reaches `rlsup.attach()`."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _outside_rlsup(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RLSUP_") and name != "RLSUP_TEST_RUN":
            monkeypatch.delenv(name)
