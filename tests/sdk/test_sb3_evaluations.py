"""rlsup.sb3's evaluations: SB3's own `EvalCallback`, in real Stable-Baselines3 training, reports
each evaluation through `run.evaluation()` (recorded as rlsup's worker records one), wrapped
(`RlsupEvalCallback`: timed, its own phase) or followed (`callback_after_eval=RlsupEvalReport`).
In process: no process is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import CallbackList, EvalCallback
from stable_baselines3.common.env_util import make_vec_env

import rlsup
from rlsup.sb3 import RlsupCallback, RlsupEvalCallback, RlsupEvalReport
from supervisor.lifecycle.liveness import Reported, new_reports
from training import protocol as P


def _ppo() -> PPO:
    env = make_vec_env("CartPole-v1", n_envs=2, seed=5)
    kw = {"n_steps": 32, "batch_size": 32, "n_epochs": 1, "policy_kwargs": {"net_arch": [8]}}
    return PPO("MlpPolicy", env, device="cpu", seed=5, **kw)


def test_the_wrapped_eval_callback_reports_every_evaluation_timed(tmp_path: Path) -> None:
    model = _ppo()
    with rlsup.attach(tmp_path / "run", handle_signals=False) as run:
        evaluator = RlsupEvalCallback(
            make_vec_env("CartPole-v1", n_envs=1, seed=9),
            run,
            eval_freq=64,  # callback calls: every 128 timesteps of 2 envs
            n_eval_episodes=2,
            log_path=str(tmp_path / "sb3"),
            verbose=0,
        )
        model.learn(512, callback=CallbackList([RlsupCallback(run), evaluator]))
        hb = P.read_heartbeat(tmp_path / "run")
    assert evaluator.reported == 4 and hb is not None
    assert [e["step"] for e in hb.evals] == [128, 256, 384, 512]
    assert [e["step"] for e in hb.evals] == list(evaluator.evaluations_timesteps)
    assert hb.evals[-1]["mean"] == pytest.approx(evaluator.last_mean_reward)
    assert all(e["episodes"] == 2 and e["seconds"] > 0 for e in hb.evals)
    newest = json.loads((tmp_path / "run" / P.EVAL_FILE).read_text())
    assert newest["step"] == 512 and newest["std"] >= 0 and newest["mean_ep_length"] > 0
    kinds = [k for k, _ in new_reports(Reported(), hb)]
    assert kinds == ["evaluation"] * 4


def test_an_eval_callback_of_your_own_reports_through_callback_after_eval(tmp_path: Path) -> None:
    model = _ppo()
    with rlsup.attach(tmp_path / "run", handle_signals=False) as run:
        report = RlsupEvalReport(run)
        evaluator = EvalCallback(
            make_vec_env("CartPole-v1", n_envs=1, seed=9),
            callback_after_eval=report,
            eval_freq=64,
            n_eval_episodes=2,
            verbose=0,
        )
        model.learn(256, callback=CallbackList([RlsupCallback(run), evaluator]))
        hb = P.read_heartbeat(tmp_path / "run")
    assert report.reported == 2 and hb is not None
    assert [(e["step"], e["episodes"]) for e in hb.evals] == [(128, 2), (256, 2)]
    assert hb.eval is not None and hb.eval["mean"] == pytest.approx(evaluator.last_mean_reward)
    assert "std" not in hb.eval  # no log_path: SB3 kept no episodes to take it from
