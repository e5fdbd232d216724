"""The time split of a real game's life: a real worker SIGKILLed past its checkpoint, the
supervisor stopped and started again (a pause), periodic evaluations; the parts sum to the wall
time within 1 %, and each part is where the test put it."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from harness.runs import (
    MODES,
    env_for,
    events,
    kill_quietly,
    rlsup,
    start_supervisor,
    stop_supervisor,
    training_pid,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_lifes_time_splits_into_parts_that_sum_to_its_wall_time(tmp_path: Path) -> None:
    config = tmp_path / "rlsup.toml"
    config.write_text(
        # No periodic checkpoint by time: the SIGKILL loses the steps past the last one.
        'state_dir = "state"\ncheckpoint_every_s = 3600\nstop_grace_s = 20\n'
        "cost_per_hour = 3.6\n"
        + MODES.format(max_concurrent=1)
        + '[[games]]\nname = "cart"\nenv_id = "CartPole-v1"\ntotal_steps = 14000\n'
        'device = "cpu"\nargs = { eval_episodes = 3, eval_every_steps = 2048, '
        "checkpoint_every_steps = 4096 }\n"
    )
    env = env_for(tmp_path)
    state = tmp_path / "state"
    sup = start_supervisor(config, env)
    try:
        # Killed between two checkpoints: some steps past the last one are redone.
        pid = wait_for(lambda: training_pid(state, "cart", min_step=5200), 120, "step 5200")
        kill_quietly(pid)
        wait_for(lambda: training_pid(state, "cart", not_pid=pid), 60, "the restart training")
        stop_supervisor(sup)
        stopped = time.time()
        time.sleep(2.0)  # the supervisor down: 2 s
        restarted = time.time()
        sup = start_supervisor(config, env, "--exit-when-done")
        assert sup.wait(180) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.send_signal(signal.SIGTERM)
        stop_supervisor(sup)
    # The supervisor's snapshot (written at its exit) is what status read: the same split a
    # replay of the ledger gives (`rlsup report` below replays it).
    snap = json.loads((state / "accounting.json").read_text())
    assert snap["games"]["cart"]["open"] is None  # done: nothing carried on
    assert (state / "accounting.json").stat().st_mode & 0o007 == 0  # nobody else's
    out = rlsup("status", "--json", "--config", str(config), env=env)
    doc = json.loads(out.stdout)
    [game] = doc["games"]
    t = game["time"]
    parts = ("training", "evaluation", "redone", "setup", "starting", "waiting", "backoff", "down",
             "paused")  # fmt: skip
    assert sum(t[f"{p}_s"] for p in parts) == pytest.approx(t["wall_s"], rel=0.01)
    first = events(state, "worker_start", "cart")[0]["ts"]
    done = events(state, "game_done", "cart")[-1]["ts"]
    assert t["wall_s"] == pytest.approx(done - first, rel=0.01)
    # Where the test put the time: 2 s paused (a clean stop, then a run: the operator's pause,
    # not down and never lost; plus the stop and the start-up, a second or two), restarts,
    # redone steps, evaluations.
    assert (restarted - stopped) <= t["paused_s"] <= (restarted - stopped) + 5.0, t
    assert t["down_s"] == 0.0, t
    kill_exit = next(e for e in events(state, "worker_exit", "cart")
                     if e["detail"]["exit"] == "killed_by_signal")  # fmt: skip
    d = kill_exit["detail"]
    assert t["redone_steps"] == d["global_step"] - d["last_checkpoint_step"] > 0
    assert t["redone_s"] > 0 and t["setup_s"] > 0 and t["starting_s"] > 0
    assert t["evaluation_s"] > 0 and len(events(state, "evaluation", "cart")) >= 4
    assert t["lost_s"] == pytest.approx(
        t["redone_s"] + t["starting_s"] + t["backoff_s"] + t["down_s"], abs=0.01
    )
    # Money: 3.6/h = 0.001/s for the one game alive; its lost part priced the same way.
    assert t["money"] == pytest.approx(0.001 * t["wall_s"], rel=0.01)
    assert t["money_lost"] == pytest.approx(0.001 * t["lost_s"], rel=0.01)
    assert doc["cost"]["lost"] == pytest.approx(t["money_lost"], abs=0.01)

    # `rlsup report`: the same ledger, per day and per game, while the supervisor is down.
    rep = rlsup("report", "--json", "--days", "2", "--config", str(config), env=env)
    assert rep.returncode == 0, rep.stderr
    r = json.loads(rep.stdout)
    assert r["totals"]["wall_s"] == pytest.approx(t["wall_s"], abs=0.01)
    assert r["totals"]["money_lost"] == pytest.approx(t["money_lost"], abs=0.01)
    assert [g["name"] for g in r["games"]] == ["cart"]
    today = r["days"][-1]
    assert today["crashes"] == len(events(state, "worker_crash", "cart")) >= 1
    assert today["lost_s"] == pytest.approx(t["lost_s"], abs=0.5)  # one day (not at midnight)
    assert r["host"]["unexpected_reboots"] == 0 and r["host"]["supervisor_crashes"] == 0
    text = rlsup("report", "--config", str(config), env=env).stdout
    assert "lost to instability" in text and "cart" in text
