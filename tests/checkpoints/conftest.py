"""Shared fixtures for the checkpoint store tests."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from checkpoints import CheckpointRef, CheckpointStore

# The contents every helper-made checkpoint holds, parametrised by step so that loading
# the wrong step is visible in the data, not only in the step number.
MakeCkpt = Callable[..., CheckpointRef]


def ckpt_files(step: int) -> dict[str, bytes]:
    return {
        "learner.pt": f"learner-{step}".encode() * 100,
        "replay/frames-000000.bin": bytes([step % 256]) * 4096,
        "replay/frames-000001.bin": bytes([(step + 1) % 256]) * 4096,
    }


@pytest.fixture(autouse=True)
def _worker_umask() -> Iterator[None]:
    """The umask `rlsup run` hands its workers (077): state private to its owner."""
    old = os.umask(0o077)
    yield
    os.umask(old)


@pytest.fixture(autouse=True)
def _fake_boot_id(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    boot = tmp_path_factory.mktemp("boot") / "boot_id"
    boot.write_text("test-boot-id\n")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(boot))
    return "test-boot-id"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "run" / "checkpoints"


@pytest.fixture
def store(root: Path) -> CheckpointStore:
    return CheckpointStore(root, keep=3)


@pytest.fixture
def make_ckpt(store: CheckpointStore) -> MakeCkpt:
    def make(step: int, files: dict[str, bytes] | None = None) -> CheckpointRef:
        with store.begin(step, {"game": "Pong-v5", "algo": "dqn"}) as writer:
            for name, data in (files if files is not None else ckpt_files(step)).items():
                writer.write_bytes(name, data)
            return writer.commit()

    return make
