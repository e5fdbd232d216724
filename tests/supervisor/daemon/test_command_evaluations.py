"""A command game's evaluations and hyper-parameters under a real `rlsup run`: an SDK script
declares `params` (RLSUP_PARAMS -> `run.params`), reports evaluations (`run.evaluation()`), is
SIGKILLed right after one and resumed. Each evaluation becomes exactly one `evaluation` event
(none lost at the kill, none doubled by the resume), the time split's evaluation part holds
their seconds, `rlsup results` has its EVAL, ENV and params, `rlsup status` shows the
checkpoint's step while the resumed script has not stepped yet, and a bad `params` in a reload
is refused naming the key, the running game untouched."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from harness.runs import env_for, events, rlsup, start_supervisor, stop_supervisor, wait_for
from supervisor.ledger import accounting
from tests.supervisor.daemon.test_command_games import game_processes, status, write

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HEAD = """\
state_dir = "state"
checkpoint_every_s = 600
stop_grace_s = 10
tick_s = 0.1
[modes.light]
num_envs = 3
batch_size = 16
n_steps = 8
max_concurrent = 2
[restart]
backoff_base_s = 0.2
backoff_max_s = 0.5
budget = 3
budget_window_s = 600
[watchdog]
startup_grace_s = 60
hang_timeout_s = 30
kill_grace_s = 2
"""
PARAMS = 'params = { env_id = "CartPole-v1", lr = 0.0003, double_q = true }'
TOTAL = 6000
SCRIPT = f"""
    import json, time, rlsup
    run = rlsup.attach()
    rd = run.run_dir
    (rd / f"params-{{run.resume_count}}.json").write_text(json.dumps(run.params))
    step = 0
    if (d := run.latest()) is not None:
        step = int((d / "step").read_text())
    if run.resume_count:
        (rd / "resumed").write_text(str(step))
        for _ in range(600):  # resumed, not stepping yet: until the test has looked
            if (rd / "go").exists():
                break
            time.sleep(0.05)
    while step < {TOTAL}:
        step += 10
        time.sleep(0.003)
        run.heartbeat(step, mean_return=step / 1000, loss=1.0 / step)
        if step % 1000 == 0:
            with run.evaluating():
                time.sleep(0.1)
                run.evaluation(step, step / 100, episodes=5, std=0.5)
            with run.checkpoint(step) as d:  # evaluated, then checkpointed: keep_best's order
                (d / "step").write_text(str(step))
            if step == 3000 and run.resume_count == 0:
                (rd / "ready").write_text("")
                time.sleep(600)  # SIGKILLed here, the evaluation at 3000 just reported
        if run.should_stop():
            with run.checkpoint(step) as d:
                (d / "step").write_text(str(step))
"""


def test_evaluations_and_params_of_an_sdk_game_survive_a_kill_exactly_once(
    tmp_path: Path,
) -> None:
    script = write(tmp_path, "train.py", SCRIPT)
    game = (
        f'[[games]]\nname = "mine"\ncommand = {json.dumps([sys.executable, script])}\n'
        f'{PARAMS}\nheartbeat = true\ntotal_steps = {TOTAL}\ndevice = "cpu"\n'
    )
    config = tmp_path / "rlsup.toml"
    config.write_text(HEAD + game)
    state, env = tmp_path / "state", env_for(tmp_path)
    run_dir = state / "runs" / "mine"
    sup = start_supervisor(config, env, "--exit-when-done")
    try:
        wait_for((run_dir / "ready").exists, 60, "the first life at its evaluation of step 3000")
        (first,) = game_processes("mine")
        first.send_signal(signal.SIGKILL)  # before the supervisor need have read that report
        wait_for((run_dir / "resumed").exists, 60, "the game resumed")
        assert (run_dir / "resumed").read_text() == "3000"
        # Resumed, not stepping yet: status shows the checkpoint's step, not 0.
        doc = status(tmp_path, config)["mine"]
        assert doc["global_step"] == 3000, doc
        # A reload with a bad `params` value is refused, naming it; the game runs on untouched.
        (second,) = game_processes("mine")
        good = config.read_text()
        config.write_text(good.replace("lr = 0.0003", "lr = [1, 2]"))
        sup.send_signal(signal.SIGHUP)
        (error,) = wait_for(lambda: events(state, "config_error"), 30, "the reload refused")
        assert "games[0].params.lr" in error["detail"]["message"]
        assert "[1, 2]" in error["detail"]["message"]
        assert [p.pid for p in game_processes("mine")] == [second.pid]
        config.write_text(good)
        (run_dir / "go").write_text("")
        assert sup.wait(120) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        stop_supervisor(sup)
    assert not game_processes("mine")

    # Every evaluation once: the one reported just before the kill too, none doubled.
    evaluations = events(state, "evaluation", "mine")
    assert [e["detail"]["step"] for e in evaluations] == [1000, 2000, 3000, 4000, 5000, 6000]
    assert [e["detail"]["mean"] for e in evaluations] == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert all(e["detail"]["episodes"] == 5 for e in evaluations)
    assert all(0.1 <= e["detail"]["seconds"] < 5 for e in evaluations)
    assert len(events(state, "worker_crash", "mine")) == 1
    # The time split's evaluation part: the seconds the script's evaluations took.
    split = accounting.account(events(state), ["mine"], time.time())["mine"]
    total = sum(e["detail"]["seconds"] for e in evaluations)
    assert split.seconds["evaluation"] == pytest.approx(total, rel=1e-6)

    # params: the script's run.params in both lives, and results' params, EVAL and ENV.
    declared = {"env_id": "CartPole-v1", "lr": 0.0003, "double_q": True}
    for life in (0, 1):
        assert json.loads((run_dir / f"params-{life}.json").read_text()) == declared
    out = rlsup("results", "--json", "--config", str(config), env=env)
    assert out.returncode == 0, out.stderr
    (run,) = json.loads(out.stdout)["runs"]
    assert (run["eval"], run["eval_step"], run["eval_episodes"]) == (60.0, 6000, 5)
    assert run["env_id"] == "CartPole-v1" and run["params"] == declared
    text = rlsup("results", "--config", str(config), env=env).stdout
    assert "mine" in text and "CartPole-v1" in text and "60.0" in text, text
