"""Training diagnostics from real workers: progress.csv columns, TensorBoard tags, curves that
continue without duplicates after a SIGKILL and resume, an old progress.csv header, and a
TensorBoard directory that cannot be written (training goes on)."""

from __future__ import annotations

import csv
import itertools
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from workerutil import REPO, committed_steps, heartbeat, kill, run, start, wait_for

from training.metrics import (
    DQN_COLUMNS,
    PPO_COLUMNS,
    PQN_COLUMNS,
    TB_DIR,
    Means,
    TensorBoardWriter,
    explained_variance,
)
from training.protocol import PROGRESS_COLUMNS

pytestmark = pytest.mark.e2e

CARTPOLE_PPO = (
    "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "64",
    "--batch-size", "64", "--threads", "1",
)  # fmt: skip
CARTPOLE_PQN = (
    "--game", "CartPole-v1", "--algo", "pqn", "--num-envs", "4", "--n-steps", "64",
    "--batch-size", "64", "--threads", "1",
)  # fmt: skip
CARTPOLE_DQN = (
    "--game", "CartPole-v1", "--algo", "dqn", "--num-envs", "4", "--batch-size", "32",
    "--threads", "1", "--learning-starts", "1000", "--buffer-size", "4000",
)  # fmt: skip

PPO_TAGS = {
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "losses/grad_norm",
    "charts/learning_rate",
    "charts/episodic_return",
    "charts/steps_per_second",
    "eval/mean_return",
}
DQN_TAGS = {
    "losses/td_loss",
    "losses/q_values",
    "losses/grad_norm",
    "charts/learning_rate",
    "charts/epsilon",
    "charts/replay_fill",
    "charts/episodic_return",
    "charts/steps_per_second",
    "eval/mean_return",
}
PQN_TAGS = DQN_TAGS - {"charts/replay_fill"}  # no replay buffer


