"""A checkpoint request (a preemption notice) mid-iteration: served within about a minibatch.

Real worker processes on CartPole, each configured with iterations of several seconds and a
checkpoint interval that never comes, so that every checkpoint seen is the request's (or the
stop's). The watch itself is tested with a fake clock first.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from workerutil import committed_steps, heartbeat, kill, run, start, wait_for

from checkpoints import CheckpointStore
from training import protocol as P
from training.checkpoint_request import RETRY_FAILED_S, CheckpointRequestWatch

pytestmark = pytest.mark.e2e

NEVER = ("--checkpoint-every-s", "1000000", "--eval-episodes", "0", "--threads", "1")
# Rollout 64 x 512 = 32768 steps (~0.5 s), then 12 epochs x 128 minibatches of 256 (~2 ms
# each): an iteration of 6 s or more on a CPU, nearly all of it update.
PPO_LONG = (
    "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "64", "--n-steps", "512",
    "--batch-size", "256", "--epochs", "12", *NEVER,
)  # fmt: skip
PPO_ROLLOUT = 64 * 512
# PQN with a long rollout (4 x 8192 steps, several seconds) and a short update: a request a
# second into an iteration lands in its rollout.
PQN_LONG_ROLLOUT = (
    "--game", "CartPole-v1", "--algo", "pqn", "--num-envs", "4", "--n-steps", "8192",
    "--batch-size", "256", "--epochs", "2", *NEVER,
)  # fmt: skip
PQN_ROLLOUT = 4 * 8192
# DQN, one env: 256 env steps per iteration, each followed by 16 gradient steps of 128.
DQN_LONG = (
    "--game", "CartPole-v1", "--algo", "dqn", "--num-envs", "1", "--dqn-batch-size", "128",
    "--buffer-size", "10000", "--learning-starts", "64", "--train-frequency", "1",
    "--gradient-steps", "16", *NEVER,
)  # fmt: skip
FOREVER = ("--total-steps", "100000000")


# ---- the watch, with a fake clock -----------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Stop:
    def __init__(self) -> None:
        self.reason: str | None = None

    def __bool__(self) -> bool:
        return self.reason is not None


def _watch(
    tmp_path: Path, satisfied_at: float | None = None, environ: dict[str, str] | None = None
) -> tuple[CheckpointRequestWatch, FakeClock, Stop, list[dict[str, Any]]]:
    clock, stop, reports = FakeClock(), Stop(), []
    watch = CheckpointRequestWatch(
        tmp_path, stop, satisfied_at, reports.append, clock=clock, environ=environ or {}
    )
    return watch, clock, stop, reports


def _request(run_dir: Path, mtime: float, **payload: Any) -> None:
    path = run_dir / P.CHECKPOINT_REQUEST_FILE
    path.write_text(json.dumps(payload) if payload else "")
    os.utime(path, (mtime, mtime))


def test_watch_stats_the_file_at_most_every_poll_interval(tmp_path: Path) -> None:
    watch, clock, _, reports = _watch(tmp_path)
    assert not watch.interrupt()
    _request(tmp_path, time.time())
    assert not watch.interrupt()  # within the poll interval: the file is not looked at
    clock.now += 0.06
    assert watch.interrupt() and watch.due()
    assert len(reports) == 1 and reports[0]["committed_step"] is None  # seen, in the heartbeat


def test_one_checkpoint_satisfies_a_request_however_long_the_file_stays(tmp_path: Path) -> None:
    watch, clock, _, reports = _watch(tmp_path)
    made = time.time() - 5
    _request(tmp_path, made, reason="preemption", deadline=made + 30, provider="gcp")
    assert watch.interrupt()
    watch.note_cut("update")
    watch.committed(made - 1, 100)  # captured before the request: not it
    assert watch.due()
    watch.committed(made + 0.5, 200)
    assert not watch.due()
    served = reports[-1]
    assert served["committed_step"] == 200 and served["cut"] == "update"
    assert served["reason"] == "preemption" and served["provider"] == "gcp"
    assert served["deadline"] == made + 30 and served["latency_s"] >= 5
    for _ in range(3):  # the file stays: no second forced checkpoint
        clock.now += 1
        assert not watch.interrupt()
    _request(tmp_path, made + 2)  # a newer request is a new one
    clock.now += 1
    assert watch.interrupt()


def test_a_request_older_than_the_loaded_checkpoint_is_already_satisfied(tmp_path: Path) -> None:
    _request(tmp_path, 1000.0)
    watch, _, _, reports = _watch(tmp_path, satisfied_at=1000.5)
    assert not watch.interrupt() and not reports


def test_a_request_first_seen_after_a_checkpoint_captured_after_it_is_reported_served(
    tmp_path: Path,
) -> None:
    """The request is written, a periodic checkpoint captures the state and commits before the
    loop next looks at the file: that checkpoint serves it, and the heartbeat must say so (the
    supervisor and operators wait for `committed`), not stay silent forever."""
    watch, clock, _, reports = _watch(tmp_path)
    made = time.time() - 2
    watch.committed(made - 5, 50)  # an older checkpoint
    _request(tmp_path, made, reason="preemption", deadline=made + 30, provider="aws")
    watch.committed(made + 0.01, 100)  # captured after the request was made
    clock.now += 1
    assert not watch.interrupt()  # nothing owed
    [served] = reports
    assert served["committed_step"] == 100 and served["committed"] >= made
    assert served["reason"] == "preemption" and 0 <= served["latency_s"] < 30
    clock.now += 1
    assert not watch.interrupt() and len(reports) == 1  # reported once


def test_a_failed_forced_checkpoint_is_retried_later_not_every_minibatch(tmp_path: Path) -> None:
    watch, clock, _, _ = _watch(tmp_path)
    _request(tmp_path, time.time())
    assert watch.interrupt()
    watch.failed()
    clock.now += 1
    assert not watch.interrupt()
    clock.now += RETRY_FAILED_S
    assert watch.interrupt()


def test_a_stop_cuts_the_iteration_only_when_a_deadline_is_known(tmp_path: Path) -> None:
    watch, clock, stop, _ = _watch(tmp_path)
    stop.reason = "SIGTERM"
    assert not watch.interrupt()  # a plain stop waits for the iteration's end, as always
    deadline = time.time() + 30
    _request(tmp_path, time.time() - 1, reason="preemption", deadline=deadline)
    clock.now += 1
    assert watch.interrupt()
    watch.committed(time.time(), 10)  # served already: the deadline still stands
    assert not watch.due() and watch.deadline == deadline and watch.interrupt()
    from_env, _, env_stop, _ = _watch(tmp_path / "none", environ={P.PREEMPTION_DEADLINE_ENV: "5"})
    env_stop.reason = "SIGTERM"
    assert from_env.interrupt()


# ---- real workers ---------------------------------------------------------------------------


def _first_iteration(run_dir: Path, proc: Any) -> tuple[float, float]:
    """Wait for the first iteration's end: (its duration, when it ended), monotonic."""

    def done() -> bool:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        return "first_step" in ((heartbeat(run_dir) or {}).get("start") or {})

    wait_for(done, 240, "the first iteration")
    marks = (heartbeat(run_dir) or {})["start"]
    return marks["first_step"] - marks["loaded"], marks["first_step"]


