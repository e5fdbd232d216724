"""rlsup.sb3: real Stable-Baselines3 training, checkpointed through the SDK, killed and resumed.

The examples run as real processes with the environment the supervisor gives a command game
(RLSUP_RUN_DIR, RLSUP_CHECKPOINT_EVERY_S); the in-process tests compare a restored model with
the one saved, tensor by tensor and array by array."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

import rlsup
from rlsup.sb3 import PARAMS_FILE, STATE_FILE, STATE_JSON, RlsupCallback, replay_digest, resume
from tests.sdk.sb3_helpers import (
    EXAMPLES,
    ROOT,
    Script,
    assert_no_pickled_objects,
    committed,
    heartbeat_step,
    read_json,
    stdout_fields,
    wait_for,
)
from training import protocol as P

pytestmark = pytest.mark.e2e

DQN_SCRIPT = EXAMPLES / "sb3_dqn_cartpole.py"
MUJOCO_SCRIPT = EXAMPLES / "sb3_mujoco.py"
NO_TIMER = {P.CHECKPOINT_EVERY_S_ENV: "3600"}  # checkpoints by steps only: deterministic


def test_import_rlsup_does_not_import_torch_or_sb3() -> None:
    code = (
        "import sys, rlsup; bad = [m for m in ('torch', 'stable_baselines3') if m in "
        "sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dqn_killed_after_a_checkpoint_resumes_its_steps_and_replay_then_finishes(
    tmp_path: Path,
) -> None:
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    args = ["--total-steps", "7000", "--checkpoint-every-steps", "1500", "--print-digest"]
    with Script(DQN_SCRIPT, args, run_dir, logs, **NO_TIMER) as first:
        # Past its first checkpoint and well into the next interval: then SIGKILL.
        wait_for(lambda: bool(committed(run_dir)) and heartbeat_step(run_dir) > 2000, first)
        first.proc.send_signal(signal.SIGKILL)
        assert first.wait(30) == -signal.SIGKILL
    step, ckpt = committed(run_dir)[-1]
    assert step >= 1500
    saved = read_json(ckpt / STATE_JSON)
    assert saved["counters"]["num_timesteps"] == step
    assert saved["counters"]["_n_calls"] == step  # DQN's target-update clock
    assert saved["replay"]["size"] == step and saved["replay"]["pos"] == step
    assert_no_pickled_objects(ckpt)

    with Script(DQN_SCRIPT, args, run_dir, logs, **NO_TIMER) as second:
        assert second.wait(60) == 0, second.output()
    resumed = stdout_fields(second.stdout(), "resumed")
    # From the newest checkpoint, not from zero: its steps, its buffer, byte for byte.
    assert int(resumed["step"]) == step
    assert int(resumed["replay_size"]) == saved["replay"]["size"]
    assert resumed["replay_sha256"] == saved["replay"]["sha256"]
    assert float(resumed["exploration_rate"]) == pytest.approx(
        saved["counters"]["exploration_rate"], abs=1e-6
    )
    assert stdout_fields(second.stdout(), "finished") == {"step": "7000"}
    final_step, final = committed(run_dir)[-1]
    assert final_step == 7000  # learn() ended: the final model is a checkpoint too
    final_state = read_json(final / STATE_JSON)
    assert final_state["counters"]["_n_calls"] == 7000
    assert final_state["counters"]["_total_timesteps"] == 7000
    assert final_state["episodes"] > saved["episodes"]
    assert_no_pickled_objects(final)


def test_sigterm_saves_a_final_checkpoint_exits_75_and_resumes_from_it(tmp_path: Path) -> None:
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    args = ["--total-steps", "1000000", "--print-digest"]
    with Script(DQN_SCRIPT, args, run_dir, logs, **NO_TIMER) as first:
        wait_for(lambda: heartbeat_step(run_dir) > 1500, first)  # learning has started
        assert committed(run_dir) == []
        first.proc.send_signal(signal.SIGTERM)
        assert first.wait(30) == P.ExitCode.STOPPED, first.output()
    [(step, ckpt)] = committed(run_dir)
    hb = P.read_heartbeat(run_dir)
    assert hb is not None and hb.phase == "stopping" and hb.last_checkpoint_step == step
    saved = read_json(ckpt / STATE_JSON)
    # The state before the step the stop was seen at: one consistent step count everywhere.
    assert saved["counters"]["num_timesteps"] == step == saved["replay"]["size"]
    assert saved["counters"]["_n_calls"] == step and saved["counters"]["_n_updates"] > 0
    assert_no_pickled_objects(ckpt)

    args = ["--total-steps", str(step + 400), "--print-digest"]
    with Script(DQN_SCRIPT, args, run_dir, logs, **NO_TIMER) as second:
        assert second.wait(60) == 0, second.output()
    resumed = stdout_fields(second.stdout(), "resumed")
    assert int(resumed["step"]) == step
    assert resumed["replay_sha256"] == saved["replay"]["sha256"]
    assert committed(run_dir)[-1][0] == step + 400


def test_mujoco_sac_killed_after_a_checkpoint_resumes_and_finishes(tmp_path: Path) -> None:
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    args = ["--algo", "sac", "--total-steps", "2200", "--checkpoint-every-steps", "700"]
    with Script(MUJOCO_SCRIPT, args, run_dir, logs, **NO_TIMER) as first:
        wait_for(lambda: bool(committed(run_dir)) and heartbeat_step(run_dir) > 900, first)
        first.proc.send_signal(signal.SIGKILL)
        assert first.wait(30) == -signal.SIGKILL
    step, ckpt = committed(run_dir)[-1]
    saved = read_json(ckpt / STATE_JSON)
    assert saved["algo"] == "SAC" and saved["counters"]["num_timesteps"] == step >= 700
    assert saved["replay"]["size"] == step
    # SAC's entropy coefficient lives outside its modules: saved as a tensor, no pickle.
    extra = torch.load(ckpt / STATE_FILE, weights_only=True)
    assert set(extra["variables"]) == {"log_ent_coef"}
    assert_no_pickled_objects(ckpt)

    with Script(MUJOCO_SCRIPT, args, run_dir, logs, **NO_TIMER) as second:
        assert second.wait(60) == 0, second.output()
    assert int(stdout_fields(second.stdout(), "resumed")["step"]) == step
    assert stdout_fields(second.stdout(), "finished") == {"step": "2200"}
    assert committed(run_dir)[-1][0] == 2200


# ---- in process: what comes back is what was saved --------------------------------------------


def _build(algo: str, seed: int = 3) -> tuple[type[BaseAlgorithm], Any, dict[str, Any]]:
    net = {"net_arch": [16, 16]}
    if algo == "dqn":
        env = make_vec_env("CartPole-v1", n_envs=2, seed=seed)
        kw = {"learning_starts": 100, "buffer_size": 1000, "target_update_interval": 50}
        return (
            DQN,
            env,
            {"policy_kwargs": net, "train_freq": 4, "optimize_memory_usage": False, **kw},
        )
    if algo == "sac":
        env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
        return SAC, env, {"policy_kwargs": net, "learning_starts": 50, "buffer_size": 300}
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=2, seed=seed))
    return PPO, env, {"policy_kwargs": net, "n_steps": 64, "batch_size": 32, "n_epochs": 2}


@pytest.mark.parametrize("algo", ["dqn", "sac", "ppo"])
def test_a_restored_model_equals_the_saved_one(tmp_path: Path, algo: str) -> None:
    cls, env, kw = _build(algo)
    with rlsup.attach(tmp_path / "run", handle_signals=False) as run:
        model = cls(env=env, policy="MlpPolicy", seed=3, device="cpu", **kw)
        # The SAC buffer (300) wraps around; the DQN one (1000) does not fill.
        model.learn(400, callback=RlsupCallback(run, record_digest=True))
        assert run.last_checkpoint_step == model.num_timesteps  # the final checkpoint
    [(step, ckpt)] = committed(tmp_path / "run")
    assert_no_pickled_objects(ckpt)

    cls2, env2, kw2 = _build(algo, seed=4)
    with rlsup.attach(tmp_path / "run", handle_signals=False) as run2:
        restored, _ = resume(cls2, env2, run2, policy="MlpPolicy", seed=4, device="cpu", **kw2)
    assert restored.num_timesteps == model.num_timesteps == step
    assert restored._n_updates == model._n_updates > 0
    assert restored._total_timesteps == model._total_timesteps
    for name, params in model.get_parameters().items():
        _assert_same(restored.get_parameters()[name], params, name)
    assert [e["r"] for e in restored.ep_info_buffer] == [e["r"] for e in model.ep_info_buffer]
    if algo == "dqn":
        assert restored._n_calls == model._n_calls
        assert restored.exploration_rate == model.exploration_rate
    if algo == "sac":
        assert torch.equal(restored.log_ent_coef, model.log_ent_coef)
        assert restored.replay_buffer.full and model.replay_buffer.full
    if algo in ("dqn", "sac"):
        assert replay_digest(restored.replay_buffer) == replay_digest(model.replay_buffer)
        for field in ("observations", "actions", "rewards", "dones", "timeouts"):
            assert np.array_equal(
                getattr(restored.replay_buffer, field), getattr(model.replay_buffer, field)
            )
    else:
        for a, b in (
            (restored.env.obs_rms, model.env.obs_rms),
            (restored.env.ret_rms, env.ret_rms),
        ):
            assert np.array_equal(a.mean, b.mean) and np.array_equal(a.var, b.var)
            assert a.count == b.count
    params = torch.load(ckpt / PARAMS_FILE, weights_only=True)
    assert "policy" in params
    env.close()
    env2.close()


def _assert_same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def test_a_checkpoint_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    cls, env, kw = _build("dqn")
    with rlsup.attach(tmp_path / "run", handle_signals=False) as run:
        model = cls(env=env, policy="MlpPolicy", device="cpu", **kw)
        model.learn(200, callback=RlsupCallback(run))
    with (
        rlsup.attach(tmp_path / "run", handle_signals=False) as run2,
        pytest.raises(rlsup.SdkError, match="algo='DQN'"),
    ):
        resume(PPO, env, run2, policy="MlpPolicy", device="cpu", n_steps=64)
    env.close()


class _StopAt(BaseCallback):
    """Asks the run to stop (as SIGTERM would) once training reaches `at` timesteps."""

    def __init__(self, run: rlsup.Run, at: int) -> None:
        super().__init__()
        self.run, self.at = run, at

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.at:
            self.run.request_stop("test")
        return True


@pytest.mark.parametrize(("algo", "saved_at"), [("dqn", 300 - 2), ("ppo", 256)])
def test_a_stop_saves_the_last_whole_state_and_stops_learn(
    tmp_path: Path, algo: str, saved_at: int
) -> None:
    """exit_on_stop=False: the callback saves and returns False, learn() returns early. The
    state saved is the last consistent one: off-policy the one before the step the stop was
    seen at (2 envs: 2 timesteps back), on-policy the start of the rollout in progress (PPO,
    2 envs x 64 steps: rollouts start at 0, 128, 256)."""
    cls, env, kw = _build(algo)
    with rlsup.attach(tmp_path / "run", handle_signals=False, exit_on_stop=False) as run:
        model = cls(env=env, policy="MlpPolicy", device="cpu", **kw)
        callback = RlsupCallback(run, record_digest=True)
        model.learn(10_000, callback=CallbackList([_StopAt(run, 300), callback]))
        assert model.num_timesteps == 300 and run.should_stop()
    [(step, ckpt)] = committed(tmp_path / "run")
    assert step == saved_at and callback.checkpoints == 1
    saved = read_json(ckpt / STATE_JSON)
    assert saved["counters"]["num_timesteps"] == saved_at
    if algo == "dqn":  # nothing of the step after it: not in the buffer, not counted
        assert saved["replay"]["size"] * 2 == saved_at == saved["counters"]["_n_calls"] * 2
    env.close()


def test_a_stop_with_exit_on_stop_exits_75_right_after_the_checkpoint(tmp_path: Path) -> None:
    cls, env, kw = _build("dqn")
    with rlsup.attach(tmp_path / "run", handle_signals=False) as run:
        model = cls(env=env, policy="MlpPolicy", device="cpu", **kw)
        with pytest.raises(SystemExit) as exited:
            model.learn(10_000, callback=CallbackList([_StopAt(run, 200), RlsupCallback(run)]))
    assert exited.value.code == P.ExitCode.STOPPED
    assert [s for s, _ in committed(tmp_path / "run")] == [198]
    env.close()


def test_a_failed_checkpoint_is_logged_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save, calls = torch.save, []

    def disk_full_once(obj: Any, f: Any, *a: Any, **kw: Any) -> None:
        calls.append(f)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", disk_full_once)
    cls, env, kw = _build("dqn")
    run_dir = tmp_path / "run"
    with rlsup.attach(run_dir, handle_signals=False, checkpoint_every_steps=100) as run:
        model = cls(env=env, policy="MlpPolicy", device="cpu", **kw)
        callback = RlsupCallback(run)
        model.learn(400, callback=callback)
        assert model.num_timesteps == 400
        assert callback.failures == 1 and callback.checkpoints >= 2
        hb = P.read_heartbeat(run_dir)
    assert hb is not None and hb.checkpoint_failures == 1
    assert "No space left" in (hb.last_checkpoint_error or "")
    assert committed(run_dir)[-1][0] == 400
    assert not list((run_dir / P.CHECKPOINT_DIR).glob(".staging-*"))
    env.close()
