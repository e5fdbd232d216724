"""The interface the worker runtime drives (`Learner`), which PPO, DQN and PQN implement.
Imports none of them: training/registry.py makes one by its `--algo`.

Lifecycle (the worker's side):

    learner = make_learner(cfg, device, env_seed)   # envs made, nothing stepped yet
    learner.warmup_optimizer()                      # allocate optimizer state now (OOM early)
    learner.replay = restored_buffer                # DQN resume only: any time before iterate()
    learner.load_state_dict(state)                  # resume only
    while learner.global_step < cfg.total_steps:
        learner.iterate()
    learner.close()

Cut short on request: `learner.interrupt` (a callable, by default never true; the worker sets
training/checkpoint_request.py's) is asked between two rollout steps, two minibatches, two env
steps or two gradient steps; when it says yes, iterate() returns at once with the learner in a
state that a checkpoint may take and a resume (or the next iterate()) continues from, and
`learner.interrupted` says what was given up:

- "rollout" (PPO, PQN): the partial rollout is abandoned. Its agent steps are not counted and
  its finished episodes are forgotten (global_step and the episode tracker are back where the
  iteration began: nothing was learned from them); the envs restart at the next iterate().
  The RNG streams it drew from stay advanced.
- "update" (PPO, PQN): the update stops after the minibatch in progress. The rollout's steps
  count (the params learned from them), the remaining minibatches and epochs over it are lost.
  Counters, optimizer, LR schedule and RNG are those of the last minibatch taken.
- "env_steps" / "gradient_steps" (DQN): nothing is lost. Every env step taken is in the replay
  buffer and counted; gradient steps that fell due and were not taken are taken after the next
  env step (the loop catches up on `updates`), before the target sync they precede.

None: the iteration ran to its end.

Envs are (re)started lazily: the first iterate() after construction, after `restart_envs()` or
after a replay buffer is assigned resets every env (and, for DQN, calls `replay.add_reset` for
all of them) before it steps. A checkpoint therefore never needs the envs' state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from training.args import WorkerConfig
from training.envs import EpisodeTracker
from training.optim import Precision

if TYPE_CHECKING:
    from training.replay import ReplayBuffer


class RolloutCut:
    """What the rollout learners (PPO, PQN) share to cut an iteration short mid-rollout."""

    global_step: int
    tracker: EpisodeTracker
    interrupted: str | None
    _next_obs: torch.Tensor | None

    def _abandon_rollout(
        self,
        step: int,
        next_obs: torch.Tensor,
        start_step: int,
        tracker_state: dict[str, Any],
    ) -> None:
        """Cut short mid-rollout: as if it never began, but for the RNG draws (the envs restart
        at the next iterate()); at its first step nothing was taken and the envs stay."""
        self.interrupted = "rollout"
        if step == 0:
            self._next_obs = next_obs
            return
        self.global_step = start_step
        self.tracker.load_state_dict(tracker_state)
        self._next_obs = None


class Learner(Protocol):
    cfg: WorkerConfig
    device: torch.device
    global_step: int
    updates: int
    tracker: EpisodeTracker
    replay: ReplayBuffer | None
    precision: Precision  # the networks' arithmetic (--precision, resolved)
    interrupt: Callable[[], bool]  # asked between minibatches and env steps: stop here?
    interrupted: str | None  # what the last iterate() gave up when cut short (see above)

    def iterate(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    # The evaluation policy (training/evaluate.py): PPO samples, DQN and PQN are
    # epsilon-greedy; its randomness from `rng`, never from the learner's own streams.
    def act_eval(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...
    def warmup_optimizer(self) -> None: ...
    def restart_envs(self, env_seed: int | None = None) -> None: ...
    def close(self) -> None: ...
    # The diagnostics averaged since the last call (training/metrics.py), one device sync.
    def take_metrics(self) -> dict[str, float]: ...
