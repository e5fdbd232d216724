"""Double DQN (or, with --no-double-q, the Nature DQN's max target) with a Huber loss, target
syncs (hard or Polyak) and a linear epsilon schedule (CleanRL's dqn).

One `iterate()` = a block of vector env steps (about 256 agent steps, at least one env step)
and the gradient steps that fell due: `gradient_steps` per `train_frequency` agent steps after
`learning_starts`, each on `dqn_batch_size` transitions. Every `target_update_interval` agent
steps the target network is copied (`tau` = 1) or moved `tau` of the way (Polyak).

Replay and envpool's next-step auto-reset: an env whose previous step reported done (a game
over, a truncation, or an Atari life loss) returns the first observation of its next episode
(or life); that step is recorded with `replay.add_reset`, never as a transition. Truncation
does not cut bootstrapping (only `terminated` is the replay's `done`).

Whenever the envs (re)start — the first iterate(), after `restart_envs()`, after
`load_state_dict()`, or after a replay buffer is assigned to `learner.replay` — the next
iterate() begins by resetting all envs and calling `replay.add_reset` for all of them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from training.args import WorkerConfig
from training.envs import EpisodeTracker, make_env
from training.exploration import EVAL_EPSILON, epsilon_greedy, linear_epsilon
from training.graphs import StepGraph, capturable_optimizer, graphs_usable
from training.metrics import Means
from training.networks import QNetwork, compile_networks, frames_layout
from training.optim import (
    LRSchedule,
    Precision,
    default_lr,
    load_optimizer_state,
    make_adam,
    never_interrupt,
    restore_rng,
    rng_state,
    warmup_adam,
)
from training.transfer import ActionReadback, Uploader

if TYPE_CHECKING:
    from training.replay import ReplayBuffer

AGENT_STEPS_PER_ITERATE = 256

# ---- the maths -------------------------------------------------------------------------------


def double_dqn_target(
    rewards: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    next_q_online: torch.Tensor,
    next_q_target: torch.Tensor,
) -> torch.Tensor:
    """r + gamma * (1 - done) * Q_target(s', argmax_a Q_online(s', a))."""
    best = next_q_online.argmax(dim=1, keepdim=True)
    next_value = next_q_target.gather(1, best).squeeze(1)
    return rewards + gamma * (1.0 - dones) * next_value


def td_loss(q_taken: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Huber (smooth L1) loss of the taken actions' Q against the TD target."""
    return F.smooth_l1_loss(q_taken, target)


# ---- the learner -----------------------------------------------------------------------------


