"""Stable-Baselines3 under rlsup: checkpoints that resume an SB3 model where it stopped, without
pickle, and heartbeats from its training loop.

    import rlsup
    from rlsup.sb3 import RlsupCallback, resume
    from stable_baselines3 import DQN

    run = rlsup.attach("runs/cartpole")          # RLSUP_RUN_DIR wins under `rlsup run`
    model, run = resume(DQN, env, run, policy="MlpPolicy", buffer_size=50_000)
    model.learn(total - model.num_timesteps, reset_num_timesteps=False,
                callback=RlsupCallback(run))
    if run.should_stop():                        # only reached with attach(exit_on_stop=False)
        run.exit_stopped()

What a checkpoint holds (`with run.checkpoint(step)`; nothing in it executes code on load):

- `params.pt`: `model.get_parameters()` (the networks' and optimizers' state dicts), written
  with `torch.save` and read with `torch.load(..., weights_only=True)`; never SB3's own
  `model.save()` zip, whose `data` entry is cloudpickled;
- `state.pt`: the torch variables SB3 keeps outside modules (SAC's `log_ent_coef`) and
  torch's CPU RNG state (weights_only as well);
- `sb3.json`: the counters (`num_timesteps`, `_n_updates`, `_episode_num`, `_total_timesteps`,
  `_current_progress_remaining`, DQN's `_n_calls` and `exploration_rate`), the episode-info
  window (mean return), numpy's global RNG state, the replay buffer's and VecNormalize's
  scalars;
- arrays (`run.save_arrays`): the replay buffer's filled part (`replay-observations`,
  `replay-next_observations` unless optimize_memory_usage, `replay-actions`, `replay-rewards`,
  `replay-dones`, `replay-timeouts`; a Dict observation space adds `-<index>` per key) and the
  VecNormalize running statistics (`vecnorm-obs-mean`, `-var`, `vecnorm-ret-mean`, `-var`).

When checkpoints are taken (all at SB3's callback points, so a checkpoint is one consistent
state): periodic ones at the start of a rollout, after the previous rollout's gradient steps
(off-policy: every `train_freq`; on-policy: every `n_steps`), when `run.should_checkpoint()`.
A stop (SIGTERM) is seen at the next environment step: off-policy, the state saved is the one
before that step (the step's transition is not yet in the buffer, so `num_timesteps` is saved
one vector step back); on-policy, the state at the start of the rollout in progress (its
partial rollout is collected again after the resume; VecNormalize's running statistics are
the only thing saved as of the stop's step). When `learn()` ends (all its timesteps, or another
callback stopped it), a final checkpoint (`final_checkpoint=True`, the default) makes the
run's last checkpoint its final model. Then, on a stop, with `attach(exit_on_stop=True)`
(the default) the SDK exits 75 right after the commit, from inside `model.learn()`; with
`exit_on_stop=False` the callback returns False, `learn()` returns, and the script calls
`run.exit_stopped()`. A checkpoint that fails (`CheckpointFailed`: a full disk, an I/O error,
while the files are written or at the commit) is logged, counted in the heartbeat's
`checkpoint_failures`, and training goes on (retried within 60 s); a failed stop checkpoint
still stops.

Evaluations: `RlsupEvalCallback(eval_env, run, eval_freq=..., n_eval_episodes=...)` is SB3's
`EvalCallback` (every argument of it taken) whose evaluations rlsup records through
`run.evaluation()`: the supervisor's `evaluation` event, `rlsup results` EVAL, status, the time
split's evaluation part (each evaluation runs inside `run.evaluating()`, which times it and
keeps a long one from reading as a hang). For an `EvalCallback` of your own, pass
`callback_after_eval=RlsupEvalReport(run)` (not timed). Each reports the mean return at
`num_timesteps`, the episodes, and where SB3 keeps them (with `log_path`) the std and mean
episode length, and the success rate when the env reports `is_success`.

Not saved: the environments' own state (a resumed run starts new episodes), action-noise
processes' internal state, and replay buffers other than `ReplayBuffer` / `DictReplayBuffer`
(HER and custom buffers are refused at `learn()` start).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.save_util import recursive_getattr

from rlsup._evaluation import EVALUATING_DEADLINE_S
from rlsup._run import CheckpointFailed, Run, SdkError, attach
from rlsup._sb3_arrays import (
    check_buffer,
    load_replay,
    load_vecnorm,
    replay_digest,
    save_replay,
    save_vecnorm,
)

__all__ = [
    "FORMAT",
    "RlsupCallback",
    "RlsupEvalCallback",
    "RlsupEvalReport",
    "replay_digest",
    "restore",
    "resume",
    "save",
]

FORMAT = 1
STATE_JSON = "sb3.json"
PARAMS_FILE = "params.pt"
STATE_FILE = "state.pt"
# The counters an SB3 algorithm keeps outside its networks, saved when the model has them.
COUNTERS = (
    "num_timesteps",
    "_n_updates",
    "_episode_num",
    "_total_timesteps",
    "_current_progress_remaining",
    "_n_calls",  # DQN: target-network updates every target_update_interval calls
    "exploration_rate",  # DQN: epsilon in force (used before the next step recomputes it)
)
_EPISODES_ATTR = "_rlsup_episodes"

log = logging.getLogger("rlsup.sb3")

M = TypeVar("M", bound=BaseAlgorithm)


# ---- the callback --------------------------------------------------------------------------


class RlsupCallback(BaseCallback):
    """Heartbeats on `num_timesteps` (with the mean episode return of SB3's episode-info window
    and the episode count), checkpoints through `run` when `run.should_checkpoint()` says so,
    and on a stop request saves and stops training (see the module's docstring).

    heartbeat_every_s: heartbeat at most this often (the SDK's heartbeat costs tens of
    microseconds, a few percent of a fast environment's step).
    final_checkpoint: checkpoint where `learn()` ends.
    record_digest: also store `replay_digest()` of the replay buffer in each checkpoint (a
    sha256 over its filled part; `restore()` then checks the loaded buffer against it). Costs
    a pass over the buffer per checkpoint: for tests and audits, not large buffers.
    """

    def __init__(
        self,
        run: Run,
        *,
        final_checkpoint: bool = True,
        record_digest: bool = False,
        heartbeat_every_s: float = 0.05,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        self.run = run
        self.heartbeat_every_s = heartbeat_every_s
        self._heartbeat_at = -math.inf
        self.final_checkpoint = final_checkpoint
        self.record_digest = record_digest
        self.checkpoints = 0  # committed by this callback
        self.failures = 0
        self._rollout_start: int | None = None
        self._in_rollout = False
        self._stopping = False

    def _init_callback(self) -> None:
        buffer = getattr(self.model, "replay_buffer", None)
        if buffer is not None:
            check_buffer(buffer)

    def _on_rollout_start(self) -> None:
        model = self.model
        self._rollout_start = int(model.num_timesteps)
        self._in_rollout = True
        step = int(model.num_timesteps)
        if self._stopping or step == self.run.last_checkpoint_step:
            return
        if (step > 0 or self.run.should_stop()) and self.run.should_checkpoint(step):
            # Between rollouts: the previous rollout stored and trained on, nothing half done.
            self._save(step, rewind=0)

    def _on_rollout_end(self) -> None:
        self._in_rollout = False

    def _on_training_end(self) -> None:
        """`learn()` is done (or another callback stopped it): save where it ended, so that the
        run's last checkpoint is its final model."""
        if self._stopping or not self.final_checkpoint:
            return
        step, rewind = int(self.model.num_timesteps), 0
        if self._in_rollout:  # stopped mid-rollout by another callback: the last whole state
            step, rewind = self._consistent_before(step)
        if step > 0 and step != self.run.last_checkpoint_step:
            self._save(step, rewind=rewind)

    def _consistent_before(self, step: int) -> tuple[int, int]:
        """(step, rewind) of the last consistent state when a rollout is cut at `step`, inside
        `_on_step`: off-policy, the state before this step (SB3 has not yet stored it);
        on-policy, the state at the rollout's start (its partial rollout is not saved)."""
        if isinstance(self.model, OffPolicyAlgorithm):
            at = step - int(self.model.n_envs)
        else:
            at = self._rollout_start if self._rollout_start is not None else step
        return at, step - at

    def _on_step(self) -> bool:
        model = self.model
        step = int(model.num_timesteps)
        dones = self.locals.get("dones")
        episodes = getattr(model, _EPISODES_ATTR, 0)
        if dones is not None:
            episodes += int(np.count_nonzero(dones))
            setattr(model, _EPISODES_ATTR, episodes)
        now = time.monotonic()
        if now - self._heartbeat_at >= self.heartbeat_every_s:
            self._heartbeat_at = now
            buf = model.ep_info_buffer
            mean_return = float(np.mean([e["r"] for e in buf])) if buf else None
            self.run.heartbeat(step, mean_return=mean_return, episodes=episodes)
        if not self.run.should_stop():
            return True
        # A stop: save the last consistent state before this step, then stop training.
        at, rewind = self._consistent_before(step)
        if not self._stopping and at != self.run.last_checkpoint_step:
            self._save(at, rewind=rewind)
        self._stopping = True
        if self.run.exit_on_stop and self.run.last_checkpoint_step == at:
            self.run.exit_stopped()
        return False

    def _save(self, step: int, *, rewind: int) -> None:
        try:
            with self.run.checkpoint(step, sb3=type(self.model).__name__) as d:
                save(self.model, self.run, d, rewind=rewind, record_digest=self.record_digest)
        except CheckpointFailed as exc:
            # A full disk, an I/O error (inside the block too: the SDK counted it in the
            # heartbeat): nothing was committed, the previous checkpoint stands.
            self.failures += 1
            log.warning("rlsup.sb3: checkpoint at step %d failed, training goes on: %s", step, exc)
        else:
            self.checkpoints += 1


# ---- evaluations ----------------------------------------------------------------------------


class RlsupEvalCallback(EvalCallback):
    """SB3's `EvalCallback` (its arguments as they are) whose evaluations are recorded through
    `run.evaluation()`, each inside `run.evaluating(deadline_s)` (timed; the step may stand
    still that long while it runs)."""

    def __init__(
        self,
        eval_env: Any,
        run: Run,
        *,
        deadline_s: float = EVALUATING_DEADLINE_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(eval_env, **kwargs)
        self.run = run
        self.deadline_s = deadline_s
        self.reported = 0  # evaluations recorded through the run

    def _on_step(self) -> bool:
        if not (self.eval_freq > 0 and self.n_calls % self.eval_freq == 0):
            return super()._on_step()
        with self.run.evaluating(self.deadline_s):
            done = len(self.evaluations_timesteps)
            go_on = super()._on_step()  # evaluates: it is due
            self.reported += _report(self.run, self, len(self.evaluations_timesteps) > done)
        return go_on


class RlsupEvalReport(BaseCallback):
    """`EvalCallback(..., callback_after_eval=RlsupEvalReport(run))`: each evaluation of an
    `EvalCallback` of your own, recorded through `run.evaluation()` (not timed: wrap it in
    `RlsupEvalCallback` for the evaluation's seconds)."""

    def __init__(self, run: Run, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.run = run
        self.reported = 0

    def _on_step(self) -> bool:
        parent = self.parent
        if not isinstance(parent, EvalCallback):
            raise SdkError(
                "RlsupEvalReport: pass it as EvalCallback(..., callback_after_eval=...), "
                "not as a callback of learn()"
            )
        logged = bool(parent.evaluations_timesteps) and (
            parent.evaluations_timesteps[-1] == parent.num_timesteps
        )
        self.reported += _report(self.run, parent, logged)
        return True


def _report(run: Run, cb: EvalCallback, logged: bool) -> bool:
    """`cb`'s latest evaluation through `run.evaluation()`; `logged`: SB3 kept its episodes
    (with `log_path`), so their std and mean length are known too."""
    extra: dict[str, float] = {}
    if logged and cb.evaluations_results:
        rewards = np.asarray(cb.evaluations_results[-1], dtype=np.float64)
        lengths = np.asarray(cb.evaluations_length[-1], dtype=np.float64)
        extra["std"] = float(rewards.std()) if rewards.size else math.nan
        extra["mean_ep_length"] = float(lengths.mean()) if lengths.size else math.nan
    if cb._is_success_buffer:
        extra["success_rate"] = float(np.mean(cb._is_success_buffer))
    return run.evaluation(
        int(cb.num_timesteps), float(cb.last_mean_reward), episodes=cb.n_eval_episodes, **extra
    )


# ---- saving ---------------------------------------------------------------------------------


def save(
    model: BaseAlgorithm, run: Run, d: Path, *, rewind: int = 0, record_digest: bool = False
) -> None:
    """Write `model`'s state into the open checkpoint directory `d` of `run` (inside
    `with run.checkpoint(step) as d`). rewind: how many timesteps `num_timesteps` is ahead of
    the state saved (a stop seen in `_on_step`, before SB3 stored that step)."""
    _torch_save(model.get_parameters(), d / PARAMS_FILE)
    _, variable_names = model._get_torch_save_params()
    variables = {name: recursive_getattr(model, name).detach().cpu() for name in variable_names}
    _torch_save({"variables": variables, "torch_rng": torch.get_rng_state()}, d / STATE_FILE)
    counters: dict[str, Any] = {}
    for name in COUNTERS:
        if hasattr(model, name):
            value = getattr(model, name)
            counters[name] = float(value) if isinstance(value, float) else int(value)
    counters["num_timesteps"] -= rewind
    state: dict[str, Any] = {
        "format": FORMAT,
        "algo": type(model).__name__,
        "policy": type(model.policy).__name__,
        "n_envs": int(model.n_envs),
        "counters": counters,
        "episodes": int(getattr(model, _EPISODES_ATTR, 0)),
        "ep_info": _ep_info(model.ep_info_buffer),
        "numpy_rng": _numpy_rng_state(),
        "replay": None,
        "vec_normalize": None,
    }
    buffer = getattr(model, "replay_buffer", None)
    if buffer is not None:
        state["replay"] = save_replay(buffer, run, record_digest)
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is not None:
        state["vec_normalize"] = save_vecnorm(vecnorm, run)
    _write_json(d / STATE_JSON, state)


def _torch_save(obj: Any, path: Path) -> None:
    """torch.save, its write failures (a full disk: torch's zip writer raises RuntimeError)
    as OSError."""
    try:
        torch.save(obj, path)
    except RuntimeError as exc:
        raise OSError(f"{path.name}: {exc}") from exc


def _write_json(path: Path, value: Any) -> None:
    import json

    path.write_text(json.dumps(value, allow_nan=True), encoding="utf-8")


def _ep_info(buffer: deque[dict[str, Any]] | None) -> list[dict[str, float]]:
    if not buffer:
        return []
    return [{k: float(v) for k, v in e.items() if k in ("r", "l", "t")} for e in buffer]


def _numpy_rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "kind": str(kind),
        "keys": [int(k) for k in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


# ---- loading --------------------------------------------------------------------------------


def resume(model_class: type[M], env: Any, run: Run | None = None, **kwargs: Any) -> tuple[M, Run]:
    """`model_class(env=env, **kwargs)` (the policy and hyperparameters in kwargs), restored
    from the run's newest verified checkpoint when it has one (see `restore`). `run`: an
    attached run, else `rlsup.attach()` (under `rlsup run`). Returns (model, run); then
    `model.learn(total - model.num_timesteps, reset_num_timesteps=False,
    callback=RlsupCallback(run))` continues where the checkpoint stopped (with that call,
    SB3's `_total_timesteps` is `total` again, so schedules continue rather than restart)."""
    if run is None:
        run = attach()
    model = model_class(env=env, **kwargs)
    restore(model, run)
    return model, run


def restore(model: BaseAlgorithm, run: Run) -> bool:
    """Load the run's newest verified checkpoint (`run.latest()`) into `model`, built the same
    way as the one saved: parameters and optimizers, torch variables, counters, the episode-info
    window, the RNG states, the replay buffer and VecNormalize statistics. False when the run
    has no checkpoint (the model is left as built). SdkError when the checkpoint does not fit
    the model (another algorithm, policy, number of envs or buffer layout)."""
    path = run.latest()
    if path is None:
        return False
    state = _read_json(path / STATE_JSON)
    if state.get("format") != FORMAT:
        raise SdkError(f"{path}/{STATE_JSON}: format {state.get('format')!r}, expected {FORMAT}")
    for what, have in (
        ("algo", type(model).__name__),
        ("policy", type(model.policy).__name__),
        ("n_envs", int(model.n_envs)),
    ):
        if state[what] != have:
            raise SdkError(
                f"{path}: saved by {what}={state[what]!r}, this model has {have!r} (build the "
                "model as the checkpointed run did)"
            )
    device = model.device
    params = torch.load(path / PARAMS_FILE, map_location=device, weights_only=True)
    model.set_parameters(params, exact_match=True, device=device)
    extra = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    with torch.no_grad():
        for name, value in extra["variables"].items():
            recursive_getattr(model, name).copy_(value.to(device))
    torch.set_rng_state(extra["torch_rng"])
    for name, value in state["counters"].items():
        setattr(model, name, value)
    model._num_timesteps_at_start = int(state["counters"]["num_timesteps"])
    setattr(model, _EPISODES_ATTR, int(state.get("episodes", 0)))
    window = model._stats_window_size
    model.ep_info_buffer = deque(state["ep_info"], maxlen=window)
    model.ep_success_buffer = deque(maxlen=window)
    rng = state["numpy_rng"]
    np.random.set_state(
        (
            rng["kind"],
            np.asarray(rng["keys"], dtype=np.uint32),
            rng["pos"],
            rng["has_gauss"],
            rng["cached_gaussian"],
        )
    )
    buffer = getattr(model, "replay_buffer", None)
    if (buffer is None) != (state["replay"] is None):
        raise SdkError(f"{path}: the checkpoint's replay buffer and the model's disagree")
    if buffer is not None:
        load_replay(buffer, run, state["replay"], path)
    vecnorm = model.get_vec_normalize_env()
    if (vecnorm is None) != (state["vec_normalize"] is None):
        raise SdkError(
            f"{path}: VecNormalize statistics saved: {state['vec_normalize'] is not None}, "
            f"the env is wrapped in VecNormalize: {vecnorm is not None} (wrap it as before)"
        )
    if vecnorm is not None:
        load_vecnorm(vecnorm, run, state["vec_normalize"], path)
    return True


def _read_json(path: Path) -> dict[str, Any]:
    import json

    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SdkError(f"{path}: cannot read it: {exc}") from exc
    if not isinstance(value, dict):
        raise SdkError(f"{path}: not a JSON object")
    return value
