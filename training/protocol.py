"""The contract between the supervisor and a training worker.

Torch-free on purpose: the supervisor and the CLI import this module, and `rlsup status` must
start in milliseconds. Everything an operator's script may rely on lives here: the worker's
arguments (`WorkerConfig`, which round-trips to argv and JSON), the heartbeat fields, the exit
codes and the files a worker keeps in its run directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from training.tasks import KNOWN_TASKS, is_atari, suggest

HEARTBEAT_SCHEMA = 1

# Files inside a worker's run directory.
HEARTBEAT_FILE = "heartbeat.json"
PROGRESS_FILE = "progress.csv"
ERROR_FILE = "error.json"
EVAL_FILE = "eval.json"
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = "worker.lock"

PROGRESS_COLUMNS = (
    "time",
    "wall_s",
    "global_step",
    "episodes",
    "sps",
    "mean_return",
    "num_envs",
    "batch_size",
    "resume_count",
)


class ExitCode(enum.IntEnum):
    """A worker's exit status. Anything else, or death by a signal, is a crash."""

    DONE = 0  # total_steps reached (and the final checkpoint and evaluation written)
    STOPPED = 75  # stopped on request (SIGTERM/SIGINT/parent gone) after a checkpoint
    OOM = 76  # CUDA or host out of memory
    FENCED = 77  # several hosts: the game was placed elsewhere since; nothing committed
    CONFIG = 78  # configuration error: restarting cannot help


class Phase(enum.StrEnum):
    """What a worker is doing; each phase has its own deadline for progress."""

    STARTING = "starting"
    WAITING_GPU = "waiting_gpu"
    LOADING = "loading"
    TRAINING = "training"
    CHECKPOINTING = "checkpointing"
    EVALUATING = "evaluating"
    STOPPING = "stopping"


# The pid of the process that started a worker (the supervisor, or a host's actor): a worker
# whose parent is already gone when it looks (killed during its imports) still notices.
PARENT_PID_ENV = "RLSUP_PARENT_PID"

# ---- the spare worker's channel ------------------------------------------------------------
# `python -m training.worker --standby --channel-fd N`: a pre-warmed process that waits on a
# SOCK_SEQPACKET socket (a socketpair; the supervisor holds the other end, nothing on disk)
# for the argv of the worker it is to become. One JSON object per message, both ways:
#   spare -> supervisor: {"type": "ready", "pid", "warm_s", "device", "priority"}, then
#       {"type": "alive"} every SPARE_ALIVE_EVERY_S, and {"type": "assigned", "mono"} once it
#       has taken an assignment (it is a worker from then on and says nothing more here);
#   supervisor -> spare: {"type": "assign", "argv": [...], "cwd": run_dir, "log": path}.
# End of file on either side means the other is gone: an idle spare then exits 0.
SPARE_ALIVE_EVERY_S = 2.0
SPARE_MAX_MESSAGE = 1 << 16


def encode_message(msg: dict[str, Any]) -> bytes:
    raw = json.dumps(msg, allow_nan=False).encode("utf-8")
    if len(raw) > SPARE_MAX_MESSAGE:
        raise ValueError(f"channel message of {len(raw)} bytes (at most {SPARE_MAX_MESSAGE})")
    return raw


def decode_message(raw: bytes) -> dict[str, Any] | None:
    """One message, or None when it is not a JSON object with a string `type`."""
    try:
        msg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return msg if isinstance(msg, dict) and isinstance(msg.get("type"), str) else None


ALGOS = ("dqn", "ppo")
DEVICES = ("auto", "cpu", "cuda")
# Arithmetic of the networks: "auto" = bf16 autocast on CUDA (fp16 + a grad scaler where bf16
# is missing) and on a CPU with native bf16 (avx512_bf16 / amx_bf16) for the Atari CNN, fp32
# elsewhere; "fp32" = plain fp32 everywhere; "bf16" = bf16 autocast wherever it runs. The
# weights and the optimizer stay fp32 in every mode, so checkpoints move between them.
PRECISIONS = ("auto", "fp32", "bf16")
LR_SCHEDULERS = ("none", "cosine", "step")
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


