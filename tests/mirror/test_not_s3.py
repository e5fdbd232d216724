"""A mirror endpoint that refuses, or answers something that is not S3 (a web page, garbage,
XML that is almost a listing, a status no S3 server sends): every S3 path (restore, upload,
garbage collection, `rlsup pull`, the uploader, the worker's restore) fails in one line that
names the endpoint, never a traceback, and never reads such an answer as an empty mirror (a
worker would then start from zero)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from checkpoints import CheckpointStore
from checkpoints.mirror import collect_garbage, restore_newest, upload_checkpoint
from checkpoints.remote import (
    RemoteContentError,
    RemoteError,
    RemoteLocation,
    RemoteStore,
    make_client,
)
from harness.runs import REPO, env_for, rlsup, write_config
from harness.seaweed import TEST_AWS_ENV
from supervisor.config import load_config
from supervisor.mirror.state import MirrorState
from supervisor.mirror.uploader import UploadPlan, _Pass, _remote_store
from tests.mirror.endpoints import NOT_S3, closed_endpoint, not_s3_endpoint

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
URL = "s3://rlsup-test/p"


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in TEST_AWS_ENV.items():
        monkeypatch.setenv(key, value)


def _remote(endpoint: str) -> RemoteStore:
    return RemoteStore(make_client(endpoint, "us-east-1"), RemoteLocation.parse(URL))


def _one_line_naming(exc: BaseException, endpoint: str) -> None:
    text = str(exc)
    assert "\n" not in text, text
    assert endpoint in text, text
    assert len(text) < 1000, text


def _committed(root: Path) -> CheckpointStore:
    store = CheckpointStore(root)
    w = store.begin(100, {"game": "CartPole-v1", "algo": "ppo"})
    w.write_bytes("learner.pt", os.urandom(1000))
    w.commit()
    return store


@pytest.mark.parametrize("kind", sorted(NOT_S3))
def test_restoring_from_a_store_that_is_not_s3_is_a_read_error_naming_it(
    kind: str, tmp_path: Path
) -> None:
    """Not "the mirror is empty" (a fresh worker would start from zero) and not a verdict on
    any checkpoint: the store failed."""
    store = CheckpointStore(tmp_path / "c")
    with not_s3_endpoint(kind) as endpoint, pytest.raises(RemoteError) as info:
        restore_newest(_remote(endpoint), "g", store)
    assert not isinstance(info.value, RemoteContentError)
    _one_line_naming(info.value, endpoint)
    assert store.committed() == []


def test_a_refused_connection_names_the_endpoint(tmp_path: Path) -> None:
    with closed_endpoint() as endpoint, pytest.raises(RemoteError) as info:
        restore_newest(_remote(endpoint), "g", CheckpointStore(tmp_path / "c"))
    assert not isinstance(info.value, RemoteContentError)
    _one_line_naming(info.value, endpoint)


@pytest.mark.parametrize("kind", ["html", "teapot"])
def test_uploading_to_a_store_that_is_not_s3_fails_naming_it(kind: str, tmp_path: Path) -> None:
    store = _committed(tmp_path / "a")
    with not_s3_endpoint(kind) as endpoint:
        remote = _remote(endpoint)
        with pytest.raises(RemoteError) as info:
            upload_checkpoint(remote, "g", store.committed()[-1])
        _one_line_naming(info.value, endpoint)
        with pytest.raises(RemoteError) as gc:
            collect_garbage(remote, keep=1)
        _one_line_naming(gc.value, endpoint)


@pytest.mark.parametrize("kind", ["html", "bad-time"])
def test_pull_from_a_server_that_is_not_s3_is_one_line(kind: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, [("g", 1000)])
    with not_s3_endpoint(kind) as endpoint:
        config.write_text(
            config.read_text() + f'[mirror]\nurl = "{URL}"\nendpoint_url = "{endpoint}"\n'
        )
        done = rlsup(
            "pull", "--game", "g", "--config", str(config), env=env_for(tmp_path, **TEST_AWS_ENV)
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlsup pull: g: "), done.stderr
    assert endpoint in lines[0]
    assert not list((tmp_path / "state" / "runs" / "g").glob("checkpoints/ckpt-*"))


@pytest.mark.parametrize("kind", ["html", "teapot"])
def test_the_uploader_records_a_store_that_is_not_s3_as_a_failure_naming_it(
    kind: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, [("g", 1000)])
    with not_s3_endpoint(kind) as endpoint:
        config.write_text(
            config.read_text() + f'[mirror]\nurl = "{URL}"\nendpoint_url = "{endpoint}"\n'
        )
        cfg = load_config(config)
        assert cfg.mirror is not None
        _committed(cfg.run_dir("g") / "checkpoints")
        one = _Pass(UploadPlan.of(cfg), _remote_store(cfg.mirror))
        with structlog.testing.capture_logs() as logs:
            assert one.game("g", cfg.run_dir("g"), now=0.0) is False
            one.collect_garbage()
    assert not any(e["event"] == "mirror_unexpected_error" for e in logs), logs
    state = MirrorState.read(cfg.state_dir)
    assert state is not None
    error = state.games["g"].last_error
    assert error is not None and endpoint in error and "\n" not in error
    assert state.gc is not None and endpoint in state.gc["error"]


def test_a_fresh_worker_never_reads_a_web_page_as_an_empty_mirror(tmp_path: Path) -> None:
    """A fresh machine whose endpoint_url points at a web server: the worker must not start
    from zero (its run would overwrite the mirror's game with a new one); it exits
    `checkpoint_unreadable` (retried after a backoff) naming the endpoint."""
    run_dir = tmp_path / "run"
    with not_s3_endpoint("html") as endpoint:
        done = subprocess.run(
            [sys.executable, "-m", "training.worker", "--run-dir", str(run_dir),
             "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "2", "--n-steps", "16",
             "--batch-size", "32", "--threads", "1", "--eval-episodes", "0",
             "--total-steps", "64", "--mirror-url", URL, "--mirror-endpoint-url", endpoint,
             "--mirror-name", "g"],
            cwd=REPO,
            env={**os.environ, **TEST_AWS_ENV, "PYTHONWARNINGS": "ignore"},
            capture_output=True,
            text=True,
            timeout=240,
        )  # fmt: skip
    assert done.returncode not in (0, 75), done.stderr[-2000:]
    error = json.loads((run_dir / "error.json").read_text())
    assert error["kind"] == "checkpoint_unreadable", error
    assert endpoint in error["message"], error
    assert not list(run_dir.glob("checkpoints/ckpt-*")), "started from zero"
