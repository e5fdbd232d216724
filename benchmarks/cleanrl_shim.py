"""Run one CleanRL script unchanged, under the scratch venv's Python (benchmarks/peers.py).

    <scratch venv>/bin/python benchmarks/cleanrl_shim.py SCRIPT.py [the script's flags]

The script runs as `__main__` (runpy), exactly as `python SCRIPT.py ...` would, with two
adaptations of the libraries under it, nothing of the script itself:

- `import ale_py` first: ale-py >= 0.9 bundles the ROMs and registers its gymnasium ids
  (BreakoutNoFrameskip-v4, which dqn_atari.py makes) on import, where ale-py 0.7/0.8 registered
  them through a plugin entry point and AutoROM;
- `envpool.make(..., env_type="gym")` (ppo_atari_envpool.py, pqn_atari_envpool.py) gets the
  gym 0.23 API those scripts were written for: envpool 1.2, the project's, answers "gym" with
  its gymnasium API (reset -> (obs, info), step -> 5-tuple, gymnasium spaces). The adapter
  returns reset -> obs and step -> (obs, reward, terminated | truncated, info) with the same
  info (reward, terminated, lives), as envpool < 0.7 did, and gym's spaces.

Stdlib, gym, numpy and envpool only; nothing from the project is imported here.
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from typing import Any


class OldGymEnvPool:
    """An envpool (gymnasium API) seen through the gym 0.23 API."""

    def __init__(self, env: Any) -> None:
        import gym

        # envpool 1.2 never runs gymnasium 0.29's VectorEnv.__init__, whose close() (and
        # __del__) read these two.
        for name, value in (("closed", False), ("viewer", None)):
            if not hasattr(env, name):
                setattr(env, name, value)
        self._env = env
        self.action_space = gym.spaces.Discrete(int(env.action_space.n))
        box = env.observation_space
        self.observation_space = gym.spaces.Box(low=box.low, high=box.high, dtype=box.dtype)

    def reset(self, **kwargs: Any) -> Any:
        obs, _ = self._env.reset(**kwargs)
        return obs

    def step(self, action: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self._env.step(action)
        return obs, reward, terminated | truncated, info

    def close(self) -> None:
        self._env.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def install() -> None:
    with contextlib.suppress(ImportError):  # ppo/pqn run without it
        import ale_py  # noqa: F401  (registers the ALE ids with gymnasium)
    import envpool

    make = envpool.make

    def make_old_gym(task_id: str, env_type: str, **kwargs: Any) -> Any:
        env = make(task_id, env_type=env_type, **kwargs)
        return OldGymEnvPool(env) if env_type == "gym" else env

    envpool.make = make_old_gym


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: cleanrl_shim.py SCRIPT.py [flags]")
    install()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
