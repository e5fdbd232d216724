"""The CleanRL-style DQN of examples/cleanrl_dqn.py as people run it without a supervisor: the
same network, replay buffer, epsilon schedule and update (imported from the example, so the
learner is the same one), checkpointed the way the seeds and SB3 do it, for contenders (c) and
(d) of benchmarks/goodput.py and for its fault-free baseline.

    python benchmarks/goodput_script.py --dir D [--save-every-s N] [--save-replay]

- every `--save-every-s` seconds (0: never) `torch.save` of the networks, Adam's state and the
  step into D/checkpoint_step<N>.pt, as the seeds' `checkpoint_ep146` files; `--save-replay`
  also writes the replay buffer beside it (SB3's `save_replay_buffer=True`; as .npz, no
  pickle); without it the buffer is not saved (the seeds: "Buffer starts empty on resume");
- at start, the newest checkpoint that loads is resumed: its step, networks and optimizer; a
  buffer not saved starts empty and `--learning-starts` steps refill it before learning again;
- it prints `progress step=N pid=P t=T` about twice a second (the log the glue's watchdog
  watches), `resume step=N pid=P refill=R replay=saved|empty` at start, and
  `saved step=N pid=P stall_ms=X` per checkpoint (the training loop's stall).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from cleanrl_dqn import QNetwork, Replay, epsilon


def newest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    found = []
    for p in directory.glob("checkpoint_step*.pt"):
        try:
            found.append((int(p.stem[len("checkpoint_step") :]), p))
        except ValueError:
            continue
    return max(found) if found else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--total-steps", type=int, default=10_000_000)
    p.add_argument("--save-every-s", type=float, default=300.0)
    p.add_argument("--save-replay", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--buffer-size", type=int, default=10_000)
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--train-frequency", type=int, default=4)
    p.add_argument("--target-update", type=int, default=500)
    p.add_argument("--epsilon-steps", type=int, default=None, help="default: total // 2")
    args = p.parse_args()
    torch.set_num_threads(1)
    eps_steps = args.epsilon_steps or args.total_steps // 2  # as the example's
    args.dir.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    env = gym.make("CartPole-v1")
    obs_dim = int(env.observation_space.shape[0])  # type: ignore[index]
    n_actions = int(env.action_space.n)  # type: ignore[attr-defined]
    q, target = QNetwork(obs_dim, n_actions), QNetwork(obs_dim, n_actions)
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=2.5e-4)
    replay = Replay(args.buffer_size, obs_dim)
    obs, _ = env.reset(seed=args.seed)
    step = 0
    learn_from = args.learning_starts
    replay_state = "empty"
    while (found := newest_checkpoint(args.dir)) is not None:
        try:
            saved = torch.load(found[1], weights_only=True)
        except Exception as exc:  # a file cut short by a kill: the one before it
            print(f"checkpoint {found[1].name} unreadable ({exc}); removed", flush=True)
            found[1].unlink()
            continue
        q.load_state_dict(saved["q"])
        target.load_state_dict(saved["target"])
        optimizer.load_state_dict(saved["optimizer"])
        step = int(saved["step"])
        buf = found[1].with_suffix(".replay.npz")
        if buf.exists():
            with np.load(buf) as z:
                for name in replay.arrays:
                    replay.arrays[name][...] = z[name]
                replay.pos, replay.full = int(z["pos"]), bool(z["full"])
            replay_state = "saved"
            learn_from = args.learning_starts
        else:
            learn_from = step + args.learning_starts
        break
    refill = max(0, learn_from - max(step, args.learning_starts)) if step else 0
    print(f"resume step={step} pid={pid} refill={refill} replay={replay_state}", flush=True)

    last_save = time.monotonic()
    every = args.save_every_s
    last_print = 0.0  # the first step is printed at once: the glue sees a fresh start
    while step < args.total_steps:
        if rng.random() < epsilon(step, 1.0, 0.05, eps_steps):
            action = int(rng.integers(n_actions))
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)[None]).argmax(1).item())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        replay.add(obs, next_obs, action, float(reward), terminated)
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
        step += 1
        if step > learn_from and step % args.train_frequency == 0:
            b = replay.sample(rng, 64)
            with torch.no_grad():
                td_target = b["rewards"] + 0.99 * target(b["next_obs"]).max(1).values * (
                    1.0 - b["dones"]
                )
            value = q(b["obs"]).gather(1, b["actions"][:, None]).squeeze(1)
            loss = F.mse_loss(value, td_target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if step % args.target_update == 0:
            target.load_state_dict(q.state_dict())
        now = time.monotonic()
        if now - last_print >= 0.5:
            print(f"progress step={step} pid={pid} t={time.time():.3f}", flush=True)
            last_print = now
        if every > 0 and now - last_save >= every:
            path = args.dir / f"checkpoint_step{step}.pt"
            state = {"q": q.state_dict(), "target": target.state_dict(),
                     "optimizer": optimizer.state_dict(), "step": step}  # fmt: skip
            if args.save_replay:  # SB3 writes the buffer first, then the model
                np.savez(
                    path.with_suffix(".replay.npz"),
                    **replay.arrays, pos=np.int64(replay.pos), full=np.bool_(replay.full),
                )  # fmt: skip
            torch.save(state, path)
            for old in args.dir.glob("checkpoint_step*.pt"):  # keep the newest few
                if old != path and old.stat().st_mtime < path.stat().st_mtime - 2 * every:
                    old.unlink(missing_ok=True)
                    old.with_suffix(".replay.npz").unlink(missing_ok=True)
            last_save = time.monotonic()
            print(
                f"saved step={step} pid={pid} stall_ms={(last_save - now) * 1000:.1f}", flush=True
            )


if __name__ == "__main__":
    main()
