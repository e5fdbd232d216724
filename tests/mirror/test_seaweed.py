"""The test S3 server itself: two at once must not collide (the soak's server and a mirror
test's, a benchmark's): newer weed versions open listeners on fixed ports beside S3."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mirror.conftest import TEST_AWS_ENV
from tests.mirror.seaweed import running_weed


@contextlib.contextmanager
def _held(ports: tuple[int, ...]) -> Iterator[None]:
    """The ports taken, as another weed server would hold them (already busy is as good)."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            s = stack.enter_context(socket.socket())
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with contextlib.suppress(OSError):
                s.bind(("127.0.0.1", port))
                s.listen()
        yield


def test_a_server_starts_while_another_holds_the_fixed_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in TEST_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    with _held((8181, 9101)), running_weed(tmp_path) as weed:
        assert weed.endpoint.startswith("http://127.0.0.1:")
