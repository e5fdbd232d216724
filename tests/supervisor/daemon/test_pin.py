"""`rlsup pin`: pins land in pins.json where the worker's retention reads them; bad input (an
unknown game, a step with no committed checkpoint, unpinning what is not pinned) exits 2 and
changes nothing. The real command line, as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoints import CheckpointStore
from checkpoints.retention import PINS_FILE, read_pins
from harness.runs import REPO

pytestmark = pytest.mark.e2e

CONFIG = """\
state_dir = "state"
[modes.light]
num_envs = 2
batch_size = 2
n_steps = 4
max_concurrent = 1
[[games]]
name = "pong"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = 1000
seeds = [1, 2]
device = "cpu"
args = { eval_episodes = 2, eval_every_steps = 100, keep_best = 1, keep_checkpoints = 1 }
"""


def rlsup(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args, "--config", str(config)],
        capture_output=True, text=True, timeout=60, env=env, cwd=config.parent,
    )  # fmt: skip


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "rlsup.toml"
    path.write_text(CONFIG)
    return path


def _commit(root: Path, step: int, mean: float) -> None:
    store = CheckpointStore(root, keep=100)
    meta = {"game": "CartPole-v1", "algo": "ppo", "eval": {"step": step, "mean": mean}}
    with store.begin(step, meta) as w:
        w.write_bytes("learner.pt", b"x%d" % step)
        w.commit()


def _snapshot(root: Path) -> dict[str, float]:
    return {p.name: p.stat().st_mtime for p in root.iterdir()} if root.exists() else {}


def test_pin_unpin_and_list_a_matrix_run(config: Path) -> None:
    root = config.parent / "state" / "runs" / "pong" / "s2" / "checkpoints"
    for step, mean in ((100, 9.0), (200, 50.0), (300, 7.0)):
        _commit(root, step, mean)
    done = rlsup(config, "pin", "pong/s2", "100")
    assert done.returncode == 0, done.stderr
    assert "pinned step 100" in done.stdout
    assert read_pins(root) == {100}
    assert oct((root / PINS_FILE).stat().st_mode & 0o007) == "0o0", "never for others"
    listed = rlsup(config, "pin", "pong/s2", "--list")
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert lines["100"].split()[1:] == ["9.00", "pinned"]
    assert lines["200"].split()[1:] == ["50.00", "best"]
    assert lines["300"].split()[1:] == ["7.00", "newest"]
    # What the worker's retention (the game's args: keep 1, best 1) does with it:
    store = CheckpointStore(root, keep=1, keep_best=1)
    _commit(root, 400, 1.0)
    store.apply_retention()
    assert [r.step for r in store.committed()] == [100, 200, 400]
    again = rlsup(config, "pin", "pong/s2", "100")  # pinning twice is no change
    assert again.returncode == 0 and read_pins(root) == {100}
    gone = rlsup(config, "pin", "--remove", "pong/s2", "100")
    assert gone.returncode == 0, gone.stderr
    assert read_pins(root) == set()
    store.apply_retention()
    assert [r.step for r in store.committed()] == [200, 400]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["pin", "pong/s2", "250"], ["pong/s2", "step 250", "100, 200", "nothing changed"]),
        (["pin", "pong/s1", "100"], ["pong/s1", "step 100", "none"]),
        (["pin", "pongg", "100"], ["'pongg'", "pong/s1, pong/s2"]),
        (["pin", "--remove", "pong/s2", "200"], ["not pinned", "pinned: 100"]),
        (["pin", "pong/s2", "-3"], ["not a step number"]),
        (["pin", "pong/s2", "ten"], ["not a step number"]),
    ],
)
def test_bad_input_exits_2_and_changes_nothing(
    config: Path, args: list[str], needles: list[str]
) -> None:
    root = config.parent / "state" / "runs" / "pong" / "s2" / "checkpoints"
    for step in (100, 200):
        _commit(root, step, 1.0)
    assert rlsup(config, "pin", "pong/s2", "100").returncode == 0
    before = _snapshot(root), (root / PINS_FILE).read_bytes()
    other = config.parent / "state" / "runs" / "pong" / "s1"
    got = rlsup(config, *args)
    assert got.returncode == 2, got
    for needle in needles:
        assert needle in got.stderr
    assert (_snapshot(root), (root / PINS_FILE).read_bytes()) == before
    assert not other.exists()