def _write_request(run_dir: Path, **payload: Any) -> float:
    """As the supervisor does: atomically, a JSON object. Returns when (Unix seconds)."""
    tmp = run_dir / ".checkpoint.request.tmp"
    tmp.write_text(json.dumps(payload))
    made = time.time()
    os.replace(tmp, run_dir / P.CHECKPOINT_REQUEST_FILE)
    return made


def _served(run_dir: Path, made: float, timeout: float = 60) -> tuple[int, float, dict[str, Any]]:
    """Wait for the first committed checkpoint: (its step, seconds since `made`, the
    heartbeat's report of the request)."""
    wait_for(lambda: bool(committed_steps(run_dir)), timeout, "the requested checkpoint", 0.01)
    seen_s = time.time() - made
    step = committed_steps(run_dir)[0]
    wait_for(
        lambda: (
            ((heartbeat(run_dir) or {}).get("checkpoint_request") or {}).get("committed_step")
            is not None
        ),
        10,
        "the served request in the heartbeat",
    )
    report = (heartbeat(run_dir) or {})["checkpoint_request"]
    return step, seen_s, report


def _say(algo: str, iteration_s: float, seen_s: float, report: dict[str, Any]) -> None:
    """The measurement, for the record (pytest -s shows it)."""
    print(
        f"\n{algo} CartPole: iteration {iteration_s:.2f} s, request -> committed {seen_s:.3f} s "
        f"(worker: {report['latency_s']} s, cut: {report['cut']})"
    )