def tb_points(tb: Path, purge: bool = True) -> dict[str, list[tuple[int, float]]]:
    """(step, wall time) per scalar tag as TensorBoard's own loader sees them (purge=True:
    with its purge of orphaned data on a SessionLog START; False: every point in the files)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), purge_orphaned_data=purge)
    acc.Reload()
    return {t: [(e.step, e.wall_time) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def tb_steps(tb: Path, purge: bool = True) -> dict[str, list[int]]:
    return {tag: [s for s, _ in pts] for tag, pts in tb_points(tb, purge).items()}


def progress_rows(run_dir: Path) -> tuple[list[str], list[dict[str, Any]]]:
    with (run_dir / "progress.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def assert_monotonic(steps: dict[str, list[int]]) -> None:
    for tag, seq in steps.items():
        assert all(a < b for a, b in itertools.pairwise(seq)), (tag, seq)


# ---- real workers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algo_args", "columns", "tags"),
    [
        (CARTPOLE_PPO, PPO_COLUMNS, PPO_TAGS),
        (CARTPOLE_DQN, DQN_COLUMNS, DQN_TAGS),
        (CARTPOLE_PQN, PQN_COLUMNS, PQN_TAGS),
    ],
    ids=["ppo", "dqn", "pqn"],
)
def test_worker_writes_diagnostics_to_progress_and_tensorboard(
    tmp_path: Path, algo_args: tuple[str, ...], columns: tuple[str, ...], tags: set[str]
) -> None:
    run_dir = tmp_path / "run"
    proc = run(run_dir, *algo_args, "--total-steps", "8000", "--eval-episodes", "2", timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, rows = progress_rows(run_dir)
    # The old columns first and unchanged (old readers), the diagnostics after them.
    assert header == [*PROGRESS_COLUMNS, *columns]
    last = rows[-1]
    for name in columns:
        assert last[name] != "" and math.isfinite(float(last[name])), (name, last)
    steps = tb_steps(run_dir / TB_DIR)
    assert tags <= set(steps), sorted(tags - set(steps))
    assert_monotonic(steps)
    assert steps["eval/mean_return"][-1] == int(last["global_step"])
    hb = heartbeat(run_dir)
    assert hb is not None and "tensorboard" not in hb["write_failures"]


def test_sigkill_then_resume_continues_the_curves_without_duplicates(tmp_path: Path) -> None:
    run_dir, tb = tmp_path / "run", tmp_path / "run" / TB_DIR
    args = (*CARTPOLE_PPO, "--checkpoint-every-steps", "10000", "--eval-episodes", "0")
    # The first life cannot finish before the test has seen what it waits for (with a total
    # it could reach, a fast host ended it first and the wait ran out): it is only ever killed.
    proc = start(run_dir, *args, "--total-steps", "100000000")
    try:

        def wrote_past_checkpoint() -> bool:
            ckpts = committed_steps(run_dir)
            if not ckpts or not tb.exists():
                return False
            seen = tb_steps(tb, purge=False).get("losses/policy_loss", [])
            return bool(seen) and max(seen) > max(ckpts)

        wait_for(wrote_past_checkpoint, 120, "metrics on disk past a checkpoint", poll=0.3)
    finally:
        kill(proc)
    committed = max(committed_steps(run_dir))
    orphaned = [s for s in tb_steps(tb, purge=False)["losses/policy_loss"] if s > committed]
    assert orphaned, "the killed worker wrote no metrics past its last checkpoint"

    resumed_at = time.time()
    total = committed + 20000
    again = run(run_dir, *args, "--total-steps", str(total), timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    hb = heartbeat(run_dir)
    assert hb is not None and hb["resumed_from_step"] == committed
    assert len(list(tb.glob("events.out.tfevents.*"))) == 2

    raw = tb_steps(tb, purge=False)["losses/policy_loss"]
    assert any(a >= b for a, b in itertools.pairwise(raw)), "no rewind to purge?"
    steps = tb_steps(tb)
    assert {"losses/policy_loss", "charts/steps_per_second", "charts/episodic_return"} <= set(steps)
    assert_monotonic(steps)
    policy = steps["losses/policy_loss"]
    # The resumed worker may log at the same step as the killed one did (same rollout size):
    # tell them apart by when they were written. Past the checkpoint, only the new run's.
    late = [(s, w) for s, w in tb_points(tb)["losses/policy_loss"] if s > committed]
    assert late and all(w >= resumed_at for _, w in late), ("the killed worker's points", late)
    assert [s for s in policy if s < committed], "the curve before the checkpoint is kept"
    assert policy[-1] >= total


def test_progress_csv_with_an_older_header_keeps_its_columns(tmp_path: Path) -> None:
    """A run started by the previous version (fewer columns) and resumed by this one: rows
    keep to the file's header, so every row still parses with it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    old_row = "1700000000.0,1.0,0,0,0.0,,4,64,0"
    (run_dir / "progress.csv").write_text(",".join(PROGRESS_COLUMNS) + "\n" + old_row + "\n")
    proc = run(run_dir, *CARTPOLE_PPO, "--total-steps", "3000", "--eval-episodes", "0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, rows = progress_rows(run_dir)
    assert header == list(PROGRESS_COLUMNS)
    assert len(rows) >= 2
    for row in rows:
        assert None not in row, f"a row with more fields than the header: {row}"
        assert all(row[c] is not None for c in PROGRESS_COLUMNS), row
    assert int(rows[-1]["global_step"]) >= 3000
    assert "losses/policy_loss" in tb_steps(run_dir / TB_DIR), "TensorBoard has them still"


def test_unwritable_tensorboard_dir_does_not_stop_training(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / TB_DIR).write_text("a file where the tb directory would go")
    proc = run(run_dir, *CARTPOLE_PPO, "--total-steps", "6000", "--eval-episodes", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    hb = heartbeat(run_dir)
    assert hb is not None and hb["global_step"] >= 6000
    assert hb["write_failures"].get("tensorboard", 0) >= 1
    assert proc.stderr.count('"tensorboard_write_failed"') == 1, "logged once"
    _, rows = progress_rows(run_dir)
    assert rows[-1]["policy_loss"] != ""


def test_no_tensorboard_flag_writes_no_event_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run(run_dir, *CARTPOLE_PPO, "--total-steps", "2000", "--eval-episodes", "0",
               "--no-tensorboard")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (run_dir / TB_DIR).exists()
    header, _ = progress_rows(run_dir)
    assert header[-len(PPO_COLUMNS) :] == list(PPO_COLUMNS)


def test_worker_import_leaves_tensorboard_out_and_help_lists_the_flag() -> None:
    code = (
        "import sys, training.worker, training.session, training.ppo, training.dqn; "
        "assert 'torch.utils.tensorboard' not in sys.modules; "
        "assert 'tensorboard' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
    out = subprocess.run(
        [sys.executable, "-m", "training.worker", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--no-tensorboard" in out.stdout


# ---- the pieces -------------------------------------------------------------------------------


def test_means_take_once_and_reset() -> None:
    means = Means(("a", "b"))
    assert means.take() == {}
    means.add(torch.tensor(1.0), torch.tensor(10.0))
    means.add(torch.tensor(3.0), torch.tensor(20.0))
    assert means.take() == {"a": 2.0, "b": 15.0}
    assert means.take() == {}


def test_explained_variance() -> None:
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.ones(4)
    assert float(explained_variance(target, target, mask)) == pytest.approx(1.0)
    assert float(explained_variance(torch.full((4,), 2.5), target, mask)) == pytest.approx(0.0)
    assert math.isnan(float(explained_variance(target, torch.ones(4), mask)))


class _Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, event: str, **_: Any) -> None:
        self.warnings.append(event)


def test_tensorboard_writer_failures_are_counted_and_logged_once(tmp_path: Path) -> None:
    blocked = tmp_path / "tb"
    blocked.write_text("not a directory")
    counted: list[int] = []
    log = _Log()
    writer = TensorBoardWriter(blocked, 0, lambda: counted.append(1), log, retry_s=0.0)
    for step in range(1, 4):
        writer.scalars(step, {"losses/x": 1.0})
    writer.close()
    assert len(counted) == 3 and writer.written == 0
    assert log.warnings == ["tensorboard_write_failed"]
