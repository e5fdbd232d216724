"""A small CartPole trainer of a user's own on the SDK, for the tests that run a command game
(`[[games]] command = [python, cartpole_command.py]`): gymnasium's CartPole-v1 and a linear
policy improved by hill climbing (numpy), cheap enough for a 2-core CI box, paced so that a
run lasts seconds rather than milliseconds (`--pace-s` per 100 agent steps).

It keeps what a real trainer keeps: its weights, its best score, its RNG, its step and episode
count, checkpointed through `run.checkpoint()` and resumed from `run.latest()`; it prints the
step it resumed from, so a test can tell a resume from a start at zero.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np

import rlsup


def evaluate(weights: np.ndarray, rng: np.random.Generator, episodes: int = 3) -> float:
    env = gym.make("CartPole-v1")
    total = 0.0
    for _ in range(episodes):
        obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(obs @ weights > 0))
            total += float(reward)
            done = terminated or truncated
    return total / episodes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pace-s", type=float, default=0.01)
    args = parser.parse_args()
    run = rlsup.attach(algo="hill-climb", total_steps=20_000)
    assert run.total_steps % 100 == 0, "checkpointed every 100 steps, the last one too"
    rng = np.random.default_rng(run.seed or 1)
    step, episodes, best, weights = 0, 0, -1.0, np.zeros(4)
    if (ckpt := run.latest()) is not None:
        saved = json.loads((ckpt / "state.json").read_text())
        step, episodes, best = saved["step"], saved["episodes"], saved["best"]
        weights = np.array(saved["weights"])
        rng.bit_generator.state = saved["rng"]
        print(f"resumed from step {step} ({ckpt.name})", flush=True)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
    trial, score = weights + rng.normal(0, 0.5, 4), 0.0
    while step < run.total_steps:
        obs, reward, terminated, truncated, _ = env.step(int(obs @ trial > 0))
        score += float(reward)
        step += 1
        if terminated or truncated:
            episodes += 1
            if score >= best:
                best, weights = score, trial
            obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
            trial, score = weights + rng.normal(0, 0.5, 4), 0.0
        run.heartbeat(step, episodes=episodes, mean_return=best)
        if step % 100:
            continue
        time.sleep(args.pace_s)
        stop = run.should_stop()  # read once: a SIGTERM may land between two questions
        if step >= run.total_steps:  # the final evaluation: the greedy policy, 3 episodes
            run.evaluation(step, evaluate(weights, rng), episodes=3)
        if stop or run.should_checkpoint(step) or step >= run.total_steps:
            with run.checkpoint(step) as d:
                state = {"step": step, "episodes": episodes, "best": best,
                         "weights": weights.tolist(), "rng": rng.bit_generator.state}  # fmt: skip
                (d / "state.json").write_text(json.dumps(state))
        if stop:
            run.exit_stopped()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
