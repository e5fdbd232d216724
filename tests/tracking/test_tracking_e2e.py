"""The tracking bridge in a real `rlsup run`: a command game (the SDK) SIGKILLed mid-run and
resumed shows one continuous curve, no step twice or backwards, in MLflow (its client reading
the history back) and in TensorBoard (its own event reader), in one MLflow run; and a script
that calls `wandb.init()` (offline, the real package) continues one W&B run across a kill."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from harness.runs import (
    committed_step,
    env_for,
    events,
    heartbeat,
    kill_quietly,
    query,
    start_supervisor,
    stop_supervisor,
    training_pid,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HEAD = """\
state_dir = "state"
checkpoint_every_s = 0.5
stop_grace_s = 15
tick_s = 0.2
[modes.light]
num_envs = 2
batch_size = 8
n_steps = 4
max_concurrent = 1
[restart]
backoff_base_s = 0.2
backoff_max_s = 1
[watchdog]
startup_grace_s = 60
hang_timeout_s = 60
"""

SDK_SCRIPT = """\
import json, time
import rlsup
import rlsup._run

rlsup._run.PROGRESS_EVERY_S = 0.1  # a progress row every 0.1 s (10 s by default)
run = rlsup.attach()
step = 0
if (ckpt := run.latest()) is not None:
    step = json.loads((ckpt / "s.json").read_text())["step"]
while step < run.total_steps:
    time.sleep(0.01)
    step += 10
    # The loss tells the life that wrote it: a redone step must carry the new life's value.
    run.heartbeat(step, loss=run.resume_count * 1000 + step / 1000, mean_return=1.0)
    stop = run.should_stop()
    if stop or run.should_checkpoint(step) or step >= run.total_steps:
        with run.checkpoint(step) as d:
            (d / "s.json").write_text(json.dumps({"step": step}))
    if stop:
        run.exit_stopped()
"""


def test_a_killed_command_game_is_one_continuous_curve_in_mlflow_and_tensorboard(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "train.py").write_text(SDK_SCRIPT)
    config = tmp_path / "rlsup.toml"
    config.write_text(
        HEAD
        + f'[[games]]\nname = "mine"\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n'
        + f"cwd = {json.dumps(str(tmp_path))}\ntotal_steps = 6000\nseed = 1\n"
        + 'device = "cpu"\nknobs = []\nparams = { lr = 0.001, arch = "mlp" }\n'
        + '[tracking]\nmlflow = { experiment = "e2e" }\n'
    )
    state = tmp_path / "state"
    sup = start_supervisor(config, env_for(tmp_path), "--exit-when-done")
    try:
        wait_for(lambda: committed_step(state, "mine") >= 1500, 60, "checkpoints past step 1500")
        pid = wait_for(lambda: training_pid(state, "mine"), 30, "the script training")
        kill_quietly(pid, signal.SIGKILL)
        hb = wait_for(
            lambda: (h := heartbeat(state, "mine")) and h["pid"] != pid and h["global_step"] and h,
            60,
            "the script training again",
        )
        resumed = hb["resumed_from_step"]
        assert resumed is not None and resumed >= 1500
        assert sup.wait(90) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        stop_supervisor(sup)
    assert not events(state, "tracking_failed"), events(state, "tracking_failed")
    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    [only] = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    history = client.get_metric_history(only.info.run_id, "loss")
    steps = [m.step for m in history]
    assert steps == sorted(set(steps)), "a doubled or backward step"
    assert len(steps) > 20 and steps[-1] >= 5000
    # Past the resume point, every value is the second life's (the first's were superseded).
    assert all(m.value >= 1000 for m in history if m.step > resumed)
    assert all(m.value < 1000 for m in history if m.step <= resumed)
    assert only.info.status == "FINISHED"
    assert only.data.tags["rlsup.final_checkpoint"].endswith("ckpt-000000006000")
    assert (only.data.tags["game"], only.data.tags["rlsup.kind"]) == ("mine", "command")
    acc = EventAccumulator(str(state / "runs" / "mine" / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == steps
    # The declared params: MLflow's parameters, TensorBoard's hparams (written once).
    from tensorboard.plugins.hparams import metadata

    assert only.data.params == {"lr": "0.001", "arch": "mlp"}
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert {k: v.string_value or v.number_value for k, v in start.hparams.items()} == {
        "lr": 0.001, "arch": "mlp",
    }  # fmt: skip


WANDB_SCRIPT = """\
import os, time
import wandb

