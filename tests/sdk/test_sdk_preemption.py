"""The SDK's `run.preemption_deadline`: from the standing checkpoint.request, else the env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rlsup
from training import protocol as P

pytestmark = pytest.mark.e2e


def test_preemption_deadline_comes_from_the_request_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = tmp_path / P.CHECKPOINT_REQUEST_FILE
    with rlsup.attach(tmp_path, handle_signals=False) as run:
        assert run.preemption_deadline is None  # no notice known
        monkeypatch.setenv(P.PREEMPTION_DEADLINE_ENV, "1700000030.5")
        assert run.preemption_deadline == 1700000030.5
        request.touch()  # an operator's request says nothing of a deadline: the env's stands
        assert run.should_checkpoint() and run.preemption_deadline == 1700000030.5
        payload = {"reason": "preemption", "deadline": 1700000042, "provider": "gcp"}
        request.write_text(json.dumps(payload))
        assert run.preemption_deadline == 1700000042.0  # the request's wins
        request.unlink()  # withdrawn
        monkeypatch.setenv(P.PREEMPTION_DEADLINE_ENV, "soon")  # not a number: no deadline
        assert run.preemption_deadline is None


@pytest.mark.parametrize(
    ("content", "deadline"),
    [
        (b"", None),
        (b"\xff not json", None),
        (b"[1, 2]", None),
        (b'{"deadline": "1700000042"}', 1700000042.0),
        (b'{"deadline": true}', None),
        (b'{"deadline": -5}', None),
        (b'{"deadline": "NaN"}', None),
    ],
)
def test_any_request_file_is_a_request_and_only_a_number_is_a_deadline(
    tmp_path: Path, content: bytes, deadline: float | None
) -> None:
    (tmp_path / P.CHECKPOINT_REQUEST_FILE).write_bytes(content)
    request = P.read_checkpoint_request(tmp_path)
    assert request is not None and request.mtime > 0
    assert request.deadline == deadline
    assert P.preemption_deadline(tmp_path, environ={}) == deadline
