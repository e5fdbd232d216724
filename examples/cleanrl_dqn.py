"""A CleanRL-style single-file DQN on CartPole that survives any kill, through the rlsup SDK.

The algorithm is the usual one (an MLP Q-network, a replay buffer of numpy arrays, a linear
epsilon schedule, a target network copied every few hundred steps); the SDK adds about ten lines
to its loop. Killed at any point and started again, it resumes *exactly*: the networks, Adam's
moments, the python / numpy / torch RNGs, the environment mid-episode, the step counter and the
replay buffer are all in the checkpoint, so the run continues as if it had never stopped (a test
compares the checkpoints of a killed-and-resumed run with an uninterrupted one, byte for byte).

Standalone:   python examples/cleanrl_dqn.py --run-dir runs/cleanrl-dqn --total-steps 50000
Under rlsup:  [[games]] command = ["python", "examples/cleanrl_dqn.py"]  (RLSUP_SEED wins)
"""

from __future__ import annotations

import argparse
import io
import json
import random
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from gymnasium.wrappers import TimeLimit
from torch import nn

import rlsup


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, n_actions),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def epsilon(step: int, start: float, end: float, duration: int) -> float:
    return max(end, start + (end - start) * step / duration)


class Replay:
    """A circular buffer of numpy arrays: saved with `run.save_arrays` (incremental, no pickle)."""

    def __init__(self, size: int, obs_dim: int) -> None:
        self.arrays = {
            "obs": np.zeros((size, obs_dim), np.float32),
            "next_obs": np.zeros((size, obs_dim), np.float32),
            "actions": np.zeros(size, np.int64),
            "rewards": np.zeros(size, np.float32),
            "dones": np.zeros(size, np.float32),
        }
        self.size, self.pos, self.full = size, 0, False

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: int, reward: float,
            done: bool) -> None:  # fmt: skip
        for name, value in (("obs", obs), ("next_obs", next_obs), ("actions", action),
                            ("rewards", reward), ("dones", float(done))):  # fmt: skip
            self.arrays[name][self.pos] = value
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, rng: np.random.Generator, batch: int) -> dict[str, torch.Tensor]:
        idx = rng.integers(0, self.size if self.full else self.pos, size=batch)
        return {k: torch.as_tensor(v[idx]) for k, v in self.arrays.items()}


def tensor_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def time_limit(env: gym.Env[Any, Any]) -> TimeLimit[Any, Any]:
    """The TimeLimit wrapper of `gym.make`'s stack (its step count truncates at 500)."""
    while not isinstance(env, TimeLimit):
        env = env.env  # type: ignore[attr-defined]
    return env


def env_state(env: gym.Env[Any, Any]) -> dict[str, Any]:
    """CartPole mid-episode: its physics, its RNG and the time limit's count (JSON)."""
    inner = env.unwrapped
    return {
        "state": np.asarray(inner.state, dtype=np.float64).tolist(),  # type: ignore[attr-defined]
        "steps_beyond_terminated": inner.steps_beyond_terminated,  # type: ignore[attr-defined]
        "np_random": inner.np_random.bit_generator.state,
        "elapsed": time_limit(env)._elapsed_steps,
    }


