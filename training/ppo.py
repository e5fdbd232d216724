"""PPO (clipped surrogate, clipped value loss, entropy bonus), as CleanRL's ppo_atari_envpool.

One `iterate()` = one rollout of num_envs * n_steps agent steps, then `epochs` passes of
minibatch updates over it.

Envpool's next-step auto-reset: the step taken from an observation that followed a done is a
*dead* step (envpool ignores its action and returns the reset observation with reward 0). With
CleanRL's convention `dones[t]` = "obs[t] came right after a done", exactly the dead steps have
`dones[t] == 1`; they carry no information about the policy, so the losses mask them out. The
bootstrapping cut (`1 - dones[t + 1]` in GAE) is the same as CleanRL's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.distributions import Categorical

from training.args import WorkerConfig
from training.envs import EpisodeTracker
from training.graphs import StepGraph, capturable_optimizer, graphs_usable
from training.masking import masked_mean
from training.metrics import Means, explained_variance
from training.networks import ActorCritic, compile_networks, rollout_frames
from training.optim import (
    LRSchedule,
    Precision,
    default_lr,
    iterations_for,
    load_optimizer_state,
    make_adam,
    never_interrupt,
    restore_rng,
    rng_state,
    warmup_adam,
)
from training.overlap import rollout_in_halves
from training.rollout import RolloutLearner
from training.transfer import ActionReadback, Uploader, device_generator

# ---- the maths -------------------------------------------------------------------------------


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    next_value: torch.Tensor,
    next_done: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a (T, N) rollout -> (advantages, returns).

    `dones[t]` is 1 when obs[t] followed an episode end (CleanRL's convention); `next_value` and
    `next_done` describe the observation after the last step.
    """
    steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(steps)):
        if t == steps - 1:
            not_done, next_v = 1.0 - next_done, next_value
        else:
            not_done, next_v = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * next_v * not_done - values[t]
        last = delta + gamma * lam * not_done * last
        advantages[t] = last
    return advantages, advantages + values


