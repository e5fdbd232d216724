"""A sweep of a command game (your own script through the SDK): each trial's values reach the
script as `run.params`, its evaluations feed the study, a trial whose script exits 78 is failed
with its message and the sweep goes on, and `rlsup results --sweep` says why."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.runs import env_for, events, query, rlsup, start_supervisor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SCRIPT = """\
import sys
import rlsup

run = rlsup.attach()
width = run.params["width"]
if width == 3:
    print("width 3 is not a width this net takes", file=sys.stderr, flush=True)
    sys.exit(78)
step = 0
if (ckpt := run.latest()) is not None:
    step = int((ckpt / "step").read_text())
while step < 400:
    step += 100
    run.heartbeat(step, mean_return=float(width))
    run.evaluation(step, float(width * step) / 100.0 + run.params["bias"], episodes=1)
    with run.checkpoint(step) as d:
        (d / "step").write_text(str(step))
"""


def test_a_command_sweep_goes_on_past_a_trial_that_exits_78(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "rlsup.toml").write_text(
        f"""\
state_dir = "state"
checkpoint_every_s = 1
stop_grace_s = 5
tick_s = 0.2
[modes.light]
num_envs = 1
batch_size = 1
n_steps = 1
max_concurrent = 2
[[games]]
name = "mine"
command = [{json.dumps(sys.executable)}, "train.py"]
cwd = "."
heartbeat = true
params = {{ bias = 0.5 }}
[games.sweep]
trials = 3
sampler = "grid"
pruner = "none"
params = {{ width = [1, 2, 3] }}
"""
    )
    config, state = tmp_path / "rlsup.toml", tmp_path / "state"
    env = env_for(tmp_path)
    sup = start_supervisor(config, env, "--exit-when-done")
    try:
        rc = sup.wait(150)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait(10)
    log = (tmp_path / "supervisor.log").read_text()
    assert rc == 1, log[-3000:]  # a game ended FATAL: --exit-when-done says so
    ended = {e["detail"]["trial"]: e["detail"] for e in events(state, "sweep_trial")}
    assert sorted(ended) == [0, 1, 2]
    by_width = {d["params"]["width"]: d for d in ended.values()}
    assert by_width[3]["state"] == "fail"
    assert "configuration error" in by_width[3]["message"], by_width[3]
    for width in (1, 2):
        assert by_width[width]["state"] == "complete"
        assert by_width[width]["value"] == pytest.approx(width * 4 + 0.5)  # its last evaluation
    states = {r["game"]: r["state"] for r in query(state, "SELECT game, state FROM workers")}
    assert sorted(states.values()) == ["done", "done", "fatal"]
    out = rlsup("results", "--sweep", "mine", "--config", str(config), env=env)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[1].split()
    assert first[:3] == ["1", by_width[2]["runs"][0], "complete"], out.stdout
    assert "(fail): " in out.stdout and "configuration error" in out.stdout