run = wandb.init(project="rlsup-e2e", mode="offline")
with open(os.environ["LIVES"], "a") as f:
    f.write(f"{run.id} {run.group} {run.name}\\n")
for i in range(100000):
    run.log({"x": i})
    time.sleep(0.05)
"""


def test_wandb_init_continues_one_run_across_a_kill(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    (tmp_path / "train.py").write_text(WANDB_SCRIPT)
    lives = tmp_path / "lives.txt"
    env = {"LIVES": str(lives), "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    config = tmp_path / "rlsup.toml"
    config.write_text(
        HEAD
        + '[[games]]\nname = "wb"\nseeds = [3]\n'
        + f'command = [{json.dumps(sys.executable)}, "train.py"]\n'
        + f"cwd = {json.dumps(str(tmp_path))}\nheartbeat = false\n"
        + f'device = "cpu"\nknobs = []\nenv = {json.dumps(env).replace(":", " =")}\n'
        + "[tracking]\ntensorboard = false\n"
    )
    base = env_for(tmp_path)
    for key in [k for k in base if k.startswith("WANDB_")]:
        del base[key]
    state = tmp_path / "state"
    sup = start_supervisor(config, base)
    try:
        wait_for(lambda: lives.exists() and lives.read_text().count("\n") == 1, 60, "a W&B run")
        [row] = query(state, "SELECT pid FROM workers WHERE game = 'wb/s3'")
        os.killpg(row["pid"], signal.SIGKILL)  # the script and its wandb service
        wait_for(lambda: lives.read_text().count("\n") == 2, 60, "the second life's W&B run")
    finally:
        stop_supervisor(sup)
    first, second = lives.read_text().splitlines()
    assert first == second, "a new W&B run after the restart"
    run_id, group, name = first.split()
    assert run_id == (state / "runs" / "wb" / "s3" / "wandb_run_id").read_text().strip()
    assert (group, name) == ("wb", "wb/s3")
    # W&B's offline run dirs, one per life: every one is this run's. When both lives start in
    # the same second W&B names the second one's dir `<the first's>-1` (CI saw it).
    dirs = [d.name for d in (tmp_path / "wandb").glob("offline-run-*")]
    ours = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?")
    assert dirs and all(ours.fullmatch(d) for d in dirs), dirs


def test_a_killed_builtin_cartpole_is_one_mlflow_run_with_its_params_and_evaluations(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    config = tmp_path / "rlsup.toml"
    config.write_text(
        HEAD
        + '[[games]]\nname = "cart"\nenv_id = "CartPole-v1"\nalgo = "ppo"\n'
        + 'total_steps = 16384\nseed = 1\ndevice = "cpu"\n'
        + "args = { eval_episodes = 2, eval_every_steps = 4096, tensorboard = false }\n"
        + '[tracking]\nmlflow = { experiment = "builtin" }\n'
    )
    state = tmp_path / "state"
    sup = start_supervisor(config, env_for(tmp_path), "--exit-when-done")
    try:
        wait_for(lambda: committed_step(state, "cart") > 0, 90, "a periodic checkpoint")
        pid = wait_for(lambda: training_pid(state, "cart"), 30, "the worker training")
        kill_quietly(pid, signal.SIGKILL)
        assert sup.wait(120) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        stop_supervisor(sup)
    assert events(state, "worker_crash", "cart") or events(state, "restart", "cart")
    assert not events(state, "tracking_failed")
    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    [only] = client.search_runs([client.get_experiment_by_name("builtin").experiment_id])
    for key in ("sps", "policy_loss", "eval/mean_return"):
        steps = [m.step for m in client.get_metric_history(only.info.run_id, key)]
        assert steps and steps == sorted(set(steps)), (key, steps)
    assert only.data.params["game"] == "CartPole-v1" and only.data.params["seed"] == "1"
    assert "run_dir" not in only.data.params  # the run's plumbing is no hyper-parameter
    assert only.data.tags["rlsup.kind"] == "builtin" and only.info.status == "FINISHED"
    newest = committed_step(state, "cart")
    assert newest >= 16384 - 1024  # the last iteration's step, at or past total_steps' reach
    assert only.data.tags["rlsup.final_checkpoint"].endswith(f"ckpt-{newest:012d}")
