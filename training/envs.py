"""Envpool environments and the episode bookkeeping every learner shares.

Envpool resets an environment on the step AFTER the one that reported done ("next-step"
auto-reset): that step ignores the action, returns reward 0 and the new episode's (or, for an
Atari life loss, the new life's) first observation. Learners call such a step a *dead* step and
keep it out of their losses and replay buffers.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from collections import deque
from typing import Any

import numpy as np

from training.tasks import is_atari

# The envpool families whose tasks a worker trains (training/tasks.py): Atari and classic control.
FAMILIES = ("envpool.atari.registration", "envpool.classic_control.registration")


def import_envpool() -> types.ModuleType:
    """envpool, with only the task families a worker trains registered.

    `import envpool` runs `envpool.entry`, which registers every family envpool ships, and
    registering a family imports its package: each loads its native library, and jumanji's
    rendering pulls in matplotlib. That was 0.5 s of every worker's boot here, for tasks no
    worker can train (benchmarks/boot_breakdown.py). `envpool.entry` is marked imported before
    envpool's own import runs, then the two families' registrations (a plain list of task ids
    each: the env's package is imported by `make`) are imported. An envpool without
    `entry.py`, or imported already by someone else: the plain import, everything registered.
    """
    if "envpool" in sys.modules:
        return sys.modules["envpool"]
    spec = importlib.util.find_spec("envpool")
    where = list(spec.submodule_search_locations or []) if spec else []
    if not where or not os.path.exists(os.path.join(where[0], "entry.py")):
        return importlib.import_module("envpool")
    entry = types.ModuleType("envpool.entry", "rlsup: only the families in training.envs.FAMILIES")
    sys.modules["envpool.entry"] = entry
    try:
        module = importlib.import_module("envpool")
        for family in FAMILIES:
            importlib.import_module(family)
    except BaseException:
        for name in [n for n in sys.modules if n == "envpool" or n.startswith("envpool.")]:
            del sys.modules[name]  # half imported: the next import starts clean, in full
        raise
    return module


envpool = import_envpool()


def make_env(
    env_id: str,
    num_envs: int,
    seed: int,
    threads: int | None,
    *,
    for_eval: bool = False,
    max_episode_steps: int | None = None,
) -> Any:
    """A gymnasium-style envpool vector env.

    Atari keeps envpool's standard preprocessing (84x84 gray, stack 4, frame skip 4, noop 30).
    Training sees life losses as episode ends and clipped rewards; evaluation plays full games
    with the game's own score.
    """
    kwargs: dict[str, Any] = {}
    if is_atari(env_id):
        kwargs.update(episodic_life=not for_eval, reward_clip=not for_eval)
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    return envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=num_envs,
        seed=seed,
        num_threads=threads or 0,
        **kwargs,
    )


class EpisodeTracker:
    """Unclipped returns of real episodes (an Atari game over, not a life loss)."""

    def __init__(self, num_envs: int, atari: bool, window: int = 100) -> None:
        self.atari = atari
        self.episodes = 0
        self.recent: deque[float] = deque(maxlen=window)
        self._running = np.zeros(num_envs, dtype=np.float64)

    def reset_envs(self) -> None:
        """Forget the partial episodes (the envs were recreated or reset)."""
        self._running[:] = 0.0

    def update(
        self,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict[str, Any],
        envs: slice = slice(None),
    ) -> None:
        """One step of the envs `envs` (all by default; a half of them under --env-overlap)."""
        running = self._running[envs]
        if self.atari:
            running += info["reward"]
            ended = np.asarray(info["terminated"], dtype=bool) | truncated
        else:
            running += rewards
            ended = terminated | truncated
        for i in np.flatnonzero(ended):
            self.recent.append(float(running[i]))
            running[i] = 0.0
            self.episodes += 1

    def mean_return(self) -> float | None:
        return float(np.mean(self.recent)) if self.recent else None

    def state_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "recent": list(self.recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episodes = int(state["episodes"])
        self.recent.clear()
        self.recent.extend(float(x) for x in state["recent"])
        self.reset_envs()
