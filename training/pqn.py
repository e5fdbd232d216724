"""PQN: Q(lambda) on vectorized envs, no replay buffer, no target network (Gallici et al.,
"Simplifying Deep Temporal Difference Learning", ICLR 2025), as CleanRL's pqn_atari_envpool
and pqn (CartPole).

One `iterate()` = one epsilon-greedy rollout of num_envs * n_steps agent steps, its Q(lambda)
returns computed backwards, then `epochs` passes of minibatch updates: the MSE of Q(s, a_taken)
against the returns. PPO's compute layout with a Q-network; what keeps it stable without a
target network is the LayerNorm after every hidden layer (networks.PQNetwork).

Defaults, CleanRL's (where a flag is shared, None resolves to these for PQN only): RAdam at
2.5e-4 annealed linearly to `min_lr` (`--lr-scheduler linear`, per update where CleanRL steps
per rollout), gradient norm clip 10, q_lambda 0.65, gamma 0.99, epsilon 1 -> 0.01 over the
first 10 % of total_steps on Atari (1 -> 0.05 over 50 % for vector tasks, as CleanRL's pqn.py).
The layout comes from the worker's shared knobs; their defaults (8 envs, n_steps 128,
minibatch 256 = 4 minibatches, 4 epochs) are CleanRL's pqn_atari_envpool defaults.

Envpool's next-step auto-reset, as in ppo.py: `dones[t]` = "obs[t] came right after a done";
those dead steps (envpool ignores their action and returns the reset observation, reward 0)
cut the returns (`1 - dones[t + 1]`, CleanRL's convention) and are masked out of the loss.
CleanRL regresses them too, towards the next episode's first value, which is no transition of
the game.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from training.args import WorkerConfig
from training.envs import EpisodeTracker
from training.exploration import EVAL_EPSILON, epsilon_greedy, linear_epsilon
from training.graphs import StepGraph, capturable_optimizer, graphs_usable
from training.masking import masked_mean
from training.metrics import Means
from training.networks import PQNetwork, compile_networks, rollout_frames
from training.optim import (
    LRSchedule,
    Precision,
    default_lr,
    iterations_for,
    load_optimizer_state,
    never_interrupt,
    restore_rng,
    rng_state,
    warmup_adam,
)
from training.overlap import rollout_in_halves
from training.rollout import RolloutLearner
from training.transfer import ActionReadback, Uploader, device_generator

# ---- the maths -------------------------------------------------------------------------------


def q_lambda_returns(
    rewards: torch.Tensor,
    max_q: torch.Tensor,
    dones: torch.Tensor,
    next_max_q: torch.Tensor,
    next_done: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Peng's Q(lambda) returns over a (T, N) rollout, backwards:

        G_t = r_t + gamma * (1 - dones[t+1]) * (lam * G_{t+1} + (1 - lam) * max_a Q(s_{t+1}, a))

    `max_q[t]` = max_a Q(obs[t], a); `dones[t]` is 1 when obs[t] followed an episode end
    (CleanRL's convention); the last step bootstraps from `next_max_q` unless `next_done`.
    """
    steps = rewards.shape[0]
    returns = torch.zeros_like(rewards)
    for t in reversed(range(steps)):
        if t == steps - 1:
            returns[t] = rewards[t] + gamma * (1.0 - next_done) * next_max_q
        else:
            blend = lam * returns[t + 1] + (1.0 - lam) * max_q[t + 1]
            returns[t] = rewards[t] + gamma * (1.0 - dones[t + 1]) * blend
    return returns


