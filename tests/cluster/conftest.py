"""The several-hosts tests share the mirror tests' SeaweedFS (one per module), and a mirror
endpoint that never answers."""

import socket
from collections.abc import Iterator

import pytest

from tests.mirror.conftest import weed

__all__ = ["silent_endpoint", "weed"]


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A server that completes TCP handshakes (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