class DQNLearner:
    def __init__(self, cfg: WorkerConfig, device: torch.device, env_seed: int) -> None:
        from training.replay import ReplayBuffer

        self.cfg = cfg
        self.device = device
        self.env_seed = env_seed
        self.envs = make_env(cfg.game, cfg.num_envs, env_seed, cfg.envpool_threads())
        self.obs_shape: tuple[int, ...] = tuple(self.envs.observation_space.shape)
        self.obs_dtype = torch.uint8 if cfg.is_atari else torch.float32
        self.n_actions = int(self.envs.action_space.n)
        self.env_ids = np.arange(cfg.num_envs)

        self.q = QNetwork(self.obs_shape, self.n_actions, cfg.mlp_sizes(), cfg.dueling).to(device)
        self.target = copy.deepcopy(self.q)
        compile_networks(cfg.compile, self.q, self.target)
        self.target.requires_grad_(False)
        self.lr = default_lr(cfg, 1e-4, 2.5e-4)
        graphs = cfg.cuda_graphs == "on"
        self.optimizer = make_adam(
            self.q.parameters(), lr=self.lr, capturable=graphs and capturable_optimizer(device)
        )
        self._params = list(self.q.parameters())
        total_updates = self._updates_due(cfg.total_steps)
        self.schedule = LRSchedule(cfg, self.optimizer, total_updates)
        self.precision = Precision(device, cfg.precision, conv=cfg.is_atari)
        self.max_grad_norm = cfg.max_grad_norm or 10.0
        # --cuda-graphs on: the gradient step and the acting forward as CUDA graphs
        # (training/graphs.py).
        usable = graphs_usable(cfg, self.precision)
        self._update_graph = (
            StepGraph(device, self._captured_step, self._params, self.optimizer) if usable else None
        )
        self._act_graph = StepGraph(device, self._captured_act) if usable else None
        self.batch = cfg.train_batch_size()
        self.end_e = 0.05 if cfg.end_e is None else cfg.end_e
        self.exploration_fraction = (
            0.5 if cfg.exploration_fraction is None else cfg.exploration_fraction
        )
        self.env_steps_per_iterate = max(1, AGENT_STEPS_PER_ITERATE // cfg.num_envs)

        self.rng = np.random.default_rng(cfg.seed)
        # The loop's host <-> device traffic, without host syncs on a GPU (training/transfer.py).
        self._upload = Uploader(device)
        self._readback = ActionReadback(device)
        self.global_step = 0
        self.updates = 0
        self.target_syncs = 0
        self.tracker = EpisodeTracker(cfg.num_envs, cfg.is_atari)
        # Diagnostics, summed on the device per gradient step and read once per take_metrics().
        self._losses = Means(("td_loss", "q_values", "grad_norm"))
        self._obs: np.ndarray | None = None
        self._done = np.zeros(cfg.num_envs, dtype=bool)
        # Asked between env steps and gradient steps (training/learner.py: cut short).
        self.interrupt: Callable[[], bool] = never_interrupt
        self.interrupted: str | None = None

        if cfg.is_atari:
            frame_shape, frame_dtype, stack = self.obs_shape[1:], np.dtype(np.uint8), 4
        else:
            frame_shape, frame_dtype, stack = self.obs_shape, np.dtype(np.float32), 1
        self._replay: ReplayBuffer | None = ReplayBuffer(
            cfg.buffer_size, frame_shape, frame_dtype, stack, chunk_bytes=cfg.replay_chunk_kib << 10
        )

    # ---- replay and envs -------------------------------------------------------------------
    @property
    def replay(self) -> ReplayBuffer | None:
        return self._replay

    @replay.setter
    def replay(self, buffer: ReplayBuffer | None) -> None:
        """A restored buffer: every env restarts (with add_reset) before the next add_step."""
        self._replay = buffer
        self._obs = None

    def restart_envs(self, env_seed: int | None = None) -> None:
        """Reset every env before the next step; with a seed, recreate them with it."""
        if env_seed is not None:
            self.envs.close()
            self.env_seed = env_seed
            self.envs = make_env(
                self.cfg.game, self.cfg.num_envs, env_seed, self.cfg.envpool_threads()
            )
        self._obs = None

    def _reset_envs(self) -> np.ndarray:
        assert self._replay is not None, "DQN needs a replay buffer"
        obs, _ = self.envs.reset()
        self._replay.add_reset(self.env_ids, obs)
        self.tracker.reset_envs()
        self._done[:] = False
        return obs

    # ---- training --------------------------------------------------------------------------
    def epsilon(self) -> float:
        cfg = self.cfg
        duration = self.exploration_fraction * cfg.total_steps
        return linear_epsilon(cfg.start_e, self.end_e, duration, self.global_step)

    def _actions(self, obs: np.ndarray) -> np.ndarray:
        explore = self.rng.random(self.cfg.num_envs) < self.epsilon()
        actions = self.rng.integers(0, self.n_actions, size=self.cfg.num_envs)
        if not explore.all():
            q = self._q_values(self._upload.put("act_obs", obs))
            greedy = self._readback.read(q.argmax(dim=1))  # the one wait on the device
            actions = np.where(explore, actions, greedy)
        return actions

    def iterate(self) -> None:
        cfg = self.cfg
        obs = self._reset_envs() if self._obs is None else self._obs
        replay = self._replay
        assert replay is not None
        self.interrupted = None
        for i in range(self.env_steps_per_iterate):
            if self.global_step >= cfg.total_steps:
                break
            if i and self.interrupt():
                self.interrupted = "env_steps"
                break
            # Act and step
            actions = self._actions(obs)
            next_obs, rewards, terminated, truncated, info = self.envs.step(actions)
            self.tracker.update(rewards, terminated, truncated, info)
            self.global_step += cfg.num_envs

            # Record: dead steps (after a done) start a new episode in the buffer
            dead = self._done
            if dead.any():
                replay.add_reset(self.env_ids[dead], next_obs[dead])
            live = ~dead
            if live.any():
                replay.add_step(
                    self.env_ids[live],
                    actions[live],
                    rewards[live],
                    terminated[live],
                    next_obs[live],
                )
            self._done = terminated | truncated
            obs = next_obs

            # Learn and sync. Cut short between two gradient steps, the ones due are taken
            # after the next env step (the loop catches up), before the sync they precede.
            due = self._updates_due(self.global_step)
            taken = 0
            while self.updates < due and len(replay) >= self.batch:
                if taken and self.interrupt():
                    self.interrupted = "gradient_steps"
                    break
                self._train_step(replay)
                taken += 1
            if self.interrupted:
                break
            if self.global_step // cfg.target_update_interval > self.target_syncs:
                self.target_syncs = self.global_step // cfg.target_update_interval
                self._sync_target()
        self._obs = obs
        self.schedule.after_steps(self.global_step, self.updates)

    def _updates_due(self, step: int) -> int:
        cfg = self.cfg
        return max(0, step - cfg.learning_starts) // cfg.train_frequency * cfg.gradient_steps

    def _sync_target(self) -> None:
        if self.cfg.tau >= 1.0:
            self.target.load_state_dict(self.q.state_dict())
            return
        with torch.no_grad():
            target = list(self.target.parameters())
            torch._foreach_lerp_(target, list(self.q.parameters()), self.cfg.tau)

    def _q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(obs) in fp32, for acting (no autograd)."""
        if self._act_graph is not None:
            self._act_graph.feed(obs=obs)
            return self._act_graph()
        with torch.inference_mode(), self.precision.autocast():
            return self.q(obs).float()

    def _captured_act(self, static: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad(), self.precision.autocast(cache=False):
            return self.q(static["obs"]).float()

    def _train_step(self, replay: ReplayBuffer) -> None:
        obs, actions, rewards, next_obs, dones = replay.sample(self.batch, self.rng)
        put = self._upload.put
        batch = {
            "obs": frames_layout(put("obs", obs)),
            "next_obs": frames_layout(put("next_obs", next_obs)),  # used twice
            "actions": put("actions", actions).long().reshape(-1, 1),
            "rewards": put("rewards", rewards).float().reshape(-1),
            "dones": put("dones", dones).float().reshape(-1),
        }
        if self._update_graph is not None:
            self._update_graph.feed(**batch)
            self._losses.add_vector(self._update_graph())
        else:
            self._losses.add(*self._gradient_step(batch))
        self.updates += 1
        self.schedule.after_update()

    def _gradient_step(
        self, batch: dict[str, torch.Tensor], cache: bool = True
    ) -> tuple[torch.Tensor, ...]:
        """One gradient step on a sampled batch; its diagnostics, tensors on the device."""
        cfg = self.cfg
        next_t = batch["next_obs"]
        with torch.no_grad(), self.precision.autocast(cache):
            next_target = self.target(next_t).float()
            # --no-double-q: the target network picks and values (its max), one forward less
            next_online = self.q(next_t).float() if cfg.double_q else next_target
        target = double_dqn_target(
            batch["rewards"], batch["dones"], cfg.gamma, next_online, next_target
        )
        with self.precision.autocast(cache):
            q_taken = self.q(batch["obs"]).float().gather(1, batch["actions"]).squeeze(1)
        loss = td_loss(q_taken, target)
        grad_norm = self.precision.step(loss, self.optimizer, self._params, self.max_grad_norm)
        return loss, q_taken.mean(), grad_norm

    def _captured_step(self, static: dict[str, torch.Tensor]) -> torch.Tensor:
        """The step a CUDA graph captures (training/graphs.py): static inputs, one output."""
        return torch.stack([m.detach().float() for m in self._gradient_step(static, False)])

    def take_metrics(self) -> dict[str, float]:
        """Means of the diagnostics since the last call (one device sync; the loss entries
        are absent when no gradient step ran since, e.g. before learning_starts), and the
        current learning rate, epsilon and replay fill (fraction of the capacity)."""
        replay = self._replay
        fill = len(replay) / replay.capacity if replay is not None else 0.0
        return {
            **self._losses.take(),
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
            "epsilon": self.epsilon(),
            "replay_fill": fill,
        }

    # ---- acting, warmup, state -------------------------------------------------------------
    def act_greedy(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode(), self.precision.autocast():
            q = self.q(torch.as_tensor(obs, device=self.device))
        return q.float().argmax(dim=1).cpu().numpy()

    def act_eval(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The evaluation policy: epsilon-greedy with EVAL_EPSILON, drawn from the
        evaluation's own generator (the learner's RNG stays as training had it)."""
        return epsilon_greedy(self.act_greedy(obs), EVAL_EPSILON, self.n_actions, rng)

    def warmup_optimizer(self) -> None:
        dummy = torch.zeros((self.batch, *self.obs_shape), dtype=self.obs_dtype)
        dummy = dummy.to(self.device)

        def loss() -> torch.Tensor:
            with self.precision.autocast():
                return self.q(dummy).float().mean()

        warmup_adam(self.q, self.optimizer, loss)

    def state_dict(self) -> dict[str, Any]:
        return {
            "algo": "dqn",
            "q": self.q.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "scaler": self.precision.state_dict(),
            "global_step": self.global_step,
            "updates": self.updates,
            "target_syncs": self.target_syncs,
            "tracker": self.tracker.state_dict(),
            "rng": rng_state(self.rng),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("algo") != "dqn":
            raise ValueError(f"not a DQN learner state (algo={state.get('algo')!r})")
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        load_optimizer_state(self.optimizer, state["optimizer"])  # new state tensors:
        if self._update_graph is not None:
            self._update_graph.reset()  # the graph captured the old ones
        self.schedule.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state["scaler"])
        self.global_step = int(state["global_step"])
        self.updates = int(state["updates"])
        self.target_syncs = int(state["target_syncs"])
        self.tracker.load_state_dict(state["tracker"])
        restore_rng(self.rng, state["rng"])
        self._obs = None  # the envs are not part of the state: start fresh episodes

    def close(self) -> None:
        self.envs.close()
