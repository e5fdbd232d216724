"""The test S3 server itself: two at once must not collide (the soak's server and a mirror
test's, a benchmark's): newer weed versions open listeners on fixed ports beside S3."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.seaweed import TEST_AWS_ENV, running_weed

pytestmark = pytest.mark.e2e


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


def test_clients_sign_with_the_credentials_of_their_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI's order in one pytest process: the soak's server under its keys, then the mirror
    tests' server under theirs. Newer weed versions make an admin identity of the keys in their
    environment, and a client that kept the first keys (boto3's default session resolves them
    once per process) was refused by the second server: InvalidAccessKeyId."""
    from checkpoints.remote import make_client

    for n, key in enumerate(("rlsup-first", "rlsup-second")):
        env = {**TEST_AWS_ENV, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": key}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        with running_weed(tmp_path / str(n)) as weed:
            client = make_client(weed.endpoint, "us-east-1")
            assert client._request_signer._credentials.access_key == key
            client.list_buckets()