def _progress_steps(run_dir: Path) -> list[int]:
    try:
        lines = (run_dir / P.PROGRESS_FILE).read_text().splitlines()[1:]
    except OSError:
        return []
    return [int(line.split(",")[2]) for line in lines if line.count(",") >= 2]


def _verified_state(run_dir: Path, step: int) -> dict[str, Any]:
    """Load the checkpoint at `step` as the worker would (manifest verified, weights only)."""
    loaded = CheckpointStore(run_dir / "checkpoints").load_latest()
    assert loaded is not None and loaded.step == step
    counters: dict[str, Any] = loaded.read_json("state.json")
    with loaded.open("learner.pt") as f:
        blob = torch.load(f, map_location="cpu", weights_only=True)
    assert blob["learner"]["global_step"] == counters["global_step"] == step
    return blob["learner"]


def test_ppo_serves_a_request_mid_update_within_a_minibatch_and_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start(run_dir, *PPO_LONG, *FOREVER)
    try:
        iteration_s, ended = _first_iteration(run_dir, proc)
        time.sleep(max(0.0, ended + 2.0 - time.monotonic()))  # into the second one's update
        made = _write_request(run_dir, reason="preemption", provider="gcp")
        step, seen_s, report = _served(run_dir, made)
        _say("PPO", iteration_s, seen_s, report)
        assert seen_s < 3.0 and seen_s < iteration_s / 2, (seen_s, iteration_s)
        assert report["reason"] == "preemption" and report["committed_step"] == step
        assert report["cut"] in ("update", "rollout")
        # global_step is what the params learned from: whole rollouts only.
        assert step % PPO_ROLLOUT == 0 and step >= PPO_ROLLOUT
        # It trains on, and the standing file asks for nothing more.
        wait_for(lambda: max(_progress_steps(run_dir), default=0) > step, 120, "training on")
        assert proc.poll() is None
        assert committed_steps(run_dir) == [step]
    finally:
        kill(proc)
    state = _verified_state(run_dir, step)
    if report["cut"] == "update":  # the first iteration whole, the second cut short
        assert 12 * 128 < state["updates"] < 2 * 12 * 128
    # A resume from it trains one more iteration to the end (the file still stands).
    again = run(run_dir, *PPO_LONG, "--total-steps", str(step + PPO_ROLLOUT))
    assert again.returncode == 0, again.stdout[-3000:]
    hb = heartbeat(run_dir)
    assert hb is not None and hb["resumed_from_step"] == step
    assert committed_steps(run_dir)[-1] == hb["global_step"] == step + PPO_ROLLOUT
    assert '"checkpoint_requested"' not in again.stdout + again.stderr  # satisfied already