def normalize_advantages(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mean = masked_mean(adv, mask)
    var = masked_mean((adv - mean) ** 2, mask)
    return (adv - mean) / (var.sqrt() + 1e-8)


@dataclasses.dataclass(frozen=True)
class PPOLoss:
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor | None = None  # fraction of valid samples whose ratio was clipped

    def total(self, vf_coef: float, ent_coef: float) -> torch.Tensor:
        return self.policy - ent_coef * self.entropy + vf_coef * self.value


def ppo_loss(
    new_logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    new_value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    clip_coef: float,
    mask: torch.Tensor | None = None,
) -> PPOLoss:
    """Clipped surrogate, clipped value loss (0.5 * max of squared errors), mean entropy."""
    if mask is None:
        mask = torch.ones_like(advantages)
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
    v_unclipped = (new_value - returns) ** 2
    v_clipped = (old_value + (new_value - old_value).clamp(-clip_coef, clip_coef) - returns) ** 2
    return PPOLoss(
        policy=masked_mean(torch.max(pg1, pg2), mask),
        value=0.5 * masked_mean(torch.max(v_unclipped, v_clipped), mask),
        entropy=masked_mean(entropy, mask),
        approx_kl=masked_mean((ratio - 1.0) - log_ratio, mask).detach(),
        clipfrac=masked_mean(((ratio - 1.0).abs() > clip_coef).float(), mask).detach(),
    )


# ---- the learner -----------------------------------------------------------------------------


class PPOLearner(RolloutLearner):
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
        n_actions = int(self.envs.action_space.n)

        self.net = ActorCritic(self.obs_shape, n_actions, cfg.mlp_sizes()).to(device)
        compile_networks(cfg.compile, self.net)
        self.lr = default_lr(cfg, 2.5e-4, 2.5e-4)
        graphs = cfg.cuda_graphs == "on"
        self.optimizer = make_adam(
            self.net.parameters(),
            lr=self.lr,
            eps=1e-5,
            capturable=graphs and capturable_optimizer(device),
        )
        self._params = list(self.net.parameters())
        self.minibatch = cfg.minibatch_size()
        self.n_minibatches = cfg.rollout_size() // self.minibatch
        total_updates = (
            iterations_for(cfg.total_steps, cfg.rollout_size()) * cfg.epochs * self.n_minibatches
        )
        self.schedule = LRSchedule(cfg, self.optimizer, total_updates)
        self.precision = Precision(device, cfg.precision, conv=cfg.is_atari)
        self.clip_coef = cfg.clip_coef or (0.1 if cfg.is_atari else 0.2)
        self.max_grad_norm = cfg.max_grad_norm or 0.5
        # --cuda-graphs on: the gradient step as one CUDA graph (training/graphs.py).
        self._scaled = False
        usable = graphs_usable(cfg, self.precision)
        self._update_graph = (
            StepGraph(device, self._captured_step, self._params, self.optimizer) if usable else None
        )
        self._act_graph = StepGraph(device, self._captured_act) if usable else None
        self._returns_graph = StepGraph(device, self._captured_advantages) if usable else None

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
        self._losses = Means(
            ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "grad_norm")
        )
        self._explained = Means(("explained_variance",))
        self._next_obs: torch.Tensor | None = None
        self._next_done = torch.zeros(cfg.num_envs, device=device)
        # Asked between rollout steps and minibatches (training/learner.py: cut short).
        self.interrupt: Callable[[], bool] = never_interrupt
        self.interrupted: str | None = None
        # Seconds spent per phase of iterate(), summed (benchmarks/worker_throughput.py reads
        # them): env stepping, the network acting, copies into the rollout buffers and between
        # numpy and torch, the update (advantages and the minibatch epochs). On a GPU the
        # device runs ahead of these host clocks, so "update" absorbs the waits.
        self.phase_s = {"env": 0.0, "inference": 0.0, "copies": 0.0, "update": 0.0}

        shape = (cfg.n_steps, cfg.num_envs)
        self.b_obs = torch.zeros(shape + self.obs_shape, dtype=self.obs_dtype, device=device)
        self.b_actions = torch.zeros(shape, dtype=torch.long, device=device)
        self.b_logprobs = torch.zeros(shape, device=device)
        self.b_rewards = torch.zeros(shape, device=device)
        self.b_dones = torch.zeros(shape, device=device)
        self.b_values = torch.zeros(shape, device=device)

    # ---- envs ------------------------------------------------------------------------------
    # ---- training --------------------------------------------------------------------------
    def _rollout(
        self,
        next_obs: torch.Tensor,
        next_done: torch.Tensor,
        start_step: int,
        tracker_state: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rollout, every env stepped at once; cut short: `interrupted` set.

        One autocast region for all of it: its cache casts the weights to the low precision
        once per rollout instead of on every step (they change only in updates). No autograd
        while acting: no_grad, not inference mode, which bypasses autocast's weight cache
        (every step cast all 1.7M weights again: 0.6 ms for the fc layer alone)."""
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
                    logits, value = self._act(next_obs)
                    dist = Categorical(logits=logits.float(), validate_args=False)
                    action = dist.sample()
                    self.b_actions[step] = action
                    self.b_logprobs[step] = dist.log_prob(action)
                    self.b_values[step] = value.float()
                    actions = self._readback.read(action)  # the loop's one wait on the device
                t2 = clock()
                obs, reward, terminated, truncated, info = self.envs.step(actions)
                t3 = clock()
                self.tracker.update(reward, terminated, truncated, info)
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
        """The rollout with --env-overlap on (training/overlap.py); None when cut short."""
        envs = self.envs

        def act(step: int, half: int, obs: torch.Tensor) -> np.ndarray:
            cols = envs.cols[half]
            with torch.no_grad():
                logits, value = self._act(obs)
                dist = Categorical(logits=logits.float(), validate_args=False)
                action = dist.sample()
                self.b_actions[step, cols] = action
                self.b_logprobs[step, cols] = dist.log_prob(action)
                self.b_values[step, cols] = value.float()
                return self._readback.read(action)

        with self.precision.autocast():
            return rollout_in_halves(self, next_obs, next_done, start_step, tracker_state, act)

    def _update(self, next_obs: torch.Tensor, next_done: torch.Tensor) -> None:
        """Advantages, then the epochs of minibatch updates over the rollout."""
        clock, phase = time.perf_counter, self.phase_s
        t_update = clock()
        # Advantages
        with torch.inference_mode(), self.precision.autocast():
            next_value = self.net.value(next_obs).float()
        if self._returns_graph is not None:  # 128 steps of GAE: hundreds of small kernels
            self._returns_graph.feed(next_value=next_value, next_done=next_done)
            advantages, returns = self._returns_graph().unbind(0)
        else:
            advantages, returns = self._advantages(next_value, next_done)
        self._optimize(advantages, returns)
        phase["update"] += clock() - t_update
        self.iterations += 1
        self.schedule.after_steps(self.global_step, self.updates)

    def _advantages(
        self, next_value: torch.Tensor, next_done: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        return gae(
            self.b_rewards,
            self.b_values,
            self.b_dones,
            next_value,
            next_done,
            cfg.gamma,
            cfg.gae_lambda,
        )

    def _captured_advantages(self, static: dict[str, torch.Tensor]) -> torch.Tensor:
        """GAE as a CUDA graph captures it: the rollout buffers (the learner's own, never
        reallocated) and the fed bootstrap; advantages and returns stacked."""
        return torch.stack(self._advantages(static["next_value"], static["next_done"]))

    def _act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's logits and the values of a batch of observations (under no_grad)."""
        if self._act_graph is None:
            return self.net(obs)  # type: ignore[no-any-return]
        self._act_graph.feed(obs=obs)
        out = self._act_graph()
        return out[:, :-1], out[:, -1]

    def _captured_act(self, static: dict[str, torch.Tensor]) -> torch.Tensor:
        """The acting forward a CUDA graph captures: logits and value side by side."""
        with torch.no_grad(), self.precision.autocast(cache=False):
            logits, value = self.net(static["obs"])
        return torch.cat([logits.float(), value.float().reshape(-1, 1)], dim=1)

    def _rollout_batch(
        self, advantages: torch.Tensor, returns: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The rollout as the update reads it: flat over (step, env), dead steps masked."""
        obs = self.b_obs.reshape((-1, *self.obs_shape))
        obs, self._scaled = rollout_frames(obs, self.precision.dtype)  # cast once for all epochs
        return {
            "obs": obs,
            "actions": self.b_actions.reshape(-1),
            "logprobs": self.b_logprobs.reshape(-1),
            "values": self.b_values.reshape(-1),
            "adv": advantages.reshape(-1),
            "ret": returns.reshape(-1),
            "valid": 1.0 - self.b_dones.reshape(-1),  # dead steps out
        }

    def _minibatch_loss(
        self, r: dict[str, torch.Tensor], mb: torch.Tensor, cache: bool = True
    ) -> tuple[torch.Tensor, PPOLoss]:
        cfg = self.cfg
        with self.precision.autocast(cache):
            logits, new_value = self.net(r["obs"][mb], self._scaled)
        dist = Categorical(logits=logits.float(), validate_args=False)
        valid = r["valid"][mb]
        loss = ppo_loss(
            dist.log_prob(r["actions"][mb]),
            r["logprobs"][mb],
            normalize_advantages(r["adv"][mb], valid),
            new_value.float(),
            r["values"][mb],
            r["ret"][mb],
            dist.entropy(),
            self.clip_coef,
            valid,
        )
        return loss.total(cfg.vf_coef, cfg.ent_coef), loss

    def _gradient_step(
        self, r: dict[str, torch.Tensor], mb: torch.Tensor, cache: bool = True
    ) -> tuple[torch.Tensor, ...]:
        """One minibatch's step; its diagnostics, tensors on the device."""
        total, loss = self._minibatch_loss(r, mb, cache)
        grad_norm = self.precision.step(total, self.optimizer, self._params, self.max_grad_norm)
        assert loss.clipfrac is not None
        return (loss.policy, loss.value, loss.entropy, loss.approx_kl, loss.clipfrac, grad_norm)

    def _optimize(self, advantages: torch.Tensor, returns: torch.Tensor) -> None:
        r = self._rollout_batch(advantages, returns)
        self._minibatch_epochs(r)
        # How much of the returns' variance the rollout's value estimates explained.
        self._explained.add(explained_variance(r["values"], r["ret"], r["valid"]))

    def take_metrics(self) -> dict[str, float]:
        """Means of the diagnostics since the last call (one device sync), and the current
        learning rate. Loss entries are absent when no update ran since."""
        return {
            **self._losses.take(),
            **self._explained.take(),
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
        }

    # ---- acting, warmup, state -------------------------------------------------------------
    def act_eval(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The evaluation policy: a sample of the policy (Gumbel-max with the evaluation's
        own generator, so torch's RNG stream is left as training had it)."""
        with torch.inference_mode(), self.precision.autocast():
            logits, _ = self.net(self._to_tensor(obs))
        logits_np = logits.float().cpu().numpy().astype(np.float64)
        return np.argmax(logits_np + rng.gumbel(size=logits_np.shape), axis=1)

    def warmup_optimizer(self) -> None:
        dummy = torch.zeros((self.minibatch, *self.obs_shape), dtype=self.obs_dtype)
        dummy = dummy.to(self.device)

        def loss() -> torch.Tensor:
            with self.precision.autocast():
                logits, value = self.net(dummy)
            return logits.float().mean() + value.float().mean()

        warmup_adam(self.net, self.optimizer, loss)

    def state_dict(self) -> dict[str, Any]:
        return {
            "algo": "ppo",
            "net": self.net.state_dict(),
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
        if state.get("algo") != "ppo":
            raise ValueError(f"not a PPO learner state (algo={state.get('algo')!r})")
        self.net.load_state_dict(state["net"])
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
