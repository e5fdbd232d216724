"""The SDK on several hosts: the placement's epoch (`RLSUP_EPOCH`) and the mirror it is fenced in
(`RLSUP_MIRROR_*`), against a real mirror (SeaweedFS). Each checkpoint carries the epoch; once
the game's fence moved past it (placed again on another host) the next commit is refused and
the script exits 77 with error.json saying why; a mirror that cannot be read lets the commit go
on, said once. What the host restored before the start reaches the heartbeat."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import rlsup
from checkpoints import CheckpointStore
from harness.seaweed import Weed
from tests.mirror.conftest import remote_for, weed
from training import protocol as P

__all__ = ["weed"]

pytestmark = pytest.mark.e2e


def _placed(monkeypatch: pytest.MonkeyPatch, run_dir: Path, url: str, endpoint: str, epoch: int):
    monkeypatch.setenv(P.RUN_DIR_ENV, str(run_dir))
    monkeypatch.setenv(P.GAME_ENV, "g")
    monkeypatch.setenv(P.EPOCH_ENV, str(epoch))
    monkeypatch.setenv(P.MIRROR_URL_ENV, url)
    monkeypatch.setenv(P.MIRROR_ENDPOINT_URL_ENV, endpoint)
    monkeypatch.setenv(P.MIRROR_REGION_ENV, "us-east-1")


def test_a_fenced_placement_commits_nothing_and_exits_77(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, remote = remote_for(weed, request)
    epoch = remote.advance_fence("g")
    run_dir = tmp_path / "run"
    _placed(monkeypatch, run_dir, url, weed.endpoint, epoch)
    restored = {"step": 40, "bytes": 10, "skipped": [], "url": url}
    monkeypatch.setenv(P.MIRROR_RESTORE_ENV, json.dumps(restored))
    run = rlsup.attach(handle_signals=False, heartbeat=True)
    try:
        with run.checkpoint(100) as d:
            (d / "state").write_text("100")
        store = CheckpointStore(run_dir / P.CHECKPOINT_DIR)
        [(ref, meta)] = [store.newest_meta()]  # type: ignore[misc]
        assert ref.step == 100 and meta["epoch"] == epoch
        hb = json.loads((run_dir / P.HEARTBEAT_FILE).read_text())
        assert hb["mirror_restore"] == restored

        assert remote.advance_fence("g") == epoch + 1  # placed again on another host
        with pytest.raises(SystemExit) as exc, run.checkpoint(200) as d:
            (d / "state").write_text("200")
        assert exc.value.code == P.ExitCode.FENCED == 77
        latest = store.latest()
        assert latest is not None and latest.step == 100, "nothing committed once fenced"
        assert not list((run_dir / P.CHECKPOINT_DIR).glob("*200*"))
        error = json.loads((run_dir / P.ERROR_FILE).read_text())
        assert error["kind"] == "fenced" and error["pid"] == os.getpid()
        assert f"placement epoch {epoch} is fenced off" in error["message"], error
    finally:
        run.close()


def test_an_unreadable_mirror_lets_the_commit_go_on_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    # A port nothing listens on: refused at once.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    _placed(monkeypatch, run_dir, "s3://nowhere/p", "http://127.0.0.1:9", 3)
    run = rlsup.attach(handle_signals=False)
    try:
        for step in (10, 20):
            with run.checkpoint(step) as d:
                (d / "state").write_text(str(step))
        assert run.last_checkpoint_step == 20
    finally:
        run.close()
    err = capsys.readouterr().err
    assert err.count("cannot read the placement fence of g in s3://nowhere/p") == 1, err


def test_on_one_host_no_fence_is_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No RLSUP_EPOCH (one host, or standalone): no epoch in the meta, no mirror asked even
    with a mirror url set."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv(P.RUN_DIR_ENV, str(run_dir))
    monkeypatch.setenv(P.MIRROR_URL_ENV, "s3://nowhere/p")
    monkeypatch.setenv(P.MIRROR_ENDPOINT_URL_ENV, "http://127.0.0.1:9")
    run = rlsup.attach(handle_signals=False)
    try:
        with run.checkpoint(5) as d:
            (d / "state").write_text("5")
    finally:
        run.close()
    newest = CheckpointStore(run_dir / P.CHECKPOINT_DIR).newest_meta()
    assert newest is not None and "epoch" not in newest[1]


@pytest.mark.parametrize("raw", ["two", "-1"])
def test_an_epoch_that_is_no_epoch_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(P.RUN_DIR_ENV, str(tmp_path / "run"))
    monkeypatch.setenv(P.EPOCH_ENV, raw)
    with pytest.raises(rlsup.SdkError, match=rf"RLSUP_EPOCH={raw!r}|RLSUP_EPOCH={raw}"):
        rlsup.attach(handle_signals=False)