def test_pqn_abandons_the_rollout_and_a_stop_with_a_deadline_exits_75_at_once(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    proc = start(run_dir, *PQN_LONG_ROLLOUT, *FOREVER)
    try:
        iteration_s, ended = _first_iteration(run_dir, proc)
        time.sleep(max(0.0, ended + 1.0 - time.monotonic()))  # into the second rollout
        made = _write_request(run_dir, reason="preemption", deadline=time.time() + 30)
        step, seen_s, report = _served(run_dir, made)
        _say("PQN", iteration_s, seen_s, report)
        assert seen_s < 3.0, seen_s
        assert report["cut"] == "rollout"
        assert step == PQN_ROLLOUT  # the abandoned rollout's steps are not counted
        time.sleep(0.5)  # into the next rollout, then the machine's stop
        t0 = time.monotonic()
        out = kill(proc, signal.SIGTERM)
        stop_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            kill(proc)
    print(f"PQN CartPole: SIGTERM -> exit {proc.returncode} in {stop_s:.2f} s")
    assert proc.returncode == 75, out[-3000:]
    assert stop_s < 5.0 and stop_s < iteration_s
    hb = heartbeat(run_dir)
    assert hb is not None and hb["global_step"] == step
    assert committed_steps(run_dir) == [step]  # nothing learned since: no second checkpoint
    _verified_state(run_dir, step)


def test_dqn_serves_a_touched_request_between_gradient_steps(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start(run_dir, *DQN_LONG, *FOREVER)
    try:
        iteration_s, ended = _first_iteration(run_dir, proc)
        time.sleep(max(0.0, ended + 1.5 - time.monotonic()))
        made = time.time()
        (run_dir / P.CHECKPOINT_REQUEST_FILE).touch()  # an operator's request: no JSON at all
        step, seen_s, report = _served(run_dir, made)
        _say("DQN", iteration_s, seen_s, report)
        assert seen_s < 3.0 and seen_s < iteration_s / 2, (seen_s, iteration_s)
        assert report["cut"] in ("gradient_steps", "env_steps") and report["reason"] is None
        assert 256 < step < 512  # mid-iteration: every env step taken counts (in the replay)
        wait_for(lambda: max(_progress_steps(run_dir), default=0) >= 512, 120, "training on")
        assert committed_steps(run_dir) == [step]
    finally:
        kill(proc)
    state = _verified_state(run_dir, step)
    assert state["updates"] <= (step - 64) * 16  # those due and not taken are caught up later
    again = run(run_dir, *DQN_LONG, "--total-steps", str(step + 16))
    assert again.returncode == 0, again.stdout[-3000:]
    hb = heartbeat(run_dir)
    assert hb is not None and hb["resumed_from_step"] == step
    assert committed_steps(run_dir)[-1] == hb["global_step"] == step + 16


def test_a_plain_stop_still_finishes_its_iteration(tmp_path: Path) -> None:
    """No deadline known: SIGTERM waits for the iteration's end and checkpoints it whole."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, *PPO_LONG, *FOREVER)
    try:
        _first_iteration(run_dir, proc)
        time.sleep(1.5)
        out = kill(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            kill(proc)
    assert proc.returncode == 75, out[-3000:]
    assert committed_steps(run_dir) == [2 * PPO_ROLLOUT]
    state = _verified_state(run_dir, 2 * PPO_ROLLOUT)
    assert state["updates"] == 2 * 12 * 128  # every minibatch of both iterations


def test_a_request_during_an_evaluation_cuts_it_and_is_served_at_once(tmp_path: Path) -> None:
    """An evaluation can take minutes (Atari's full games): a notice landing in one abandons
    it, checkpoints, and evaluates again after the next iteration; nothing of the cut one is
    recorded."""
    run_dir = tmp_path / "run"
    args = (
        "--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "128",
        "--batch-size", "128", "--checkpoint-every-s", "1000000", "--threads", "1",
        "--eval-every-steps", "1024", "--eval-episodes", "200000", "--eval-budget-s", "600",
        *FOREVER,
    )  # fmt: skip
    proc = start(run_dir, *args)
    try:
        wait_for(
            lambda: (heartbeat(run_dir) or {}).get("phase") == P.Phase.EVALUATING.value,
            180,
            "an evaluation under way",
        )
        time.sleep(1.0)
        made = _write_request(run_dir, reason="preemption", provider="gcp")
        step, seen_s, report = _served(run_dir, made)
        print(f"\nrequest during an evaluation -> committed {seen_s:.3f} s")
        assert seen_s < 3.0, seen_s
        assert step >= 1024 and report["committed_step"] == step
        wait_for(
            lambda: (heartbeat(run_dir) or {}).get("phase") == P.Phase.EVALUATING.value,
            60,
            "the evaluation again, after the next iteration",
        )
        assert not (run_dir / P.EVAL_FILE).exists()  # the cut one recorded nothing
        assert (heartbeat(run_dir) or {}).get("eval") is None
    finally:
        out = kill(proc)
    assert '"evaluation_interrupted"' in out, out[-3000:]
