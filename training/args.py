"""The worker's arguments: `WorkerConfig` (one frozen dataclass, a help text per field, argv
and JSON round trips), the PPO presets, the command-line parser, and the validation that
names the flag (`ConfigError`, exit 78).

Torch-free on purpose, like training/protocol.py: the supervisor validates every game's
arguments with it (supervisor/config.py) and `rlsup status` must start in milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

from training.tasks import KNOWN_TASKS, is_atari, suggest

ALGOS = ("dqn", "ppo", "pqn")
# The algorithms that learn from rollouts of num_envs * n_steps in minibatches of
# `minibatch_size()`, `epochs` passes each (the worker's batch_size is their minibatch).
ROLLOUT_ALGOS = ("ppo", "pqn")
DEVICES = ("auto", "cpu", "cuda")
# Arithmetic of the networks: "auto" = bf16 autocast on CUDA (fp16 + a grad scaler where bf16
# is missing) and on a CPU with native bf16 (avx512_bf16 / amx_bf16) for the Atari CNN, fp32
# elsewhere; "fp32" = plain fp32 everywhere; "bf16" = bf16 autocast wherever it runs. The
# weights and the optimizer stay fp32 in every mode, so checkpoints move between them.
PRECISIONS = ("auto", "fp32", "bf16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
CUDA_GRAPHS = ("off", "on")
ENV_OVERLAP = ("off", "on")
LR_SCHEDULERS = ("none", "cosine", "step", "linear")
PPO_PRESETS: dict[str, dict[str, Any]] = {
    # From the GPU-heavy training guide: envs, steps per env, minibatch, epochs, network.
    "fast": {
        "num_envs": 16,
        "n_steps": 256,
        "batch_size": 2048,
        "epochs": 15,
        "net_arch": "512,512",
    },
    "heavy": {
        "num_envs": 32,
        "n_steps": 256,
        "batch_size": 4096,
        "epochs": 20,
        "net_arch": "1024,512,256",
    },
    "beast": {
        "num_envs": 64,
        "n_steps": 512,
        "batch_size": 8192,
        "epochs": 30,
        "net_arch": "1024,512,512,256",
    },
}


DEFAULT_MINIBATCH = 256  # PPO's minibatch when --batch-size is not given


class ConfigError(ValueError):
    """A worker argument is invalid. The message names the flag and the value."""


def _f(default: Any, help: str, **kw: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **kw})


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Everything one training worker needs; one instance per game."""

    game: str = _f("CartPole-v1", "envpool task id, e.g. Pong-v5, Breakout-v5, CartPole-v1")
    algo: str = _f("ppo", "algorithm: dqn | ppo | pqn", choices=ALGOS)
    run_dir: str = _f("runs/default", "run directory: checkpoints, heartbeat, progress, errors")
    num_envs: int = _f(8, "number of vectorized envpool environments")
    batch_size: int | Literal["auto"] | None = _f(
        None,
        "PPO and PQN minibatch: must divide num_envs*n_steps, or 'auto' (the largest divisor "
        "<= 2048); none: the largest divisor <= 256 (256 at the default layout). DQN: its "
        "batch, as --dqn-batch-size (which is its default)",
    )
    total_steps: int = _f(100_000, "agent steps to train, summed over all envs")
    seed: int = _f(
        1, "seed of everything random; envs get a seed derived from (seed, resume count)"
    )
    # training.protocol.DEFAULT_CHECKPOINT_EVERY_S (not imported: status loads this module)
    checkpoint_every_s: float = _f(15.0, "seconds between checkpoints")
    checkpoint_every_steps: int | None = _f(None, "also checkpoint every this many agent steps")
    host_mtbf_s: float | None = _f(
        None,
        "the host's mean time between failures (the supervisor's ledger): the interval "
        "shortens to Young's rule, sqrt(2 x a checkpoint's cost x MTBF), never below 2 s nor "
        "above --checkpoint-every-s; none: --checkpoint-every-s",
    )
    keep_checkpoints: int = _f(3, "committed checkpoints to keep (newest first)")
    keep_best: int = _f(
        0,
        "also keep this many checkpoints with the best periodic evaluation (its mean, recorded "
        "in the checkpoint taken at the evaluation's step; needs --eval-every-steps); 0 = off",
    )
    keep_every_steps: int | None = _f(
        None,
        "also keep milestones: the first checkpoint at or past each multiple of this many "
        "agent steps; none or 0 = off",
    )
    device: str = _f("auto", "auto | cpu | cuda", choices=DEVICES)
    threads: int | None = _f(None, "torch intra-op and envpool threads (default: all cores)")
    env_threads: int | None = _f(
        None,
        "envpool's threads, where they should differ from --threads (default: --threads; 0: "
        "envpool's own choice, one per env up to the cores). On a GPU, where torch's CPU threads "
        "sit idle, the envs may use more",
    )
    precision: str = _f(
        "auto",
        "auto | fp32 | bf16: network arithmetic (auto: bf16 autocast on CUDA and on CPUs with "
        "native bf16 for Atari, fp32 elsewhere; weights stay fp32)",
        choices=PRECISIONS,
    )
    compile: str = _f(
        "off",
        "off | default | reduce-overhead | max-autotune: torch.compile the networks (forward "
        "and backward; reduce-overhead also replays them as CUDA graphs on a GPU). The first "
        "iterations compile (seconds to a minute, on every start); off until measured faster",
        choices=COMPILE_MODES,
    )
    cuda_graphs: str = _f(
        "off",
        "off | on: each gradient step (forward, loss, backward, clipping, a capturable Adam) "
        "and the acting forward replayed as one CUDA graph on a GPU (not with fp16's grad "
        "scaler); on the CPU the same static step runs uncaptured. Off until measured faster",
        choices=CUDA_GRAPHS,
    )
    env_overlap: str = _f(
        "off",
        "off | on: PPO's and PQN's envs as two envpool pools stepped in turn, one half stepping "
        "while the other half's actions are computed (asynchronous send/recv); with an odd "
        "--num-envs the envs step together as with off. Off until measured faster",
        choices=ENV_OVERLAP,
    )
    eval_every_steps: int | None = _f(None, "also evaluate every this many agent steps")
    eval_episodes: int = _f(
        10,
        "episodes per evaluation (0 disables evaluation): PPO samples its policy, DQN and PQN play "
        "epsilon-greedy (0.05); full games, capped at 27,000 agent steps on Atari",
    )
    eval_budget_s: float = _f(
        60.0,
        "wall-time budget of one evaluation: episodes still running then are left out and "
        "counted as unfinished in eval.json",
    )
    tensorboard: bool = _f(
        True,
        "write TensorBoard event files under <run_dir>/tb (losses, returns, evaluations); "
        "progress.csv gets the same diagnostics either way",
    )
    learning_rate: float | None = _f(None, "Adam learning rate (default: the algorithm's)")
    gamma: float = _f(0.99, "discount factor")
    lr_scheduler: str | None = _f(
        None,
        "learning-rate schedule: none | cosine | step | linear (to min_lr, per update) "
        "(default: none DQN, PPO / linear PQN)",
        choices=LR_SCHEDULERS,
    )
    lr_step_size: int = _f(100_000, "step scheduler: agent steps between decays")
    lr_step_gamma: float = _f(0.5, "step scheduler: decay factor")
    min_lr: float = _f(0.0, "cosine and linear schedulers: final learning rate")
    max_grad_norm: float | None = _f(None, "gradient norm clip (default: 0.5 PPO / 10 DQN, PQN)")
    net_arch: str = _f(
        "",
        "MLP hidden sizes for vector obs, e.g. '512,512' (default: 64,64 PPO / 120,84 DQN, PQN)",
    )
    # DQN
    # The field's DQN (Mnih et al. 2015; CleanRL's dqn_atari, SB3): batch 32 every 4 agent
    # steps, a hard target copy every 1,000. Two departures, for memory and budgets: a 100k
    # replay (1M Atari transitions are ~7 GB of frames) and learning from 10k steps.
    dqn_batch_size: int = _f(
        32, "DQN: transitions per gradient step (its own knob; the mode's batch is PPO's)"
    )
    gradient_steps: int = _f(
        1,
        "DQN: gradient steps per --train-frequency agent steps; with it, the replay ratio "
        "for many envs (samples trained per agent step = dqn_batch_size*gradient_steps/"
        "train_frequency)",
    )
    tau: float = _f(
        1.0,
        "DQN: target update at each sync: 1 copies the network (hard), below 1 moves the "
        "target that fraction of the way (Polyak averaging)",
    )
    buffer_size: int = _f(100_000, "DQN: replay capacity in transitions")
    replay_chunk_kib: int = _f(
        16_384, "DQN: replay chunk file size in KiB, the unit of incremental checkpoints"
    )
    learning_starts: int = _f(10_000, "DQN: agent steps before learning starts")
    train_frequency: int = _f(4, "DQN: agent steps per gradient step (per env step batch)")
    target_update_interval: int = _f(1_000, "DQN: agent steps between target network syncs")
    start_e: float = _f(1.0, "DQN, PQN: initial exploration epsilon")
    end_e: float | None = _f(
        None, "DQN, PQN: final exploration epsilon (default: 0.05; PQN on Atari 0.01)"
    )
    exploration_fraction: float | None = _f(
        None,
        "DQN, PQN: fraction of total_steps to anneal epsilon over (default: 0.5; PQN on Atari 0.1)",
    )
    dueling: bool = _f(False, "DQN: dueling value/advantage head")
    double_q: bool = _f(
        True,
        "DQN: the Double DQN target (the online network picks the next action, the target "
        "network values it); --no-double-q: the target network's max (Mnih et al. 2015, "
        "CleanRL's dqn_atari), one forward pass less per gradient step",
    )
    # PPO
    preset: str | None = _f(
        None,
        "PPO: fast | heavy | beast sets envs, steps, minibatch, epochs, net",
        choices=tuple(PPO_PRESETS),
    )
    n_steps: int = _f(128, "PPO, PQN: rollout length per env")
    epochs: int = _f(4, "PPO, PQN: optimisation epochs per rollout")
    gae_lambda: float = _f(0.95, "PPO: GAE lambda")
    clip_coef: float | None = _f(
        None, "PPO: surrogate clip range (default: 0.1 Atari / 0.2 vector)"
    )
    vf_coef: float = _f(0.5, "PPO: value loss weight")
    ent_coef: float = _f(0.01, "PPO: entropy bonus weight")
    # PQN (n_steps, epochs and the minibatch batch_size as PPO; epsilon as DQN)
    q_lambda: float = _f(0.65, "PQN: lambda of the Q(lambda) returns")
    mirror_url: str | None = _f(
        None, "s3://bucket[/prefix]: with no local checkpoint, restore the newest mirrored one"
    )
    mirror_endpoint_url: str | None = _f(None, "the mirror's S3-compatible endpoint")
    mirror_region: str | None = _f(None, "the mirror's region")
    mirror_name: str | None = _f(None, "the game's folder in the mirror (default: the run dir's)")
    epoch: int = _f(
        0,
        "placement epoch (several hosts): commit nothing once the mirror's fence for this game "
        "has moved past it, and resume from the mirror when it holds a newer placement's "
        "checkpoint; 0 = no fence",
    )

    # ---- derived views -------------------------------------------------------------------
    @property
    def is_atari(self) -> bool:
        return is_atari(self.game)

    def mlp_sizes(self) -> tuple[int, ...]:
        if not self.net_arch:
            return (64, 64) if self.algo == "ppo" else (120, 84)
        return tuple(int(x) for x in self.net_arch.split(","))

    def rollout_size(self) -> int:
        return self.num_envs * self.n_steps

    def minibatch_size(self) -> int:
        """PPO minibatch: the explicit batch size, for 'auto' the largest divisor <= 2048,
        unset the largest divisor <= 256 (CleanRL's 4 minibatches of 8x128)."""
        if self.batch_size == "auto":
            return largest_divisor_at_most(self.rollout_size(), 2048)
        if self.batch_size is None:
            return largest_divisor_at_most(self.rollout_size(), DEFAULT_MINIBATCH)
        return int(self.batch_size)

    def train_batch_size(self) -> int:
        """The samples one gradient step trains on: DQN's batch (--batch-size where given, as
        it always was, else --dqn-batch-size), else the minibatch."""
        if self.algo == "dqn":
            return self.batch_size if isinstance(self.batch_size, int) else self.dqn_batch_size
        return self.minibatch_size()

    # ---- round trips ----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown worker setting(s): {', '.join(unknown)}")
        return validate(cls(**data))

    def envpool_threads(self) -> int | None:
        """The threads the training envs step on (`env_threads`, else `threads`)."""
        return self.threads if self.env_threads is None else self.env_threads

    def to_argv(self) -> list[str]:
        argv: list[str] = []
        defaults = WorkerConfig()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if f.name in ("game", "algo", "run_dir") or value != getattr(defaults, f.name):
                if isinstance(value, bool):
                    argv.append(flag if value else "--no-" + flag[2:])
                elif value is None:
                    argv += [flag, "none"]
                else:
                    argv += [flag, str(value)]
        return argv

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> WorkerConfig:
        ns = build_parser().parse_args(list(argv))
        return config_from_namespace(ns)


