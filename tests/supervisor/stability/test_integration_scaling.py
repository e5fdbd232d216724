"""Real supervisor + real workers (CartPole PPO): the stability policy and `rlsup scale`.

One supervisor run (restarted once) covers: a crash storm (repeated SIGKILLs, which the policy
reads as kernel OOM kills) steps the host mode down and the worker comes back with the lower
sizes; a short calm period steps it back up; `rlsup scale --mode light` applies within
seconds and survives a restart of the supervisor; `--mode auto` hands the scope back to the
policy. Test-sized durations: calm_s 20 (longer than a worker's
start on a loaded machine), cooldown_s 4, window_s 20 (at the floor, an incident
after the last change is a down trigger until it leaves the window, so a step up takes
max(calm_s, window_s) of quiet).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from harness.runs import (
    env_for,
    events,
    game_toml,
    heartbeat,
    kill_quietly,
    rlsup,
    start_supervisor,
    wait_for,
    worker_pids,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

LIGHT = (4, 64)  # (num_envs, batch_size)
MEDIUM = (8, 128)
CONFIG = f"""\
state_dir = "state"
checkpoint_every_s = 1
stop_grace_s = 20
initial_mode = "medium"
[modes.light]
num_envs = {LIGHT[0]}
batch_size = {LIGHT[1]}
n_steps = 64
max_concurrent = 2
[modes.medium]
num_envs = {MEDIUM[0]}
batch_size = {MEDIUM[1]}
n_steps = 64
max_concurrent = 2
{game_toml("alpha", 10**8)}
[restart]
backoff_base_s = 0.3
backoff_max_s = 1
budget = 10
budget_window_s = 600
stable_after_s = 30
[watchdog]
startup_grace_s = 90
hang_timeout_s = 30
kill_grace_s = 10
[stability]
window_s = 20
calm_s = 20
cooldown_s = 4
"""


def training_at(state: Path, sizes: tuple[int, int], not_pid: int | None = None) -> Any:
    hb = heartbeat(state, "alpha")
    if (
        hb
        and hb["phase"] == "training"
        and hb["global_step"] > 0
        and (hb["num_envs"], hb["batch_size"]) == sizes
        and hb["pid"] != not_pid
    ):
        return hb["pid"]
    return None


def test_crash_storm_steps_down_calm_steps_up_and_pins_survive_a_restart(tmp_path: Path) -> None:
    config = tmp_path / "rlsup.toml"
    config.write_text(CONFIG)
    state = tmp_path / "state"
    env = env_for(tmp_path)
    sup = start_supervisor(config, env)
    procs = [sup]
    try:
        pid = wait_for(lambda: training_at(state, MEDIUM), 90, "alpha training at medium")

        # Crash storm: SIGKILL the worker, then each successor as soon as it exists. Kills from
        # outside are crashes, not kernel OOMs (the kernel log names no such kill): the game
        # steps down after game_failures_to_step (3), the host stays.
        victims = [pid]
        os.kill(pid, signal.SIGKILL)
        for _ in range(2):
            nxt = wait_for(
                lambda: [p for p in worker_pids(state, "alpha") if p not in victims],
                30,
                "a new worker",
            )[0]
            time.sleep(0.5)
            os.kill(nxt, signal.SIGKILL)
            victims.append(nxt)
        pid = wait_for(lambda: training_at(state, LIGHT, victims[-1]), 90, "alpha back at light")
        down = events(state, "scale_down")
        assert len(down) == 1, "one storm, one rung (light is the floor)"
        assert down[0]["detail"]["scope"] == "alpha" and down[0]["game"] == "alpha"
        assert (down[0]["detail"]["from"], down[0]["detail"]["to"]) == ("medium", "light")
        assert "alpha failed 3 times" in down[0]["detail"]["reasons"][0]
        crashes = events(state, "worker_crash", "alpha")
        assert len(crashes) == 3 and all("uptime_s" in c["detail"] for c in crashes)
        assert all(c["detail"]["kernel_oom"] is not True for c in crashes)

        # Calm: no incident for calm_s (20 s): one rung up, and the worker restarts at medium.
        pid = wait_for(lambda: training_at(state, MEDIUM, pid), 90, "alpha back at medium")
        up = events(state, "scale_up")
        assert len(up) == 1 and up[0]["detail"]["to"] == "medium"
        assert "calm" in up[0]["detail"]["reasons"][0]
        assert len(events(state, "worker_crash")) == 3, "a mode change is not a crash"

        # The operator pins light: applied within seconds (a checkpoint and a restart).
        t0 = time.monotonic()
        done = rlsup("scale", "--mode", "light", "--config", str(config), env=env)
        assert done.returncode == 0, done.stderr
        pid = wait_for(lambda: training_at(state, LIGHT, pid), 60, "alpha at the pinned light")
        print(f"pin applied (worker training at the new size) in {time.monotonic() - t0:.1f} s")
        assert events(state, "mode_pinned")[-1]["detail"] == {
            "scope": "*",
            "mode": "light",
            "pinned": True,
        }

        # The pin survives a restart of the supervisor (clean stop and start).
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(60) == 0
        sup = start_supervisor(config, env)
        procs.append(sup)
        pid = wait_for(lambda: training_at(state, LIGHT, pid), 90, "alpha at light after restart")
        time.sleep(2)  # the policy does not undo a pin
        assert training_at(state, LIGHT) == pid

        # `--mode auto` hands the host back to the policy: its automatic mode (medium) applies.
        done = rlsup("scale", "--mode", "auto", "--config", str(config), env=env)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: training_at(state, MEDIUM, pid), 60, "alpha back at the automatic mode")
        assert len(events(state, "scale_down")) == 1 and len(events(state, "scale_up")) == 1

        sup.send_signal(signal.SIGTERM)
        assert sup.wait(60) == 0
    finally:
        for p in procs:
            kill_quietly(p.pid)
        for pid in worker_pids(state, "alpha"):
            kill_quietly(pid)
