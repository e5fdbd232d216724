"""Crash-point sweep with real processes: SIGKILL at every point of the commit protocol leaves
either the previous checkpoint or the new one, both verified, never a partial one.

A kill is not a power loss (FIELD-NOTES 1): the kernel still flushes written pages. The fsync
ordering that covers power loss is checked separately in test_ckpt_fsync_order.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt_crash_child import files_for, write_base

from checkpoints import CheckpointStore

pytestmark = pytest.mark.e2e

CHILD = Path(__file__).with_name("ckpt_crash_child.py")
REPO = Path(__file__).resolve().parents[2]


def _child_cmd(root: Path, scenario: str, mode: str, arg: str) -> list[str]:
    return [sys.executable, str(CHILD), str(root), scenario, mode, arg]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _fresh_root(base: Path, label: str) -> Path:
    root = base / label / "checkpoints"
    write_base(CheckpointStore(root, keep=1))
    return root


def _record_points(tmp_path: Path, scenario: str) -> list[str]:
    root = _fresh_root(tmp_path, f"record-{scenario}")
    out = tmp_path / f"points-{scenario}.json"
    subprocess.run(
        _child_cmd(root, scenario, "record", str(out)), env=_child_env(), check=True, timeout=60
    )
    points: list[str] = json.loads(out.read_text())
    return points


def _assert_recovers(root: Path, expected: str, step: int) -> None:
    store = CheckpointStore(root, keep=1)
    loaded = store.load_latest()
    assert loaded is not None and loaded.quarantined == []
    assert loaded.step == step
    assert {name: loaded.read_bytes(name) for name in loaded.files()} == files_for(expected)
    store.sweep()
    leftovers = [p.name for p in root.iterdir() if not p.name.startswith("ckpt-")]
    assert leftovers == []
    again = store.load_latest()
    assert again is not None and again.step == step


@pytest.mark.parametrize("scenario", ["next", "same"])
def test_sigkill_at_every_commit_point_leaves_old_or_new(tmp_path: Path, scenario: str) -> None:
    points = _record_points(tmp_path, scenario)
    expected_points = {"before_manifest", "after_manifest", "before_rename", "after_rename"}
    assert expected_points <= set(points)
    assert any(p.startswith("after_write:") for p in points)
    assert any(p.startswith("after_link:") for p in points)
    if scenario == "same":
        assert "after_move_aside" in points
    else:
        assert "after_remove_rename" in points  # keep=1 prunes step 1 after the commit
    # Run all kill points concurrently: each child needs ~0.2 s just to start Python.
    runs = []
    for i, point in enumerate(points):
        root = _fresh_root(tmp_path, f"kill-{i}")
        cmd = _child_cmd(root, scenario, "kill", point)
        runs.append((point, root, subprocess.Popen(cmd, env=_child_env())))
    renamed_at = points.index("after_rename")
    for i, (point, root, proc) in enumerate(runs):
        assert proc.wait(timeout=60) == -signal.SIGKILL, point
        committed = i >= renamed_at
        step = 2 if scenario == "next" and committed else 1
        _assert_recovers(root, "new" if committed else "old", step)