WORKER_FIELDS = frozenset(f.name for f in dataclasses.fields(WorkerConfig))
_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(WorkerConfig)}
# The fields the supervisor builds every worker's argv with (supervisor.config.worker_config,
# and the placement epoch on several hosts): its own, never a config file's `args`. (Two more
# come from the supervisor by default but a game's `args` may override them, as it always could:
# `n_steps` from the mode, `checkpoint_every_s` from the top of the file.)
SUPERVISOR_FIELDS = frozenset(
    {
        "game",
        "algo",
        "run_dir",
        "num_envs",
        "batch_size",
        "total_steps",
        "seed",
        "device",
        "threads",
        "mirror_url",
        "mirror_endpoint_url",
        "mirror_region",
        "mirror_name",
        "epoch",
        "host_mtbf_s",
    }
)
# Hyper-parameters a config file may pass through `args = {...}`: everything but the
# fields the supervisor itself decides.
HYPERPARAMETER_FIELDS = WORKER_FIELDS - SUPERVISOR_FIELDS


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of n that is <= cap (1 at worst)."""
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def _parse_optional(kind: type) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "") else kind(text)

    return parse


def _parse_batch(text: str) -> int | str | None:
    if text.lower() in ("none", ""):
        return None
    return "auto" if text == "auto" else int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.worker",
        description="One rlsup training worker: trains one game, checkpoints, resumes.",
        argument_default=argparse.SUPPRESS,
    )
    for f in dataclasses.fields(WorkerConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (default: {f.default})"
        if f.type in ("bool",):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
            continue
        kind = _FIELD_PARSERS.get(f.name, _TYPE_PARSERS.get(str(f.type), str))
        parser.add_argument(flag, type=kind, help=help_text, metavar=f.name.upper())
    return parser


_TYPE_PARSERS: dict[str, Any] = {
    "int": int,
    "float": float,
    "str": str,
    "int | None": _parse_optional(int),
    "float | None": _parse_optional(float),
    "str | None": _parse_optional(str),
}
# `--lr-scheduler none` is the schedule "none", not "unset" (PQN's unset is linear).
_FIELD_PARSERS: dict[str, Any] = {"batch_size": _parse_batch, "lr_scheduler": str}


def config_from_namespace(ns: argparse.Namespace) -> WorkerConfig:
    given = vars(ns)
    preset = given.get("preset")
    values: dict[str, Any] = {}
    if preset:
        # A preset fills what the operator did not say explicitly.
        values.update(PPO_PRESETS[preset])
    values.update(given)
    return validate(WorkerConfig(**values))


def check_value(name: str, value: Any) -> None:
    """Is `value` of the type the worker's flag `name` takes (finite, for a number) and within
    its range?

    A config file's TOML has types of its own: `dueling = "yes"`, `learning_starts = 1.5`,
    `net_arch = 5` or `lr_step_gamma = inf` must be refused where they are written, naming the
    key, not found by a worker that crashes on them over and over.
    """
    kind = _FIELD_TYPES[name]
    flag = "--" + name.replace("_", "-")
    if value is None and kind.endswith("| None"):
        return
    base = kind.removesuffix(" | None")
    if base == "bool":
        ok, expect = isinstance(value, bool), "true or false"
    elif base == "int":
        ok, expect = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif base == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok, expect = ok and math.isfinite(value), "a finite number"
    elif base == "str":
        ok, expect = isinstance(value, str), "a string"
    else:  # batch_size: an int, "auto" or none, checked with the rollout size in _check_batch
        ok = value in ("auto", None) or (isinstance(value, int) and not isinstance(value, bool))
        expect = 'an integer or "auto"'
    if not ok:
        optional = " (or none)" if kind.endswith("| None") else ""
        raise ConfigError(f"{flag} {value!r}: expected {expect}{optional}")
    _check_range(name, value)


# flag -> (lowest, highest, lowest allowed): bounds of the numeric hyper-parameters.
_RANGES: dict[str, tuple[float, float, bool]] = {
    "gamma": (0.0, 1.0, True),
    "gae_lambda": (0.0, 1.0, True),
    "q_lambda": (0.0, 1.0, True),
    "start_e": (0.0, 1.0, True),
    "end_e": (0.0, 1.0, True),
    "exploration_fraction": (0.0, 1.0, True),
    "tau": (0.0, 1.0, False),
    "lr_step_gamma": (0.0, 1.0, False),
    "min_lr": (0.0, math.inf, True),
    "vf_coef": (0.0, math.inf, True),
    "ent_coef": (0.0, math.inf, True),
    "max_grad_norm": (0.0, math.inf, False),
    "clip_coef": (0.0, math.inf, False),
    "checkpoint_every_s": (0.0, math.inf, False),
    "host_mtbf_s": (0.0, math.inf, False),
    "eval_budget_s": (0.0, math.inf, False),
    "learning_rate": (0.0, math.inf, False),
    "seed": (0, 2**63 - 1, True),
    "keep_best": (0, 2**63 - 1, True),
    "keep_every_steps": (0, 2**63 - 1, True),
}


def _check_range(name: str, value: Any) -> None:
    if name not in _RANGES or value is None:
        return
    low, high, low_ok = _RANGES[name]
    above = value >= low if low_ok else value > low
    if not (above and value <= high):
        lo = "[" if low_ok else "("
        top = f"{high:g}" if isinstance(high, float) else str(high)
        hi = "inf)" if high == math.inf else f"{top}]"
        flag = "--" + name.replace("_", "-")
        raise ConfigError(f"{flag} {value!r}: must be within {lo}{low:g}, {hi}")


def validate(cfg: WorkerConfig) -> WorkerConfig:
    """Check what can be checked without torch or envpool; raise ConfigError naming the flag."""
    for f in dataclasses.fields(WorkerConfig):
        check_value(f.name, getattr(cfg, f.name))
    _check_choice("algo", cfg.algo, ALGOS)
    _check_choice("device", cfg.device, DEVICES)
    _check_choice("precision", cfg.precision, PRECISIONS)
    _check_choice("compile", cfg.compile, COMPILE_MODES)
    _check_choice("cuda-graphs", cfg.cuda_graphs, CUDA_GRAPHS)
    _check_choice("env-overlap", cfg.env_overlap, ENV_OVERLAP)
    if cfg.env_overlap == "on" and cfg.algo not in ROLLOUT_ALGOS:
        raise ConfigError(
            f"--env-overlap on: for the rollout learners ({', '.join(ROLLOUT_ALGOS)}), "
            f"not --algo {cfg.algo}"
        )
    if cfg.cuda_graphs == "on" and cfg.compile in ("reduce-overhead", "max-autotune"):
        raise ConfigError(
            f"--cuda-graphs on with --compile {cfg.compile}: that mode captures CUDA graphs "
            "of its own; use --compile default (or off) with --cuda-graphs on"
        )
    if cfg.lr_scheduler is not None:
        _check_choice("lr-scheduler", cfg.lr_scheduler, LR_SCHEDULERS)
    if cfg.preset is not None:
        _check_choice("preset", cfg.preset, tuple(PPO_PRESETS))
    _check_game(cfg.game)
    for name in ("num_envs", "total_steps", "keep_checkpoints", "n_steps", "epochs", "buffer_size"):
        _check_positive(name, getattr(cfg, name))
    for name in (
        "train_frequency",
        "target_update_interval",
        "lr_step_size",
        "replay_chunk_kib",
        "dqn_batch_size",
        "gradient_steps",
    ):
        _check_positive(name, getattr(cfg, name))
    if cfg.learning_starts < 0:
        raise ConfigError(f"--learning-starts {cfg.learning_starts}: must be >= 0")
    if cfg.eval_episodes < 0:
        raise ConfigError(f"--eval-episodes {cfg.eval_episodes}: must be >= 0")
    if cfg.env_threads is not None and (
        not isinstance(cfg.env_threads, int)
        or isinstance(cfg.env_threads, bool)
        or cfg.env_threads < 0
    ):
        raise ConfigError(f"--env-threads {cfg.env_threads!r}: must be an integer >= 0")
    if cfg.checkpoint_every_s <= 0:
        raise ConfigError(f"--checkpoint-every-s {cfg.checkpoint_every_s}: must be > 0")
    for name in ("checkpoint_every_steps", "eval_every_steps", "threads"):
        value = getattr(cfg, name)
        if value is not None:
            _check_positive(name, value)
    _check_net_arch(cfg.net_arch)
    _check_batch(cfg)
    if cfg.keep_best and (cfg.eval_every_steps is None or cfg.eval_episodes == 0):
        raise ConfigError(
            f"--keep-best {cfg.keep_best}: needs periodic evaluations to rank checkpoints by "
            "(--eval-every-steps, and --eval-episodes above 0)"
        )
    return cfg


def _check_game(game: str) -> None:
    if game in KNOWN_TASKS:
        return
    close = suggest(game)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(
        f"--game {game!r}: not a supported envpool task id (Atari *-v5, CartPole-v1, "
        f"Acrobot-v1, MountainCar-v0){hint}"
    )


def _check_choice(flag: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"--{flag} {value!r}: expected one of {', '.join(choices)}")


def _check_positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"--{name.replace('_', '-')} {value!r}: must be a positive integer")


def _check_net_arch(text: str) -> None:
    if not text:
        return
    parts = text.split(",")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"--net-arch {text!r}: expected positive layer sizes like '512,512'")


def _check_batch(cfg: WorkerConfig) -> None:
    if cfg.algo == "dqn":
        if cfg.batch_size == "auto":
            raise ConfigError(
                "--batch-size auto: only PPO and PQN pick their minibatch; give DQN a number"
            )
        own = cfg.dqn_batch_size != WorkerConfig.dqn_batch_size
        if isinstance(cfg.batch_size, int) and own and cfg.batch_size != cfg.dqn_batch_size:
            raise ConfigError(
                f"--batch-size {cfg.batch_size} and --dqn-batch-size {cfg.dqn_batch_size}: "
                "DQN's batch given twice; give --dqn-batch-size only"
            )
    if cfg.batch_size is None or cfg.batch_size == "auto":
        return
    _check_positive("batch_size", cfg.batch_size)
    if cfg.algo in ROLLOUT_ALGOS and cfg.rollout_size() % int(cfg.batch_size) != 0:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} does not divide the rollout num_envs*n_steps = "
            f"{cfg.num_envs}*{cfg.n_steps} = {cfg.rollout_size()}; use a divisor "
            f"(e.g. {largest_divisor_at_most(cfg.rollout_size(), int(cfg.batch_size))}) or 'auto'"
        )
