"""A real `rlsup run` of a CartPole PPO game on a spot machine that AWS takes: the notice
asks the game to checkpoint, the machine dies (everything SIGKILLed), and the next boot is
`preempted`: the game resumes, no crash is counted, the mode is not stepped down."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.fake_metadata import FakeMetadata
from harness.runs import (
    committed_step,
    env_for,
    events,
    heartbeat,
    kill_quietly,
    query,
    rlsup,
    start_supervisor,
    stop_supervisor,
    training_pid,
    wait_for,
    worker_pids,
    write_config,
)
from training import protocol

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def aws() -> Iterator[FakeMetadata]:
    server = FakeMetadata("aws")
    yield server
    server.close()


def test_a_notice_then_the_machines_loss_is_a_preemption_and_the_game_resumes(
    tmp_path: Path, aws: FakeMetadata
) -> None:
    extra = (
        f'[spare]\nenabled = false\n[preemption]\nprovider = "aws"\nendpoint = "{aws.url}"\n'
        "poll_s = 0.2\n"
    )
    config = write_config(tmp_path, [("cart", 10_000_000)], extra=extra)
    env = env_for(tmp_path)
    state = tmp_path / "state"
    sup = start_supervisor(config, env)
    try:
        wait_for(lambda: training_pid(state, "cart"), 120, "the worker trains")
        wait_for(lambda: committed_step(state, "cart") > 0, 60, "a first checkpoint")
        deadline = aws.post_notice(120)
        request = state / "runs" / "cart" / protocol.CHECKPOINT_REQUEST_FILE
        wait_for(request.exists, 30, "the checkpoint request")
        assert json.loads(request.read_text()) == {
            "reason": "preemption", "deadline": deadline, "provider": "aws",
        }  # fmt: skip
        [notice] = events(state, "preemption_notice")
        assert notice["detail"]["checkpoint_requested"] == ["cart"]
        # The worker serves it within about a minibatch, far inside a GCE-sized 30 s window.
        served = wait_for(
            lambda: (
                ((heartbeat(state, "cart") or {}).get("checkpoint_request") or {}).get("committed")
                and heartbeat(state, "cart")["checkpoint_request"]
            ),  # type: ignore[index]
            30,
            "the checkpoint request served",
        )
        inside = served["committed"] - notice["ts"]
        print(f"notice recorded -> checkpoint committed: {inside:.2f} s (window 30 s)")
        assert inside < 30 and served["latency_s"] < 30
        assert committed_step(state, "cart") >= served["committed_step"]
        status = json.loads(rlsup("status", "--json", "--config", str(config), env=env).stdout)
        assert status["preemption"]["deadline"] == deadline
        text = rlsup("status", "--config", str(config), env=env).stdout
        assert "PREEMPTION  aws terminate in" in text

        # The machine goes: the supervisor and its worker die at once, nothing stops cleanly.
        old_pid = (heartbeat(state, "cart") or {}).get("pid")
        workers = worker_pids(state, "cart")
        kill_quietly(sup.pid)
        sup.wait(10)
        for pid in workers:
            kill_quietly(pid)
    finally:
        stop_supervisor(sup)
    restarts = query(state, "SELECT restarts FROM workers WHERE game = 'cart'")[0][0]
    resumed_from = committed_step(state, "cart")

    (tmp_path / "boot_id").write_text("boot-2\n")  # the new machine
    aws.mode = "calm"
    sup = start_supervisor(config, env)
    try:
        wait_for(lambda: events(state, "preempted"), 60, "the preempted verdict")
        pid = wait_for(  # the new worker's heartbeat, not the one the killed one left
            lambda: training_pid(state, "cart", not_pid=old_pid), 120, "the game trains again"
        )
        hb = json.loads((state / "runs" / "cart" / "heartbeat.json").read_text())
        assert hb["pid"] == pid and (hb["resumed_from_step"] or 0) >= resumed_from
        assert hb["resumed_from_step"] >= served["committed_step"]  # nothing before it lost
        [ev] = events(state, "preempted")
        assert ev["detail"]["previous_boot_id"] == "boot-1" and ev["detail"]["provider"] == "aws"
        assert events(state, "supervisor_start")[-1]["detail"]["after"] == "preempted"
        for kind in ("host_reboot", "worker_crash", "backoff", "scale_down", "fatal"):
            assert events(state, kind) == [], kind
        row = query(state, "SELECT restarts FROM workers WHERE game = 'cart'")[0]
        assert row[0] == restarts
        status = json.loads(rlsup("status", "--json", "--config", str(config), env=env).stdout)
        assert status["preemption"] is None
        assert status["host"]["unexpected_reboots_total"] == 0
    finally:
        stop_supervisor(sup)
        for p in worker_pids(state, "cart"):
            kill_quietly(p, signal.SIGKILL)
    assert not any(os.path.exists(f"/proc/{p}") for p in worker_pids(state, "cart"))
