"""The several-hosts tests share the mirror tests' SeaweedFS (one per module), a mirror
endpoint that never answers, the environment their processes run with, loopback Ray clusters of
one, two or three hosts, and a mirror prefix of their own per test."""

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoints.remote import RemoteLocation, RemoteStore, make_client
from harness.ray_cluster import LoopbackCluster, loopback_cluster, python_env
from harness.runs import env_for
from harness.seaweed import Weed
from tests.mirror.conftest import BUCKET, TEST_AWS_ENV, prefix_for, weed

__all__ = ["mirror_for", "one_host", "ray_env", "silent_endpoint", "three_hosts", "two_hosts",
           "weed"]  # fmt: skip


@pytest.fixture
def ray_env(tmp_path: Path) -> dict[str, str]:
    return env_for(tmp_path, **TEST_AWS_ENV, RAY_USAGE_STATS_ENABLED="0")


def _hosts(tmp_path: Path, env: dict[str, str], names: list[str]) -> Iterator[LoopbackCluster]:
    with loopback_cluster(tmp_path / "hosts", names, python_env(env)) as lc:
        yield lc


@pytest.fixture
def one_host(tmp_path: Path, ray_env: dict[str, str]) -> Iterator[LoopbackCluster]:
    yield from _hosts(tmp_path, ray_env, ["h1"])


@pytest.fixture
def two_hosts(tmp_path: Path, ray_env: dict[str, str]) -> Iterator[LoopbackCluster]:
    yield from _hosts(tmp_path, ray_env, ["h1", "h2"])


@pytest.fixture
def three_hosts(tmp_path: Path, ray_env: dict[str, str]) -> Iterator[LoopbackCluster]:
    yield from _hosts(tmp_path, ray_env, ["h1", "h2", "h3"])


def mirror_for(weed: Weed, request: pytest.FixtureRequest) -> tuple[str, RemoteStore]:
    """The test's own mirror URL (a prefix in the shared bucket) and a store reading it."""
    url = f"s3://{BUCKET}/{prefix_for(request)}"
    return url, RemoteStore(make_client(weed.endpoint, "us-east-1"), RemoteLocation.parse(url))


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A server that completes TCP handshakes (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
