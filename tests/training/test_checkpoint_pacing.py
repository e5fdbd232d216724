"""Checkpoint pacing: the interval is `checkpoint_every_s`, stretched so that the last
checkpoint's stall of training is at most 1 % of the time between two, and its write at most
half of it (training.protocol.checkpoint_interval_s). The default interval is 15 s now (what 99 %
goodput under one fault in 20 minutes needs), so a dear checkpoint must not come that often."""

from __future__ import annotations

import json
import signal
from datetime import datetime
from pathlib import Path

import pytest
from workerutil import committed_steps, heartbeat, kill, run, start, wait_for

from training.protocol import (
    DEFAULT_CHECKPOINT_EVERY_S,
    MIN_ADAPTIVE_INTERVAL_S,
    checkpoint_interval_s,
    young_interval_s,
)


def test_the_interval_is_stretched_by_a_dear_stall_or_write_only() -> None:
    assert checkpoint_interval_s(15.0) == 15.0
    assert checkpoint_interval_s(15.0, pause_s=0.004, write_s=0.3) == 15.0  # PPO Atari here
    assert checkpoint_interval_s(15.0, pause_s=2.0, write_s=2.0) == pytest.approx(200.0)
    assert checkpoint_interval_s(15.0, pause_s=0.01, write_s=20.0) == pytest.approx(40.0)
    assert checkpoint_interval_s(600.0, pause_s=2.0) == 600.0  # never sooner than asked
    assert DEFAULT_CHECKPOINT_EVERY_S == 15.0


def test_youngs_rule_shortens_the_interval_on_a_failing_host_only() -> None:
    # sqrt(2 x 8 ms x 20 min) = 4.38 s: a PPO checkpoint under the seeds' reboot rate.
    assert young_interval_s(0.008, 1200.0) == pytest.approx(4.382, abs=1e-3)
    assert checkpoint_interval_s(15.0, 0.004, 0.3, cost_s=0.008, mtbf_s=1200.0) == pytest.approx(
        4.382, abs=1e-3
    )
    # A calm host (a failure a week) or an unknown MTBF: the configured interval, never longer.
    assert checkpoint_interval_s(15.0, cost_s=0.008, mtbf_s=7 * 86400.0) == 15.0
    assert checkpoint_interval_s(15.0, cost_s=0.008, mtbf_s=None) == 15.0
    assert checkpoint_interval_s(15.0, cost_s=None, mtbf_s=1200.0) == 15.0
    # Never below the floor, however often the host fails or however cheap the checkpoint.
    assert checkpoint_interval_s(15.0, cost_s=0.0, mtbf_s=30.0) == MIN_ADAPTIVE_INTERVAL_S
    assert checkpoint_interval_s(1.0, cost_s=0.0, mtbf_s=30.0) == 1.0  # asked for less: as asked
    # Pacing still bounds a dear checkpoint: a 2 s stall is 1 % of 200 s, whatever the MTBF.
    assert checkpoint_interval_s(15.0, 2.0, 2.0, cost_s=2.0, mtbf_s=1200.0) == pytest.approx(200)


@pytest.mark.e2e
def test_a_worker_on_a_failing_host_checkpoints_at_youngs_interval(tmp_path: Path) -> None:
    """Told the host fails every 30 s (`--host-mtbf-s`, what the supervisor reads off its
    ledger), a worker asked for a checkpoint a minute checkpoints every few seconds: Young's
    rule on its own measured cost, at the 2 s floor for a CartPole learner, and it says so."""
    run_dir = tmp_path / "run"
    proc = start(
        run_dir,
        *("--game", "CartPole-v1", "--algo", "ppo", "--threads", "1", "--eval-episodes", "0"),
        *("--checkpoint-every-s", "60", "--host-mtbf-s", "30", "--total-steps", "100000000"),
    )
    try:
        wait_for(lambda: len(committed_steps(run_dir)) >= 3, 60, "three checkpoints in a minute")
        hb = heartbeat(run_dir)
        assert hb is not None
        assert MIN_ADAPTIVE_INTERVAL_S <= hb["checkpoint_interval_s"] < 10, hb
    finally:
        out = kill(proc, signal.SIGTERM)
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    [said] = [x for x in lines if x.get("event") == "checkpoint_interval_adapted"]
    assert said["host_mtbf_s"] == 30.0 and said["checkpoint_every_s"] == 60.0, said
    assert MIN_ADAPTIVE_INTERVAL_S <= said["interval_s"] < 10, said


@pytest.mark.e2e
def test_a_worker_asked_to_checkpoint_every_iteration_paces_itself(tmp_path: Path) -> None:
    """Asked for a checkpoint every 10 ms, a DQN worker whose replay buffer takes tens of ms to
    write takes one at most every two writes' time (and says so): before pacing it took one
    per iteration, its background writer never idle."""
    run_dir = tmp_path / "run"
    out = run(
        run_dir,
        *("--game", "CartPole-v1", "--algo", "dqn", "--num-envs", "4", "--threads", "1"),
        *("--eval-episodes", "0", "--batch-size", "32", "--buffer-size", "50000"),
        *("--learning-starts", "200", "--checkpoint-every-s", "0.01", "--total-steps", "6000"),
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [json.loads(x) for x in (out.stdout + out.stderr).splitlines() if x.startswith("{")]
    ckpts = [x for x in lines if x.get("event") == "checkpoint"]
    paced = [x for x in lines if x.get("event") == "checkpoint_paced"]
    assert len(ckpts) >= 3 and paced, [x.get("event") for x in lines]
    assert all(p["interval_s"] >= 2 * p["seconds"] - 1e-3 for p in paced)
    # Each checkpoint (but the final one, taken at the end whatever the pace) was captured no
    # sooner after its predecessor's capture than the predecessor's cost allowed. The log's
    # time is when each committed, `seconds` after its capture began.
    captured = [datetime.fromisoformat(c["timestamp"]).timestamp() - c["seconds"] for c in ckpts]
    for i in range(1, len(ckpts) - 1):
        prev = ckpts[i - 1]
        want = checkpoint_interval_s(0.01, prev["pause_s"], prev["seconds"])
        assert captured[i] - captured[i - 1] >= want - 0.02, (prev, ckpts[i])
    hb = heartbeat(run_dir)
    assert hb is not None and hb["checkpoint_interval_s"] > 0.01