def set_env_state(env: gym.Env[Any, Any], saved: dict[str, Any]) -> None:
    inner = env.unwrapped
    inner.state = np.array(saved["state"], dtype=np.float64)  # type: ignore[attr-defined]
    inner.steps_beyond_terminated = saved["steps_beyond_terminated"]  # type: ignore[attr-defined]
    inner.np_random.bit_generator.state = saved["np_random"]
    time_limit(env)._elapsed_steps = saved["elapsed"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--run-dir", default="runs/cleanrl-dqn", help="standalone only")
    p.add_argument("--total-steps", type=int, default=50_000)
    p.add_argument("--checkpoint-every-steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=1, help="RLSUP_SEED wins under rlsup")
    p.add_argument("--buffer-size", type=int, default=10_000)
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--train-frequency", type=int, default=4)
    p.add_argument("--target-update", type=int, default=500)
    args = p.parse_args()
    # One thread: a resumed run must compute exactly what an uninterrupted one does, and
    # intra-op parallel reductions may sum in a different order from one run to the next.
    torch.set_num_threads(1)

    run = rlsup.attach(
        args.run_dir,
        total_steps=args.total_steps,
        checkpoint_every_steps=args.checkpoint_every_steps,
        algo="cleanrl-dqn",
    )
    seed = run.seed if run.seed is not None else args.seed
    random.seed(seed)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)  # all of the loop's numpy randomness (no np.random.*)
    env = gym.make("CartPole-v1")
    obs_dim = int(env.observation_space.shape[0])  # type: ignore[index]
    n_actions = int(env.action_space.n)  # type: ignore[attr-defined]
    q, target = QNetwork(obs_dim, n_actions), QNetwork(obs_dim, n_actions)
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=2.5e-4)
    replay = Replay(args.buffer_size, obs_dim)
    obs, _ = env.reset(seed=seed)
    step, episode_return, returns = 0, 0.0, []
    mean: float | None = None  # the last 100 episodes' mean return

    if (ckpt := run.latest()) is not None:  # --- the SDK: resume exactly ---
        nets = torch.load(ckpt / "nets.pt", weights_only=True)
        q.load_state_dict(nets["q"])
        target.load_state_dict(nets["target"])
        optimizer.load_state_dict(nets["optimizer"])
        torch.set_rng_state(nets["torch_rng"])
        state = json.loads((ckpt / "state.json").read_text())
        step, episode_return, returns = state["step"], state["episode_return"], state["returns"]
        mean = float(np.mean(returns)) if returns else None
        version, internal, gauss = state["python_rng"]
        random.setstate((version, tuple(internal), gauss))
        rng.bit_generator.state = state["numpy_rng"]
        set_env_state(env, state["env"])
        obs = np.array(state["obs"], dtype=np.float32)
        for name in replay.arrays:
            replay.arrays[name][...] = run.load_arrays(name)
        replay.pos, replay.full = state["replay_pos"], state["replay_full"]

    while step < run.total_steps:
        eps = epsilon(step, 1.0, 0.05, run.total_steps // 2)
        if rng.random() < eps:
            action = int(rng.integers(n_actions))
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)[None]).argmax(1).item())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        replay.add(obs, next_obs, action, float(reward), terminated)
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns = [*returns, episode_return][-100:]
            mean = float(np.mean(returns))  # here, not at every step: 7 % of this loop
            episode_return = 0.0
            obs, _ = env.reset()  # CartPole's own RNG draws the start: in the checkpoint
        step += 1
        if step > args.learning_starts and step % args.train_frequency == 0:
            b = replay.sample(rng, 64)
            with torch.no_grad():
                best = target(b["next_obs"]).max(1).values
                td_target = b["rewards"] + 0.99 * best * (1.0 - b["dones"])
            value = q(b["obs"]).gather(1, b["actions"][:, None]).squeeze(1)
            loss = F.mse_loss(value, td_target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if step % args.target_update == 0:
            target.load_state_dict(q.state_dict())

        run.heartbeat(step, episodes=len(returns), mean_return=mean)  # --- the SDK: ~10 lines ---
        stop = run.should_stop()  # read once: a SIGTERM may land between two questions
        if stop or run.should_checkpoint(step) or step >= run.total_steps:
            with run.checkpoint(step) as d:
                (d / "nets.pt").write_bytes(tensor_bytes({
                    "q": q.state_dict(), "target": target.state_dict(),
                    "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                }))  # fmt: skip
                (d / "state.json").write_text(json.dumps({
                    "step": step, "episode_return": episode_return, "returns": returns,
                    "python_rng": random.getstate(), "numpy_rng": rng.bit_generator.state,
                    "env": env_state(env), "obs": np.asarray(obs).tolist(),
                    "replay_pos": replay.pos, "replay_full": replay.full,
                }))  # fmt: skip
                for name, array in replay.arrays.items():
                    run.save_arrays(name, array)
        if stop:
            run.exit_stopped()
    print(f"finished step={step} mean_return={np.mean(returns) if returns else 0:.1f}", flush=True)


if __name__ == "__main__":
    main()
