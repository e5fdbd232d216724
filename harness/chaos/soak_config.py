"""What a soak runs: its five games (three of rlsup's learners and two command games of a
user's own, harness/chaos/soak_trainer.py, one of them started through a `sh -c` wrapper that
leaves a child of its own), their sizes, and the settings of one run."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
LIGHT_ENVS, MEDIUM_ENVS, N_STEPS = 4, 8, 32


@dataclass(frozen=True)
class GameDef:
    name: str
    env_id: str
    algo: str
    total_steps: int
    args: str
    wrapped: bool = False
    """A command game started as `sh -c "CHILD & python soak_trainer.py"`: the SDK runs as the
    supervisor's grandchild, beside a child (`child_mark`) that must never outlive its game."""

    @property
    def child_mark(self) -> str:
        """The argv word of a wrapped game's extra child (the soak counts them by it)."""
        return f"rlsup-soak-child-{self.name}"

    @property
    def command(self) -> bool:
        """A command game (the user's own script on the SDK), not rlsup's worker."""
        return self.algo == "command"

    def iteration_steps(self, num_envs: int) -> int:
        """Agent steps of one training-loop iteration (the slack of the redone-work bound)."""
        if self.command:
            from harness.chaos.soak_trainer import STEPS_PER_ENV

            return STEPS_PER_ENV * num_envs
        if self.algo == "ppo":
            return num_envs * N_STEPS
        from training.dqn import AGENT_STEPS_PER_ITERATE

        return max(1, AGENT_STEPS_PER_ITERATE // num_envs) * num_envs


# Agent steps per second of fault phase each game gets: about half of what it trains at here
# (2 cores, three workers) so that it is still training when the schedule ends.
# The wrapped game takes only the faults that strike the whole host (no kill of its own
# redoes its steps), so it gets more to last the fault phase as the others do.
STEPS_PER_FAULT_S = {
    "cartpole_dqn": 1500, "cartpole_ppo": 3000, "pong": 170, "byo": 600, "byo_sh": 800,
}  # fmt: skip


def default_games(fault_phase_s: float) -> list[GameDef]:
    """Five games whose total_steps last about the fault phase."""
    scale = fault_phase_s / 1.0
    return [
        GameDef(
            "cartpole_dqn",
            "CartPole-v1",
            "dqn",
            int(STEPS_PER_FAULT_S["cartpole_dqn"] * scale),
            "{ eval_episodes = 0, buffer_size = 20000, learning_starts = 1000, "
            "target_update_interval = 500, replay_chunk_kib = 16 }",
        ),
        GameDef(
            "cartpole_ppo",
            "CartPole-v1",
            "ppo",
            int(STEPS_PER_FAULT_S["cartpole_ppo"] * scale),
            "{ eval_episodes = 0 }",
        ),
        GameDef(
            "pong",
            "Pong-v5",
            "ppo",
            int(STEPS_PER_FAULT_S["pong"] * scale),
            "{ eval_episodes = 0, epochs = 1 }",
        ),
        # The user's own script (soak_trainer.py, 16 steps per env per ~0.1 s iteration).
        GameDef("byo", "", "command", int(STEPS_PER_FAULT_S["byo"] * scale), ""),
        # The same script behind a shell, as people launch theirs (`sh -c`, `uv run`, ...):
        # the faults that strike the whole host (supervisor kills, reboots, preemption, mode
        # changes, full disks) reach it; the ones aimed at one worker pick the others.
        GameDef("byo_sh", "", "command", int(STEPS_PER_FAULT_S["byo_sh"] * scale), "", True),
    ]


@dataclass
class SoakSettings:
    workdir: Path
    fault_phase_s: float = 170.0
    seed: int = 1
    min_faults: int = 20
    checkpoint_every_s: float = 1.5
    hang_timeout_s: float = 12.0
    finish_timeout_s: float = 240.0
    games: list[GameDef] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.games:
            self.games = default_games(self.fault_phase_s)
