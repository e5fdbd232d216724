"""Retention that keeps what matters: the newest, the best-evaluated (the mean a checkpoint's
manifest records), milestones and pins; the rot rule and the hard-linked replay chunks as
before; a kill at any point of retention loses nothing (real child processes, SIGKILL at every
crash point)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoints import CheckpointStore
from checkpoints.retention import (
    PINS_FILE,
    RetentionPolicy,
    eval_score,
    milestones,
    read_pins,
    write_pins,
)

pytestmark = pytest.mark.e2e

CHILD = Path(__file__).with_name("retention_kill_child.py")
REPO = Path(__file__).resolve().parents[2]
CHUNKS = {f"replay/frames-{c:06d}.bin": bytes([c + 1]) * 8192 for c in range(3)}


def commit(store: CheckpointStore, step: int, mean: float | None = None, base: int | None = None):
    """A checkpoint whose replay chunks are hard-linked from `base` (as the worker's are)."""
    meta: dict[str, object] = {"game": "CartPole-v1", "algo": "ppo"}
    if mean is not None:
        meta["eval"] = {"step": step, "mean": mean, "episodes": 3}
    with store.begin(step, meta) as w:
        w.write_bytes("learner.pt", b"learner-%d" % step * 64)
        for name, data in CHUNKS.items():
            w.link_or_write(name, data, unchanged_since_step=base)
        return w.commit()


def steps(store: CheckpointStore) -> list[int]:
    return [ref.step for ref in store.committed()]


# ---- the policy ------------------------------------------------------------------------------


def test_policy_unions_newest_best_milestones_and_pins() -> None:
    policy = RetentionPolicy(keep=2, keep_best=2, keep_every_steps=1000)
    all_steps = [100, 600, 1100, 1500, 2200, 2600, 3000]
    scores = {600: 50.0, 1500: 90.0, 2200: 90.0, 3000: 10.0, 999: 1e9}  # 999: not committed
    kept = policy.select(all_steps, scores, pinned={100, 4000})
    assert kept == {
        100: ["pinned"],
        1100: ["milestone"],  # the first at or past 1000
        1500: ["best"],
        2200: ["best", "milestone"],  # ties go to the newer; first at or past 2000
        2600: ["newest"],
        3000: ["newest", "milestone"],
    }


def test_milestones_are_the_first_checkpoint_past_each_multiple() -> None:
    assert milestones([50, 90, 120, 180, 210, 450], 100) == [120, 210, 450]
    assert milestones([100, 200, 250], 100) == [100, 200]
    assert milestones([1, 2, 3], 0) == milestones([1, 2, 3], None) == []


def test_only_finite_numbers_are_scores() -> None:
    assert eval_score({"eval": {"mean": 3}}) == 3.0
    for meta in ({}, {"eval": None}, {"eval": {"mean": None}}, {"eval": {"mean": True}},
                 {"eval": {"mean": "9"}}, {"eval": {"mean": float("inf")}}, None):  # fmt: skip
        assert eval_score(meta) is None


@pytest.mark.parametrize(
    ("kw", "needle"),
    [({"keep": 0}, "keep must"), ({"keep_best": -1}, "keep_best"),
     ({"keep_every_steps": -5}, "keep_every_steps"), ({"keep_best": 1.5}, "keep_best")],
)  # fmt: skip
def test_bad_policies_are_refused(root: Path, kw: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        CheckpointStore(root, **kw)  # type: ignore[arg-type]


# ---- the store --------------------------------------------------------------------------------


def test_keep_best_survives_newer_worse_ones_and_a_new_store(root: Path) -> None:
    store = CheckpointStore(root, keep=1, keep_best=1)
    commit(store, 100, mean=20.0)
    commit(store, 200, mean=80.0, base=100)
    for step, mean in ((300, 30.0), (400, None), (500, 79.9)):
        commit(store, step, mean=mean, base=step - 100)
    assert steps(store) == [200, 500]
    # A resumed worker (a new store on the same folder) knows 200 is the best: it is in the
    # manifest, not in memory.
    resumed = CheckpointStore(root, keep=1, keep_best=1)
    commit(resumed, 600, mean=5.0, base=500)
    assert steps(resumed) == [200, 600]
    assert resumed.kept() == {200: ["best"], 600: ["newest"]}
    # A better one replaces it.
    commit(resumed, 700, mean=81.0, base=600)
    commit(resumed, 800, mean=1.0, base=700)
    assert steps(resumed) == [700, 800]
    for ref in resumed.committed():
        resumed.verify(ref)  # each holds its own links: nothing deleted broke a kept one


def test_milestones_and_pins_are_kept(root: Path) -> None:
    store = CheckpointStore(root, keep=2, keep_every_steps=1000)
    base = None
    for step in range(300, 3100, 300):
        commit(store, step, base=base)
        base = step
    assert steps(store) == [1200, 2100, 2700, 3000]
    write_pins(root, {2700})
    commit(store, 3300, base=3000)
    commit(store, 3600, base=3300)
    assert steps(store) == [1200, 2100, 2700, 3000, 3300, 3600]
    assert read_pins(root) == {2700}
    assert oct(os.stat(root / PINS_FILE).st_mode & 0o777) == "0o600"  # the umask's 077


def test_unreadable_pins_hold_retention(root: Path) -> None:
    store = CheckpointStore(root, keep=1)
    commit(store, 1)
    (root / PINS_FILE).write_text("{not json")
    commit(store, 2, base=1)
    assert steps(store) == [1, 2], "an unknown pin list deletes nothing"
    write_pins(root, set())
    commit(store, 3, base=2)
    assert steps(store) == [3]


def test_nothing_is_deleted_unless_a_kept_one_newer_than_all_doomed_verifies(root: Path) -> None:
    store = CheckpointStore(root, keep=1, keep_best=1)
    commit(store, 100, mean=99.0)
    commit(store, 200, mean=1.0, base=100)
    commit(store, 300, mean=2.0, base=200)  # deletes 200
    assert steps(store) == [100, 300]
    store.keep = 5
    commit(store, 400, mean=3.0, base=300)
    (store.path_for(400) / "learner.pt").write_bytes(b"rotten")
    store.keep = 1
    # 100 (the best) verifies, but it is older than 300: it proves nothing about 300, which
    # may be the newest valid checkpoint.
    assert store.apply_retention() == []
    assert steps(store) == [100, 300, 400]


def test_a_manifest_that_cannot_be_read_is_kept_this_time(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(root, keep=5, keep_best=1)
    commit(store, 100, mean=50.0)
    commit(store, 200, mean=99.0, base=100)
    commit(store, 300, mean=2.0, base=200)
    store.keep = 1
    control = tmp_path / "faults"
    control.write_text(f"EIO {store.path_for(200)}/MANIFEST.json\n")
    monkeypatch.setenv("RLSUP_FAULT_READ_ERRORS", str(control))
    assert store.kept() == {100: ["best"], 200: ["unread"], 300: ["newest"]}
    assert store.apply_retention(known_good=300) == []
    monkeypatch.delenv("RLSUP_FAULT_READ_ERRORS")
    assert [p.name for p in store.apply_retention(known_good=300)] == ["ckpt-000000000100"]


# ---- a kill during retention ------------------------------------------------------------------


SCENARIO = {  # the store the child prunes: step -> eval mean
    100: 10.0, 200: 95.0, 300: 20.0, 400: 30.0, 500: 40.0, 600: 35.0, 700: 5.0, 800: 1.0,
}  # fmt: skip
KEPT = {200, 500, 700, 800}  # best 2: 200, 500; pinned 700; newest 800


def _build(root: Path) -> None:
    store = CheckpointStore(root, keep=100)
    base = None
    for step, mean in SCENARIO.items():
        commit(store, step, mean=mean, base=base)
        base = step
    write_pins(root, {700})


def _child(root: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(CHILD), str(root), *args], env=env)


def test_sigkill_at_every_point_of_retention_loses_nothing(tmp_path: Path) -> None:
    record = tmp_path / "record" / "checkpoints"
    _build(record)
    out = tmp_path / "points.json"
    assert _child(record, "record", str(out)).wait(timeout=60) == 0
    points: list[str] = json.loads(out.read_text())
    assert points.count("after_remove_rename") == points.count("after_remove") == 4
    assert {int(p.name[5:]) for p in record.glob("ckpt-*")} == KEPT
    runs = []
    for i in range(len(points)):
        root = tmp_path / f"kill-{i}" / "checkpoints"
        _build(root)
        runs.append((i, root, _child(root, "kill", str(i))))
    for i, root, proc in runs:
        assert proc.wait(timeout=60) == -signal.SIGKILL, points[i]
        store = CheckpointStore(root, keep=1, keep_best=2)
        left = set(steps(store))
        assert left >= KEPT, f"killed at {points[i]} (#{i}): lost {KEPT - left}"
        for ref in store.committed():
            store.verify(ref)  # every checkpoint still there is whole, kept or not
        # The next start sweeps the leftover, the next commit's retention finishes the job.
        store.sweep()
        assert not [p for p in root.iterdir() if p.name.startswith(".staging-")]
        store.apply_retention()
        assert set(steps(store)) == KEPT
        best = store.verify(store.committed()[0])
        assert best.step == 200 and best.meta["eval"]["mean"] == 95.0