def q_loss(q_taken: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the taken actions' Q against the returns, over `mask`."""
    return masked_mean((q_taken - returns) ** 2, mask)


# ---- the learner -----------------------------------------------------------------------------


class PQNLearner(RolloutLearner):
    def __init__(self, cfg: WorkerConfig, device: torch.device, env_seed: int) -> None:
        self.cfg = cfg
        self.device = device
        self.replay = None
        self.env_seed = env_seed
        # --env-overlap on (an even number of envs): two pools stepped in turn (training/overlap.py)
        self.overlap = cfg.env_overlap == "on" and cfg.num_envs % 2 == 0
        self.envs = self._make_envs(env_seed)
        self.obs_shape: tuple[int, ...] = tuple(self.envs.observation_space.shape)
        self.obs_dtype = torch.uint8 if cfg.is_atari else torch.float32
        self.n_actions = int(self.envs.action_space.n)

        self.q = PQNetwork(self.obs_shape, self.n_actions, cfg.mlp_sizes()).to(device)
        compile_networks(cfg.compile, self.q)
        self.lr = default_lr(cfg, 2.5e-4, 2.5e-4)
        # foreach: one kernel per op over all parameters, not a Python loop (torch CPU default)
        graphs = cfg.cuda_graphs == "on"
        self.optimizer = torch.optim.RAdam(
            self.q.parameters(),
            lr=self.lr,
            foreach=True,
            capturable=graphs and capturable_optimizer(device),
        )
        self._params = list(self.q.parameters())
        self.minibatch = cfg.minibatch_size()
        self.n_minibatches = cfg.rollout_size() // self.minibatch
        total_updates = (
            iterations_for(cfg.total_steps, cfg.rollout_size()) * cfg.epochs * self.n_minibatches
        )
        self.schedule = LRSchedule(cfg, self.optimizer, total_updates, default="linear")
        self.precision = Precision(device, cfg.precision, conv=cfg.is_atari)
        self.max_grad_norm = cfg.max_grad_norm or 10.0
        # --cuda-graphs on: the gradient step and the acting forward as CUDA graphs
        # (training/graphs.py).
        self._scaled = False
        usable = graphs_usable(cfg, self.precision)
        self._update_graph = (
            StepGraph(device, self._captured_step, self._params, self.optimizer) if usable else None
        )
        self._act_graph = StepGraph(device, self._captured_act) if usable else None
        self._returns_graph = StepGraph(device, self._captured_returns) if usable else None
        atari = cfg.is_atari
        self.end_e = cfg.end_e if cfg.end_e is not None else (0.01 if atari else 0.05)
        fraction = cfg.exploration_fraction
        self.exploration_fraction = fraction if fraction is not None else (0.1 if atari else 0.5)

        self.rng = np.random.default_rng(cfg.seed)
        # The loop's host <-> device traffic, without host syncs on a GPU (training/transfer.py).
        self._upload = Uploader(device)
        self._readback = ActionReadback(device)
        self._perm_gen = device_generator(device, self.rng)  # minibatch orders, on a GPU
        self.global_step = 0
        self.updates = 0
        self.iterations = 0
        self.tracker = EpisodeTracker(cfg.num_envs, cfg.is_atari)
        # Diagnostics, summed on the device per minibatch and read once per take_metrics().
        self._losses = Means(("td_loss", "q_values", "grad_norm"))
        self._next_obs: torch.Tensor | None = None
        self._next_done = torch.zeros(cfg.num_envs, device=device)
        # Asked between rollout steps and minibatches (training/learner.py: cut short).
        self.interrupt: Callable[[], bool] = never_interrupt
        self.interrupted: str | None = None
        # Seconds per phase of iterate(), summed, as PPOLearner.phase_s.
        self.phase_s = {"env": 0.0, "inference": 0.0, "copies": 0.0, "update": 0.0}

        shape = (cfg.n_steps, cfg.num_envs)
        self.b_obs = torch.zeros(shape + self.obs_shape, dtype=self.obs_dtype, device=device)
        self.b_actions = torch.zeros(shape, dtype=torch.long, device=device)
        self.b_rewards = torch.zeros(shape, device=device)
        self.b_dones = torch.zeros(shape, device=device)
        self.b_max_q = torch.zeros(shape, device=device)

    # ---- envs ------------------------------------------------------------------------------
    # ---- training --------------------------------------------------------------------------
    def epsilon(self) -> float:
        duration = self.exploration_fraction * self.cfg.total_steps
        return linear_epsilon(self.cfg.start_e, self.end_e, duration, self.global_step)

    def _rollout(
        self,
        next_obs: torch.Tensor,
        next_done: torch.Tensor,
        start_step: int,
        tracker_state: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rollout, every env stepped at once; cut short: `interrupted` set.

        Epsilon-greedy on the current Q, one autocast region (weights cast once: its cache
        works under no_grad, not under inference mode)."""
        cfg = self.cfg
        clock, phase = time.perf_counter, self.phase_s
        with self.precision.autocast():
            for step in range(cfg.n_steps):
                if self.interrupt():
                    self._abandon_rollout(step, next_obs, start_step, tracker_state)
                    return next_obs, next_done
                t0 = clock()
                self.b_obs[step] = next_obs
                self.b_dones[step] = next_done
                t1 = clock()
                with torch.no_grad():
                    best, greedy = self._q_values(next_obs).max(dim=1)
                    self.b_max_q[step] = best
                    greedy_np = self._readback.read(greedy)  # the loop's one wait on the device
                actions = epsilon_greedy(greedy_np, self.epsilon(), self.n_actions, self.rng)
                t2 = clock()
                obs, reward, terminated, truncated, info = self.envs.step(actions)
                t3 = clock()
                self.tracker.update(reward, terminated, truncated, info)
                self.b_actions[step] = self._upload.put("actions", actions)
                self.b_rewards[step] = self._upload.put("reward", reward)
                next_obs = self._to_tensor(obs)
                next_done = self._upload.put("done", terminated | truncated).float()
                self.global_step += cfg.num_envs
                phase["copies"] += (t1 - t0) + (clock() - t3)
                phase["inference"] += t2 - t1
                phase["env"] += t3 - t2
        return next_obs, next_done

    def _rollout_in_halves(
        self,
        next_obs: torch.Tensor,
        next_done: torch.Tensor,
        start_step: int,
        tracker_state: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rollout with --env-overlap on (training/overlap.py); None when cut short. The
        exploration of all envs is drawn once a step, before half 0 acts, as the synchronous
        path draws it: the same generator stream, the same actions."""
        envs, n = self.envs, self.cfg.num_envs
        explore = np.zeros(n, dtype=bool)
        uniform = np.zeros(n, dtype=np.int64)

        def act(step: int, half: int, obs: torch.Tensor) -> np.ndarray:
            cols = envs.cols[half]
            if half == 0:
                explore[:] = self.rng.random(n) < self.epsilon()
                uniform[:] = self.rng.integers(0, self.n_actions, size=n)
            with torch.no_grad():
                best, greedy = self._q_values(obs).max(dim=1)
                self.b_max_q[step, cols] = best
                greedy_np = self._readback.read(greedy)
            actions = np.where(explore[cols], uniform[cols], greedy_np)
            self.b_actions[step, cols] = self._upload.put(f"actions{half}", actions)
            return actions

        with self.precision.autocast():
            return rollout_in_halves(self, next_obs, next_done, start_step, tracker_state, act)

    def _update(self, next_obs: torch.Tensor, next_done: torch.Tensor) -> None:
        """Q(lambda) returns, then the epochs of minibatch updates over the rollout."""
        clock, phase = time.perf_counter, self.phase_s
        t_update = clock()
        # Q(lambda) returns
        with torch.inference_mode(), self.precision.autocast():
            next_max_q = self.q(next_obs).float().max(dim=1).values
        with torch.no_grad():
            if self._returns_graph is not None:  # 128 steps of Q(lambda): many small kernels
                self._returns_graph.feed(next_max_q=next_max_q, next_done=next_done)
                returns = self._returns_graph()
            else:
                returns = self._returns(next_max_q.clone(), next_done)
        self._optimize(returns)
        phase["update"] += clock() - t_update
        self.iterations += 1
        self.schedule.after_steps(self.global_step, self.updates)

    def _returns(self, next_max_q: torch.Tensor, next_done: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        return q_lambda_returns(
            self.b_rewards,
            self.b_max_q,
            self.b_dones,
            next_max_q,
            next_done,
            cfg.gamma,
            cfg.q_lambda,
        )

    def _captured_returns(self, static: dict[str, torch.Tensor]) -> torch.Tensor:
        """Q(lambda) as a CUDA graph captures it: the rollout buffers (the learner's own, never
        reallocated) and the fed bootstrap."""
        with torch.no_grad():
            return self._returns(static["next_max_q"], static["next_done"])

    def _q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(obs) in fp32, for acting (under no_grad)."""
        if self._act_graph is None:
            return self.q(obs).float()  # type: ignore[no-any-return]
        self._act_graph.feed(obs=obs)
        return self._act_graph()

    def _captured_act(self, static: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad(), self.precision.autocast(cache=False):
            return self.q(static["obs"]).float()  # type: ignore[no-any-return]

    def _rollout_batch(self, returns: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rollout as the update reads it: flat over (step, env), dead steps masked."""
        obs = self.b_obs.reshape((-1, *self.obs_shape))
        obs, self._scaled = rollout_frames(obs, self.precision.dtype)  # cast once for all epochs
        return {
            "obs": obs,
            "actions": self.b_actions.reshape(-1, 1),
            "ret": returns.reshape(-1),
            "valid": 1.0 - self.b_dones.reshape(-1),  # dead steps out
        }

    def _gradient_step(
        self, r: dict[str, torch.Tensor], mb: torch.Tensor, cache: bool = True
    ) -> tuple[torch.Tensor, ...]:
        """One minibatch's step; its diagnostics, tensors on the device."""
        with self.precision.autocast(cache):
            q = self.q(r["obs"][mb], self._scaled)
        q_taken = q.float().gather(1, r["actions"][mb]).squeeze(1)
        valid = r["valid"][mb]
        loss = q_loss(q_taken, r["ret"][mb], valid)
        grad_norm = self.precision.step(loss, self.optimizer, self._params, self.max_grad_norm)
        return loss, masked_mean(q_taken.detach(), valid), grad_norm

    def _optimize(self, returns: torch.Tensor) -> None:
        self._minibatch_epochs(self._rollout_batch(returns))

    def take_metrics(self) -> dict[str, float]:
        """Means of the diagnostics since the last call (one device sync; the loss entries are
        absent when no update ran since), and the current learning rate and epsilon."""
        return {
            **self._losses.take(),
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
            "epsilon": self.epsilon(),
        }

    # ---- acting, warmup, state -------------------------------------------------------------
    def act_greedy(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode(), self.precision.autocast():
            q = self.q(self._to_tensor(obs))
        return q.float().argmax(dim=1).cpu().numpy()

    def act_eval(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The evaluation policy, DQN's: epsilon-greedy with EVAL_EPSILON, drawn from the
        evaluation's own generator (the learner's RNG stays as training had it)."""
        return epsilon_greedy(self.act_greedy(obs), EVAL_EPSILON, self.n_actions, rng)

    def warmup_optimizer(self) -> None:
        dummy = torch.zeros((self.minibatch, *self.obs_shape), dtype=self.obs_dtype)
        dummy = dummy.to(self.device)

        def loss() -> torch.Tensor:
            with self.precision.autocast():
                return self.q(dummy).float().mean()

        warmup_adam(self.q, self.optimizer, loss)

    def state_dict(self) -> dict[str, Any]:
        return {
            "algo": "pqn",
            "q": self.q.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "scaler": self.precision.state_dict(),
            "global_step": self.global_step,
            "updates": self.updates,
            "iterations": self.iterations,
            "tracker": self.tracker.state_dict(),
            "rng": rng_state(self.rng),
            **({} if self._perm_gen is None else {"perm_rng": self._perm_gen.get_state()}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("algo") != "pqn":
            raise ValueError(f"not a PQN learner state (algo={state.get('algo')!r})")
        self.q.load_state_dict(state["q"])
        load_optimizer_state(self.optimizer, state["optimizer"])  # new state tensors:
        if self._update_graph is not None:
            self._update_graph.reset()  # the graph captured the old ones
        self.schedule.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state["scaler"])
        self.global_step = int(state["global_step"])
        self.updates = int(state["updates"])
        self.iterations = int(state["iterations"])
        self.tracker.load_state_dict(state["tracker"])
        restore_rng(self.rng, state["rng"])
        if self._perm_gen is not None and "perm_rng" in state:
            self._perm_gen.set_state(state["perm_rng"].cpu())
        self._next_obs = None  # the envs are not part of the state: start fresh episodes

    def close(self) -> None:
        self.envs.close()