class ConfigError(ValueError):
    """A worker argument is invalid. The message names the flag and the value."""


def _f(default: Any, help: str, **kw: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **kw})


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Everything one training worker needs; one instance per game."""

    game: str = _f("CartPole-v1", "envpool task id, e.g. Pong-v5, Breakout-v5, CartPole-v1")
    algo: str = _f("ppo", "algorithm: dqn | ppo", choices=ALGOS)
    run_dir: str = _f("runs/default", "run directory: checkpoints, heartbeat, progress, errors")
    num_envs: int = _f(8, "number of vectorized envpool environments")
    batch_size: int | Literal["auto"] = _f(
        256, "DQN batch / PPO minibatch; PPO: must divide num_envs*n_steps, or 'auto'"
    )
    total_steps: int = _f(100_000, "agent steps to train, summed over all envs")
    seed: int = _f(
        1, "seed of everything random; envs get a seed derived from (seed, resume count)"
    )
    checkpoint_every_s: float = _f(300.0, "seconds between checkpoints")
    checkpoint_every_steps: int | None = _f(None, "also checkpoint every this many agent steps")
    keep_checkpoints: int = _f(3, "committed checkpoints to keep (newest first)")
    device: str = _f("auto", "auto | cpu | cuda", choices=DEVICES)
    threads: int | None = _f(None, "torch intra-op and envpool threads (default: all cores)")
    precision: str = _f(
        "auto",
        "auto | fp32 | bf16: network arithmetic (auto: bf16 autocast on CUDA and on CPUs with "
        "native bf16 for Atari, fp32 elsewhere; weights stay fp32)",
        choices=PRECISIONS,
    )
    eval_every_steps: int | None = _f(None, "also evaluate every this many agent steps")
    eval_episodes: int = _f(
        10,
        "episodes per evaluation (0 disables evaluation): PPO samples its policy, DQN plays "
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
    lr_scheduler: str = _f(
        "none", "learning-rate schedule: none | cosine | step", choices=LR_SCHEDULERS
    )
    lr_step_size: int = _f(100_000, "step scheduler: agent steps between decays")
    lr_step_gamma: float = _f(0.5, "step scheduler: decay factor")
    min_lr: float = _f(0.0, "cosine scheduler: final learning rate")
    max_grad_norm: float | None = _f(None, "gradient norm clip (default: 0.5 PPO / 10 DQN)")
    net_arch: str = _f(
        "",
        "MLP hidden sizes for vector obs, e.g. '512,512' (default: 64,64 PPO / 120,84 DQN)",
    )
    # DQN
    buffer_size: int = _f(100_000, "DQN: replay capacity in transitions")
    replay_chunk_kib: int = _f(
        16_384, "DQN: replay chunk file size in KiB, the unit of incremental checkpoints"
    )
    learning_starts: int = _f(10_000, "DQN: agent steps before learning starts")
    train_frequency: int = _f(4, "DQN: agent steps per gradient step (per env step batch)")
    target_update_interval: int = _f(1_000, "DQN: agent steps between target network syncs")
    start_e: float = _f(1.0, "DQN: initial exploration epsilon")
    end_e: float = _f(0.05, "DQN: final exploration epsilon")
    exploration_fraction: float = _f(0.5, "DQN: fraction of total_steps to anneal epsilon over")
    dueling: bool = _f(False, "DQN: dueling value/advantage head")
    # PPO
    preset: str | None = _f(
        None,
        "PPO: fast | heavy | beast sets envs, steps, minibatch, epochs, net",
        choices=tuple(PPO_PRESETS),
    )
    n_steps: int = _f(128, "PPO: rollout length per env")
    epochs: int = _f(4, "PPO: optimisation epochs per rollout")
    gae_lambda: float = _f(0.95, "PPO: GAE lambda")
    clip_coef: float | None = _f(
        None, "PPO: surrogate clip range (default: 0.1 Atari / 0.2 vector)"
    )
    vf_coef: float = _f(0.5, "PPO: value loss weight")
    ent_coef: float = _f(0.01, "PPO: entropy bonus weight")
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
        """PPO minibatch: the explicit batch size, or for 'auto' the largest divisor <= 2048."""
        if self.batch_size == "auto":
            return largest_divisor_at_most(self.rollout_size(), 2048)
        return int(self.batch_size)

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


def _parse_batch(text: str) -> int | str:
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
_FIELD_PARSERS: dict[str, Any] = {"batch_size": _parse_batch}


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
    else:  # batch_size: an int or "auto", checked with the rollout size in _check_batch
        ok = value == "auto" or (isinstance(value, int) and not isinstance(value, bool))
        expect = 'an integer or "auto"'
    if not ok:
        optional = " (or none)" if kind.endswith("| None") else ""
        raise ConfigError(f"{flag} {value!r}: expected {expect}{optional}")
    _check_range(name, value)


# flag -> (lowest, highest, lowest allowed): bounds of the numeric hyper-parameters.
_RANGES: dict[str, tuple[float, float, bool]] = {
    "gamma": (0.0, 1.0, True),
    "gae_lambda": (0.0, 1.0, True),
    "start_e": (0.0, 1.0, True),
    "end_e": (0.0, 1.0, True),
    "exploration_fraction": (0.0, 1.0, True),
    "lr_step_gamma": (0.0, 1.0, False),
    "min_lr": (0.0, math.inf, True),
    "vf_coef": (0.0, math.inf, True),
    "ent_coef": (0.0, math.inf, True),
    "max_grad_norm": (0.0, math.inf, False),
    "clip_coef": (0.0, math.inf, False),
    "checkpoint_every_s": (0.0, math.inf, False),
    "eval_budget_s": (0.0, math.inf, False),
    "learning_rate": (0.0, math.inf, False),
    "seed": (0, 2**63 - 1, True),
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
    _check_choice("lr-scheduler", cfg.lr_scheduler, LR_SCHEDULERS)
    if cfg.preset is not None:
        _check_choice("preset", cfg.preset, tuple(PPO_PRESETS))
    _check_game(cfg.game)
    for name in ("num_envs", "total_steps", "keep_checkpoints", "n_steps", "epochs", "buffer_size"):
        _check_positive(name, getattr(cfg, name))
    for name in ("train_frequency", "target_update_interval", "lr_step_size", "replay_chunk_kib"):
        _check_positive(name, getattr(cfg, name))
    if cfg.learning_starts < 0:
        raise ConfigError(f"--learning-starts {cfg.learning_starts}: must be >= 0")
    if cfg.eval_episodes < 0:
        raise ConfigError(f"--eval-episodes {cfg.eval_episodes}: must be >= 0")
    if cfg.checkpoint_every_s <= 0:
        raise ConfigError(f"--checkpoint-every-s {cfg.checkpoint_every_s}: must be > 0")
    for name in ("checkpoint_every_steps", "eval_every_steps", "threads"):
        value = getattr(cfg, name)
        if value is not None:
            _check_positive(name, value)
    _check_net_arch(cfg.net_arch)
    _check_batch(cfg)
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
    if cfg.batch_size == "auto":
        if cfg.algo == "dqn":
            raise ConfigError("--batch-size auto: only PPO picks its minibatch; give DQN a number")
        return
    _check_positive("batch_size", cfg.batch_size)
    if cfg.algo == "ppo" and cfg.rollout_size() % int(cfg.batch_size) != 0:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} does not divide the rollout num_envs*n_steps = "
            f"{cfg.num_envs}*{cfg.n_steps} = {cfg.rollout_size()}; use a divisor "
            f"(e.g. {largest_divisor_at_most(cfg.rollout_size(), int(cfg.batch_size))}) or 'auto'"
        )


# ---- heartbeat ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """What a worker says about itself about once a second (`<run_dir>/heartbeat.json`).

    The supervisor judges liveness by its own monotonic clock: when `seq` last changed, and
    whether `global_step` moved within `phase_deadline_s`.
    """

    seq: int
    pid: int
    phase: str
    phase_deadline_s: float
    global_step: int
    total_steps: int
    episodes: int
    sps: float
    mean_return: float | None
    last_checkpoint_step: int | None
    resumed_from_step: int | None
    num_envs: int
    batch_size: int
    device: str
    gpu_mem_mb: float | None
    # Extensions (additive):
    schema: int = HEARTBEAT_SCHEMA
    game: str = ""
    algo: str = ""
    time: float = 0.0
    last_checkpoint_time: float | None = None
    resume_count: int = 0
    threads: int | None = None
    eval: dict[str, Any] | None = None
    quarantined: list[str] = dataclasses.field(default_factory=list)
    checkpoint_failures: int = 0
    last_checkpoint_error: str | None = None
    # Replay chunks found damaged, newest last: on load (`when` "load": left out, their
    # transitions dropped) or when about to link them into a new checkpoint ("checkpoint":
    # rewritten from memory). Each: checkpoint, files, when, and transitions_dropped on load.
    replay_damage: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # A checkpoint restored from the mirror at start (no local one): step, bytes, skipped.
    mirror_restore: dict[str, Any] | None = None
    # Several hosts: local checkpoints of an earlier placement moved aside at start because
    # the mirror held a newer placement's: local and mirror [epoch, step], moved_to.
    superseded: dict[str, Any] | None = None
    # Several hosts: the host this worker runs on (set by the node's actor when it relays).
    host: str | None = None
    # Writes that failed and were survived (a full disk, an I/O error), per file kind:
    # "heartbeat" (kept up in place), "progress" (rows kept and appended later), "eval", "log",
    # "tensorboard" (event files; retried in a new file a minute later).
    write_failures: dict[str, int] = dataclasses.field(default_factory=dict)
    # How this process came to train, on the system's monotonic clock (CLOCK_MONOTONIC, the
    # same in every process, so the supervisor can subtract its own readings): "served"
    # ("spare" or "cold"), and the marks "assigned" (a spare took its assignment), "loaded"
    # (checkpoint loaded and learner built) and "first_step" (its first iteration done).
    start: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The torch this worker runs, set once its device is picked: "torch" (version), "cuda"
    # (torch.version.cuda; null for a CPU-only build), "cuda_available", "driver" (the NVIDIA
    # driver's version; null without one). `rlsup status` flags a `device = "auto"` game that
    # trains on the CPU of a host with a driver ("cpu (no CUDA torch)").
    torch_build: dict[str, Any] | None = None
    # The networks' arithmetic as it runs (`--precision` resolved): "fp32", "bf16", "fp16".
    precision: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Heartbeat:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


MAX_STATE_FILE_BYTES = 4 << 20


def read_regular_file(path: str | os.PathLike[str], limit: int = MAX_STATE_FILE_BYTES) -> bytes:
    """The bytes of a small regular file, read without ever blocking or following a link.

    Run-dir files are written by another process and can be replaced by anyone with access to
    the directory: a FIFO planted as `heartbeat.json` must not block the supervisor's tick (a
    plain open() of a FIFO waits for a writer), nor a symlink lead it elsewhere. OSError
    (ELOOP, or EINVAL for anything but a regular file) otherwise.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(22, "not a regular file", str(path))
        chunks, size = [], 0
        while size < limit and (chunk := os.read(fd, min(1 << 20, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_heartbeat(run_dir: str | os.PathLike[str]) -> Heartbeat | None:
    """The latest heartbeat, or None when there is none (yet) or it cannot be parsed."""
    data = read_json_file(Path(run_dir) / HEARTBEAT_FILE)
    if data is None:
        return None
    try:
        return Heartbeat.from_json(data)
    except (TypeError, ValueError):
        return None


def read_json_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(read_regular_file(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
