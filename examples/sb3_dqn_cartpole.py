"""Stable-Baselines3 DQN on CartPole under rlsup: checkpointed, killed, resumed where it stopped.

Standalone:
    python examples/sb3_dqn_cartpole.py --run-dir runs/cartpole --total-steps 50000
As a command game under `rlsup run` (RLSUP_RUN_DIR and the checkpoint interval come from the
config). Kill it at any time and start it again: it resumes from its newest checkpoint with the
same network, optimizer, replay buffer, exploration rate and step count. SIGTERM (`rlsup stop`)
saves a final checkpoint and exits 75.

Needs the `sb3` extra: pip install 'rlsup[sb3]'.
"""

from __future__ import annotations

import argparse

from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_vec_env

import rlsup
from rlsup.sb3 import RlsupCallback, replay_digest, resume


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--run-dir", default="runs/sb3-dqn-cartpole", help="standalone only")
    parser.add_argument("--total-steps", type=int, default=50_000)
    parser.add_argument("--checkpoint-every-steps", type=int, default=None)
    parser.add_argument("--buffer-size", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0, help="RLSUP_SEED wins under rlsup")
    parser.add_argument(
        "--print-digest", action="store_true", help="record and print the replay's sha256"
    )
    args = parser.parse_args()

    run = rlsup.attach(
        args.run_dir,
        total_steps=args.total_steps,
        checkpoint_every_steps=args.checkpoint_every_steps,
        algo="sb3-dqn",
    )
    total = run.total_steps or args.total_steps
    seed = run.seed if run.seed is not None else args.seed
    env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    model, run = resume(
        DQN,
        env,
        run,
        policy="MlpPolicy",
        policy_kwargs={"net_arch": [64, 64]},
        learning_rate=1e-3,
        buffer_size=args.buffer_size,
        learning_starts=1000,
        batch_size=64,
        train_freq=4,
        target_update_interval=500,
        exploration_fraction=0.2,
        exploration_final_eps=0.05,
        seed=seed,
        device="cpu",
    )
    if model.num_timesteps > 0:
        # Resumed: new episodes with seeds of their own, not the first run's again.
        env.seed(seed + model.num_timesteps)
        buffer = model.replay_buffer
        assert buffer is not None
        digest = replay_digest(buffer) if args.print_digest else "-"
        print(
            f"resumed step={model.num_timesteps} replay_size={buffer.size()} "
            f"replay_sha256={digest} exploration_rate={model.exploration_rate:.6f}",
            flush=True,
        )
    model.learn(
        total - model.num_timesteps,
        reset_num_timesteps=False,
        callback=RlsupCallback(run, record_digest=args.print_digest),
    )
    if run.should_stop():  # reached with attach(exit_on_stop=False), or a failed last save
        run.exit_stopped()
    print(f"finished step={model.num_timesteps}", flush=True)


if __name__ == "__main__":
    main()
