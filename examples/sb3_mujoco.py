"""Stable-Baselines3 SAC (or PPO) on a MuJoCo task under rlsup: continuous actions, killed and
resumed where it stopped.

Standalone:
    python examples/sb3_mujoco.py --run-dir runs/pendulum --total-steps 20000
As a command game under `rlsup run` (RLSUP_RUN_DIR and the checkpoint interval come from the
config). SAC resumes with its networks, optimizers, entropy coefficient and replay buffer; PPO
(`--algo ppo`) with its networks, optimizer and the VecNormalize statistics it trains with.
SIGTERM (`rlsup stop`) saves a final checkpoint and exits 75.

Small networks and InvertedPendulum-v5 (4 observations, 1 action): it learns on a CPU in a few
minutes and runs its first checkpoints in seconds. Needs the `sb3` extra (stable-baselines3,
mujoco): pip install 'rlsup[sb3]'.
"""

from __future__ import annotations

import argparse
from typing import Any

from stable_baselines3 import PPO, SAC
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

import rlsup
from rlsup.sb3 import RlsupCallback, resume


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--run-dir", default="runs/sb3-mujoco", help="standalone only")
    parser.add_argument("--env", default="InvertedPendulum-v5")
    parser.add_argument("--algo", choices=("sac", "ppo"), default="sac")
    parser.add_argument("--total-steps", type=int, default=20_000)
    parser.add_argument("--checkpoint-every-steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="RLSUP_SEED wins under rlsup")
    args = parser.parse_args()

    run = rlsup.attach(
        args.run_dir,
        total_steps=args.total_steps,
        checkpoint_every_steps=args.checkpoint_every_steps,
        algo=f"sb3-{args.algo}",
    )
    total = run.total_steps or args.total_steps
    seed = run.seed if run.seed is not None else args.seed
    hyper: dict[str, Any]
    if args.algo == "sac":
        env = make_vec_env(args.env, n_envs=1, seed=seed)
        model_class: Any = SAC
        hyper = {
            "policy_kwargs": {"net_arch": [64, 64]},
            "buffer_size": 100_000,
            "learning_starts": 500,
            "batch_size": 64,
        }
    else:
        env = VecNormalize(make_vec_env(args.env, n_envs=4, seed=seed), gamma=0.99)
        model_class = PPO
        hyper = {"policy_kwargs": {"net_arch": [64, 64]}, "n_steps": 256, "batch_size": 64}
    model, run = resume(model_class, env, run, policy="MlpPolicy", seed=seed, device="cpu", **hyper)
    if model.num_timesteps > 0:
        env.seed(seed + model.num_timesteps)  # new episodes, not the first run's again
        print(f"resumed step={model.num_timesteps}", flush=True)
    model.learn(total - model.num_timesteps, reset_num_timesteps=False, callback=RlsupCallback(run))
    if run.should_stop():  # reached with attach(exit_on_stop=False), or a failed last save
        run.exit_stopped()
    print(f"finished step={model.num_timesteps}", flush=True)


if __name__ == "__main__":
    main()
