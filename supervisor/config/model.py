"""The configuration as the supervisor holds it (ARCHITECTURE.md section 8): frozen dataclasses,
a game and a mode, the built-in sections, and the whole `Config`. The wings' own sections
([mirror], [cluster], [spare], [metrics], [[hooks]], [preemption]) live beside their parsers."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config.cluster import ClusterConfig, SpareConfig
from supervisor.config.hooks import HookSpec
from supervisor.config.metrics import MetricsConfig
from supervisor.config.mirror import MirrorConfig
from supervisor.config.preemption import PreemptionConfig
from supervisor.config.sweep_spec import SweepSpec
from supervisor.config.tracking import TrackingConfig

GAME_NAME_RE = re.compile(r"[a-z0-9_-]{1,40}")
# A run of a game's matrix (`seeds`, `variants`): `pong/s2`, `pong/lr3/s1`, `pong/lr3`.
RUN_NAME_RE = re.compile(r"[a-z0-9_-]{1,40}(/[a-z0-9_-]{1,40})?(/s[0-9]{1,19})?")
SEED_PART_RE = re.compile(r"s[0-9]+")


@dataclass(frozen=True)
class ModeSpec:
    name: str
    num_envs: int
    batch_size: int | str  # an int, or "auto" (PPO picks a divisor of the rollout)
    n_steps: int
    max_concurrent: int

    def sizes(self) -> tuple[int, int | str, int]:
        return (self.num_envs, self.batch_size, self.n_steps)


KNOBS = ("num_envs", "batch_size")


@dataclass(frozen=True)
class GameSpec:
    name: str
    env_id: str
    algo: str
    total_steps: int
    seed: int
    device: str
    args: tuple[tuple[str, Any], ...] = ()
    gpu: tuple[int, ...] | None = None
    """`games.gpu`: positions in the supervisor's visible GPUs it may use; None = "auto"."""
    # A command game (docs/own-trainer.md): the user's own program instead of rlsup's worker.
    command: tuple[str, ...] | None = None
    cwd: str | None = None  # absolute; None: the game's run dir
    env: tuple[tuple[str, str], ...] = ()
    # A command game's declared hyper-parameters (`params`: scalars), its RLSUP_PARAMS.
    params: tuple[tuple[str, Any], ...] = ()
    heartbeat: bool = True  # False: a command game that promises none (no hang detection)
    knobs: tuple[str, ...] = KNOBS  # the mode's knobs it honours (a change restarts it)
    # Which [[games]] table it came from (a matrix expands one table into several runs): error
    # messages name that table's line. Not part of what the game is (reload compares specs).
    table: int = dataclasses.field(default=0, compare=False)
    # A sweep's trial run (supervisor/config/sweep.py): its study's definition and its trial's
    # number; its args (params) are the trial's, drawn when the trial first starts.
    sweep: SweepSpec | None = None
    trial: int | None = None

    @property
    def group(self) -> str:
        """The game and variant this run belongs to: its name without the seed part."""
        return split_run_name(self.name)[0]

    @property
    def args_dict(self) -> dict[str, Any]:
        return dict(self.args)

    @property
    def kind(self) -> str:
        """ "builtin" (rlsup's worker) or "command" (the user's own program)."""
        return "builtin" if self.command is None else "command"

    def mode_batch(self, mode: ModeSpec) -> int | str | None:
        """The mode's batch size as this game takes it: None for DQN, which trains on its own
        `dqn_batch_size` (the mode's is PPO's minibatch)."""
        return None if self.algo == "dqn" else mode.batch_size

    def knob_values(self, mode: ModeSpec) -> tuple[Any, ...]:
        """The mode's sizes this game uses: a change of these restarts its worker."""
        if self.algo == "dqn":
            return (mode.num_envs,)  # no minibatch, no rollout length
        if self.command is None:
            return mode.sizes()
        sizes = {"num_envs": mode.num_envs, "batch_size": mode.batch_size}
        return tuple(sizes[k] for k in self.knobs)


@dataclass(frozen=True)
class RestartConfig:
    backoff_base_s: float = 1.0
    backoff_max_s: float = 300.0
    budget: int = 5
    budget_window_s: float = 3600.0
    stable_after_s: float = 60.0


@dataclass(frozen=True)
class WatchdogConfig:
    startup_grace_s: float = 180.0
    hang_timeout_s: float = 120.0
    kill_grace_s: float = 10.0  # added key: SIGTERM → SIGKILL grace for a hung worker


@dataclass(frozen=True)
class StabilityConfig:
    window_s: float = 3600.0
    calm_s: float = 3600.0
    cooldown_s: float = 300.0
    ceiling: str = ""
    min_ram_available_pct: float = 10.0
    max_gpu_temp_c: float = 85.0


@dataclass(frozen=True)
class GpuConfig:
    min_free_mb: float = 2048.0
    poll_s: float = 30.0
    timeout_s: float = 7200.0


@dataclass(frozen=True)
class Config:
    path: Path  # absolute path of the file it was read from
    state_dir: Path  # absolute
    initial_mode: str
    checkpoint_every_s: float
    stop_grace_s: float
    cost_per_hour: float
    modes: tuple[ModeSpec, ...]
    games: tuple[GameSpec, ...]
    restart: RestartConfig
    watchdog: WatchdogConfig
    stability: StabilityConfig
    gpu: GpuConfig
    tick_s: float = 1.0  # added key: longest sleep of the main loop
    logs_dir_key: Path | None = None  # added key: where worker logs go (default <state>/logs)
    mirror: MirrorConfig | None = None  # added table: [mirror]
    # The sections' defaults below are frozen dataclasses (of their own modules): one shared
    # instance is safe, as it was when they were defined in this file.
    cluster: ClusterConfig = ClusterConfig()  # noqa: RUF009 - added table: [cluster]
    spare: SpareConfig = SpareConfig()  # noqa: RUF009 - added table: [spare]
    metrics: MetricsConfig = MetricsConfig()  # noqa: RUF009 - added table: [metrics]
    hooks: tuple[HookSpec, ...] = ()  # added tables: [[hooks]]
    gpu_cost_share: float = 0.0  # added key: the part of cost_per_hour that is the GPUs'
    preemption: PreemptionConfig = PreemptionConfig()  # noqa: RUF009 - added table: [preemption]
    tracking: TrackingConfig = TrackingConfig()  # noqa: RUF009 - added table: [tracking]
    # added key: checkpoints sooner on a host that fails often (training.protocol's Young's rule)
    adaptive_checkpoints: bool = True

    @property
    def logs_dir(self) -> Path:
        return self.logs_dir_key or self.state_dir / "logs"

    def mode(self, name: str) -> ModeSpec:
        for m in self.modes:
            if m.name == name:
                return m
        raise KeyError(name)

    @property
    def mode_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.modes)

    def game(self, name: str) -> GameSpec:
        for g in self.games:
            if g.name == name:
                return g
        raise KeyError(name)

    @property
    def db_path(self) -> Path:
        """<state_dir>/rlsup.db (db.DB_NAME)."""
        return self.state_dir / "rlsup.db"

    def run_dir(self, game: str) -> Path:
        return self.state_dir / "runs" / game


def split_run_name(name: str) -> tuple[str, int | None]:
    """`pong/lr3/s2` -> ("pong/lr3", 2); `pong` -> ("pong", None): the group a run's figures
    are aggregated over (`rlsup results`) and its matrix seed. A variant is never named like a
    seed part (refused at load), so the split is unambiguous."""
    head, _, last = name.rpartition("/")
    if head and SEED_PART_RE.fullmatch(last):
        return head, int(last[1:])
    return name, None
