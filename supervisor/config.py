"""The TOML configuration (ARCHITECTURE.md section 8), validated into frozen dataclasses.

Every problem becomes one `ConfigError` whose message names the file, the line (when it can
be found) and the key, the value found and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import shutil
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training import args as worker_args
from training import protocol, torchbuild
from training.tasks import KNOWN_TASKS, suggest

CONFIG_ENV = "RLSUP_CONFIG"
DEFAULT_CONFIG = "rlsup.toml"
# Where `rlsup install-service` puts the service's configuration: found without any flag.
SYSTEM_CONFIG = Path("/etc/rlsup/rlsup.toml")
GAME_NAME_RE = re.compile(r"[a-z0-9_-]{1,40}")
# A run of a game's matrix (`seeds`, `variants`): `pong/s2`, `pong/lr3/s1`, `pong/lr3`.
RUN_NAME_RE = re.compile(r"[a-z0-9_-]{1,40}(/[a-z0-9_-]{1,40})?(/s[0-9]{1,19})?")
_SEED_PART_RE = re.compile(r"s[0-9]+")


class ConfigError(Exception):
    """A bad configuration file; str() is the whole message for the operator."""


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
    heartbeat: bool = True  # False: a command game that promises none (no hang detection)
    knobs: tuple[str, ...] = KNOBS  # the mode's knobs it honours (a change restarts it)
    # Which [[games]] table it came from (a matrix expands one table into several runs): error
    # messages name that table's line. Not part of what the game is (reload compares specs).
    table: int = dataclasses.field(default=0, compare=False)

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
class MirrorConfig:
    """[mirror]: committed checkpoints copied to S3-compatible object storage."""

    url: str  # s3://bucket[/prefix]
    endpoint_url: str = ""  # an S3-compatible server; "" = AWS (or AWS_ENDPOINT_URL)
    region: str = ""  # "" = the AWS chain's
    every_s: float = 0.0  # 0 = each committed checkpoint ("each"), else at most one per N s
    bandwidth_mb_s: float = 0.0  # 0 = unlimited
    keep: int = 3  # newest manifests kept per game in the bucket
    concurrency: int = 4  # parallel part uploads (memory ≈ concurrency x chunk_mb)
    chunk_mb: float = 8.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ClusterConfig:
    """[cluster]: where workers run. "local" (this host) or "ray" (the hosts of a Ray
    cluster that ran `rlsup join`; needs [mirror]: a game that moves resumes from it)."""

    backend: str = "local"
    address: str = "auto"  # the Ray head (host:port); "auto": the cluster this host joined
    namespace: str = "rlsup"  # Ray namespace of the workers' actors (one per supervisor)
    cpus_per_game: float = 1.0  # Ray resources each game's actor holds on its host
    gpus_per_game: float = 0.0  # a fraction shares a GPU between games
    games_per_host: int = 0  # most games on one host; 0 = as many as its CPUs allow
    host_lost_after_s: float = 30.0  # a worker's host unreachable this long is lost

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SpareConfig:
    """[spare]: a pre-warmed worker process per host, handed the next start (on several
    hosts: one per joined host, inside an actor of its own)."""

    enabled: bool | str = "auto"  # true | false | "auto" (the stability policy decides)
    min_ram_available_pct: float = 20.0  # auto: no spare below this, its own RSS counted

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# [preemption]: each provider's metadata service and the warning it gives before it takes a
# spot machine (AWS: the spot instance-action, 2 min; GCE: `preempted`, then an ACPI soft off
# ~30 s later; Azure: a `Preempt` scheduled event, >= 30 s). All three answer on the
# link-local address (GCE also as metadata.google.internal; the address needs no DNS).
PREEMPTION_PROVIDERS = ("aws", "gcp", "azure")
PREEMPTION_GRACE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
METADATA_ENDPOINT = "http://169.254.169.254"


@dataclass(frozen=True)
class PreemptionConfig:
    """[preemption]: watch the cloud's metadata service for a preemption notice; on one, every
    game checkpoints now, nothing new starts, and the machine's loss is no crash."""

    provider: str = "auto"  # "auto" | "aws" | "gcp" | "azure" | "none"
    poll_s: float = 5.0  # AWS recommends every 5 s
    endpoint: str = METADATA_ENDPOINT  # the metadata service's base URL
    timeout_s: float = 1.0  # per request: a hung metadata service costs the watcher this
    max_preemptions: int = 10  # per 24 h: beyond, deaths under a notice count as crashes
    flush: str = "upload"  # "upload": the mirror takes preemption checkpoints first; "local"
    # Seconds before the deadline that every game is asked for one last checkpoint (the work
    # since the notice's checkpoint is kept too); 0 = the notice's checkpoint is the last.
    final_checkpoint_s: float = 15.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class MetricsConfig:
    """[metrics]: operator metrics in Prometheus' text format (names prefixed `rlsup_`)."""

    textfile: Path | None = None  # node_exporter's textfile collector; rewritten atomically
    listen_host: str = ""  # "" = no HTTP endpoint (no listener unless asked for)
    listen_port: int = 0
    interval_s: float = 5.0  # how often the supervisor recomputes them (a background thread)

    @property
    def enabled(self) -> bool:
        return self.textfile is not None or bool(self.listen_host)


@dataclass(frozen=True)
class HookSpec:
    """One [[hooks]] table: run `command` (an argv, no shell) on each event of the kinds `on`,
    the event as one JSON object on stdin."""

    on: tuple[str, ...]
    command: tuple[str, ...]
    timeout_s: float = 30.0
    games: tuple[str, ...] = ()  # only these games' events (and host-wide ones); () = all
    pass_env: tuple[str, ...] = ()  # more of the service's environment variables it gets
    program: str = ""  # command[0] resolved to a path once (resolve_hook_programs); "" = not


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
    cluster: ClusterConfig = ClusterConfig()  # added table: [cluster]
    spare: SpareConfig = SpareConfig()  # added table: [spare]
    metrics: MetricsConfig = MetricsConfig()  # added table: [metrics]
    hooks: tuple[HookSpec, ...] = ()  # added tables: [[hooks]]
    gpu_cost_share: float = 0.0  # added key: the part of cost_per_hour that is the GPUs'
    preemption: PreemptionConfig = PreemptionConfig()  # added table: [preemption]

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
    if head and _SEED_PART_RE.fullmatch(last):
        return head, int(last[1:])
    return name, None


def resolve_config_path(arg: str | os.PathLike[str] | None) -> Path:
    """--config PATH, else $RLSUP_CONFIG, else ./rlsup.toml, else /etc/rlsup/rlsup.toml (the
    installed service's); ./rlsup.toml is named in the message when none exists."""
    if arg:
        return Path(arg)
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    local = Path(DEFAULT_CONFIG)
    if not local.exists() and os.path.lexists(SYSTEM_CONFIG):
        return SYSTEM_CONFIG
    return local


# ---- schema -------------------------------------------------------------------------------

_NUM = (int, float)


def _mirror_url_ok(v: Any) -> bool:
    from checkpoints.remote import RemoteLocation  # no boto3: parsing only

    try:
        RemoteLocation.parse(v)
    except ValueError:
        return False
    return True


def _positive(v: Any) -> bool:
    return bool(v > 0)


def _non_negative(v: Any) -> bool:
    return bool(v >= 0)


# key -> (python types, default (None = required), check, expectation text)
Field = tuple[tuple[type, ...], Any, Callable[[Any], bool] | None, str]
_TOP: dict[str, Field] = {
    "state_dir": ((str,), "var/rlsup", None, "a path (string)"),
    "initial_mode": ((str,), "", None, "the name of a [modes.*] table"),
    "checkpoint_every_s": (_NUM, 300.0, _positive, "seconds > 0"),
    "stop_grace_s": (_NUM, 60.0, _positive, "seconds > 0"),
    "cost_per_hour": (_NUM, 0.0, _non_negative, "a number >= 0"),
    "gpu_cost_share": (
        _NUM,
        0.0,
        lambda v: 0 <= v <= 1,
        "a fraction in 0..1: the part of cost_per_hour that is the GPUs' (shared per GPU "
        "among the games placed on it)",
    ),
    # The loop's longest sleep: stop requests, mode changes and hang kills wait up to a tick
    # (above a minute they would lag visibly); below 10 ms it would spin a core for nothing.
    "tick_s": (_NUM, 1.0, lambda v: 0.01 <= v <= 60, "seconds in 0.01..60"),
    "logs_dir": ((str,), "", None, "a path (string)"),
}
_TABLES = (
    "modes", "games", "restart", "watchdog", "stability", "gpu", "mirror", "cluster", "spare",
    "metrics", "hooks", "preemption",
)  # fmt: skip
DEFAULT_METRICS_PORT = 9469
_METRICS: dict[str, Field] = {
    "textfile": (
        (str,),
        "",
        lambda v: v == "" or v.endswith(".prom"),
        "a path ending in .prom (node_exporter's textfile collector reads *.prom)",
    ),
    "listen": (
        (str, int),
        "",
        lambda v: (
            (isinstance(v, int) and 0 < v < 65536)
            or (isinstance(v, str) and (v == "" or _listen_address(v) is not None))
        ),
        'a port (bound to 127.0.0.1) or "HOST:PORT", e.g. "127.0.0.1:9469"',
    ),
    "interval_s": (_NUM, 5.0, lambda v: 0.2 <= v <= 3600, "seconds in 0.2..3600"),
}
_HOOK: dict[str, Field] = {
    "on": (
        (list,),
        None,
        lambda v: bool(v) and all(isinstance(k, str) for k in v),
        "a non-empty list of event kinds (as `rlsup events` names them)",
    ),
    "command": (
        (list,),
        None,
        lambda v: bool(v) and all(isinstance(a, str) and a for a in v),
        'an argv list of strings, e.g. ["/usr/local/bin/notify", "--urgent"] (no shell)',
    ),
    "timeout_s": (_NUM, 30.0, lambda v: 0 < v <= 3600, "seconds in (0, 3600]"),
    "games": (
        (list,),
        [],
        lambda v: all(isinstance(g, str) for g in v),
        "a list of game names",
    ),
    "pass_env": (
        (list,),
        [],
        lambda v: all(isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in v),
        'a list of environment variable names, e.g. ["SLACK_TOKEN"]',
    ),
}
# Where a bare hook program is looked up: systemd's PATH for services, the same for every
# caller (an operator's shell PATH says nothing about the service's).
HOOK_PROGRAM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _listen_address(v: str) -> tuple[str, int] | None:
    """("127.0.0.1", 9469) from "127.0.0.1:9469", "[::1]:9469" or ":9469"; None if malformed."""
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]*):([0-9]{1,5})", v)
    if m is None or not 0 < int(m.group(2)) < 65536:
        return None
    return (m.group(1).strip("[]") or "127.0.0.1", int(m.group(2)))


_SPARE: dict[str, Field] = {
    "enabled": (
        (bool, str),
        "auto",
        lambda v: isinstance(v, bool) or v == "auto",
        'true, false or "auto"',
    ),
    "min_ram_available_pct": (_NUM, 20.0, lambda v: 0 <= v < 100, "a percentage in 0..100"),
}
_PREEMPTION: dict[str, Field] = {
    "provider": (
        (str,),
        "auto",
        lambda v: v in ("auto", "none", *PREEMPTION_PROVIDERS),
        '"auto", "aws", "gcp", "azure" or "none"',
    ),
    "poll_s": (_NUM, 5.0, lambda v: 0.05 <= v <= 600, "seconds in 0.05..600"),
    "endpoint": (
        (str,),
        METADATA_ENDPOINT,
        lambda v: re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", v) is not None,
        'an http(s) base URL, e.g. "http://169.254.169.254"',
    ),
    "timeout_s": (_NUM, 1.0, lambda v: 0 < v <= 30, "seconds in (0, 30]"),
    "max_preemptions": ((int,), 10, _non_negative, "an integer >= 0 (per 24 hours)"),
    "flush": ((str,), "upload", lambda v: v in ("upload", "local"), '"upload" or "local"'),
    "final_checkpoint_s": (_NUM, 15.0, lambda v: 0 <= v <= 3600, "seconds in 0..3600 (0: off)"),
}
_ADDRESS_RE = r"[A-Za-z0-9.\[\]:-]+:[0-9]+"
_CLUSTER: dict[str, Field] = {
    "backend": ((str,), "local", lambda v: v in ("local", "ray"), '"local" or "ray"'),
    "address": (
        (str,),
        "auto",
        lambda v: (
            v == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9.\[\]:-]+:[0-9]+", v) is not None
        ),
        '"auto" or the Ray head\'s host:port',
    ),
    "namespace": (
        (str,),
        "rlsup",
        lambda v: re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", v) is not None,
        "a Ray namespace (letters, digits, _ . -)",
    ),
    "cpus_per_game": (_NUM, 1.0, _non_negative, "CPUs >= 0"),
    "gpus_per_game": (_NUM, 0.0, _non_negative, "GPUs >= 0 (a fraction shares one)"),
    "games_per_host": ((int,), 0, _non_negative, "an integer >= 0 (0: by CPUs)"),
    "host_lost_after_s": (_NUM, 30.0, _positive, "seconds > 0"),
}
_MIRROR: dict[str, Field] = {
    "url": ((str,), None, _mirror_url_ok, "s3://bucket[/prefix]"),
    "endpoint_url": (
        (str,),
        "",
        lambda v: v == "" or re.fullmatch(r"https?://\S+", v) is not None,
        "an http(s):// URL of an S3-compatible server",
    ),
    "region": ((str,), "", None, "an AWS region name"),
    "every": (
        (str,),
        "each",
        lambda v: v == "each" or re.fullmatch(r"[0-9]+(\.[0-9]+)?s", v) is not None,
        '"each" or seconds such as "600s"',
    ),
    "bandwidth_mb_s": (_NUM, 0.0, _non_negative, "MB/s >= 0 (0: unlimited)"),
    "keep": ((int,), 3, _positive, "a positive integer"),
    "concurrency": ((int,), 4, lambda v: 1 <= v <= 64, "an integer in 1..64"),
    "chunk_mb": (_NUM, 8.0, lambda v: 5 <= v <= 512, "MB in 5..512 (S3's part sizes)"),
}
_MODE: dict[str, Field] = {
    "num_envs": ((int,), None, _positive, "a positive integer"),
    "batch_size": (
        (int, str),
        None,
        lambda v: v == "auto" or (isinstance(v, int) and v > 0),
        'a positive integer or "auto"',
    ),
    "n_steps": ((int,), 128, _positive, "a positive integer"),
    "max_concurrent": ((int,), None, _positive, "a positive integer"),
}
_GAME: dict[str, Field] = {
    "name": (
        (str,),
        None,
        lambda v: GAME_NAME_RE.fullmatch(v) is not None,
        "a name matching [a-z0-9_-]{1,40}",
    ),
    "env_id": (
        (str,),
        None,
        None,
        "an envpool task id, or `command` (your own program) instead of env_id/algo",
    ),
    "algo": ((str,), "ppo", lambda v: v in worker_args.ALGOS, " | ".join(worker_args.ALGOS)),
    "total_steps": ((int,), None, _positive, "a positive integer"),
    "seed": ((int,), 1, lambda v: 0 <= v < 2**63, "an integer >= 0"),
    "device": ((str,), "auto", lambda v: v in worker_args.DEVICES, " | ".join(worker_args.DEVICES)),
    "args": ((dict,), {}, None, "a table of worker hyper-parameters"),
    "gpu": (
        (str, int, list),
        "auto",
        lambda v: _gpu_choice(v) is not None,
        '"auto", a GPU index >= 0 among the visible GPUs, or a list of distinct ones',
    ),
    "seeds": (
        (list,),
        [],
        lambda v: all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**63 for x in v),
        "a list of seeds (integers >= 0): one run per seed, named GAME/sSEED",
    ),
    "variants": ((dict,), {}, None, "a table of named argument variants: NAME = { key = value }"),
}

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Variables a command game's `env` may not set: the supervisor sets them for every game.
_OWNED_ENV = ("CUDA_VISIBLE_DEVICES", "NOTIFY_SOCKET", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

_COMMAND_GAME: dict[str, Field] = {
    "name": _GAME["name"],
    "command": (
        (list,),
        None,
        lambda v: bool(v) and all(isinstance(a, str) and a and "\0" not in a for a in v),
        "a non-empty list of strings: the program and its arguments",
    ),
    "cwd": ((str,), "", lambda v: "\0" not in v, "a directory (relative to this file)"),
    "env": ((dict,), {}, None, "a table of environment variables"),
    "heartbeat": ((bool,), False, None, "true (it heartbeats through the SDK) or false"),
    "knobs": (
        (list,),
        [],
        lambda v: all(k in KNOBS for k in v) and len(set(v)) == len(v),
        f"a list of distinct knobs it honours among {', '.join(KNOBS)}",
    ),
    "total_steps": ((int,), 0, _non_negative, "an integer >= 0 (0: not known)"),
    "seed": _GAME["seed"],
    "device": _GAME["device"],
    "gpu": _GAME["gpu"],
    "seeds": _GAME["seeds"],
}


def _command_game(ctx: _Ctx, i: int, table: Any, path: Path) -> GameSpec:
    """A `[[games]]` table with `command`: the user's own program (docs/own-trainer.md)."""
    for key in ("env_id", "algo", "args"):
        if isinstance(table, dict) and key in table:
            raise ctx.fail(
                ["games", i, key],
                "a game with `command` runs your own program: it has no env_id, algo or args "
                "(those are rlsup's own worker's); remove it, or the command",
            )
    v = _values(ctx, ["games", i], table, _COMMAND_GAME)
    env: dict[str, str] = {}
    for key, value in v["env"].items():
        if _ENV_NAME_RE.fullmatch(key) is None or not isinstance(value, str) or "\0" in value:
            raise ctx.fail(
                ["games", i, "env", key],
                f"got {key} = {value!r}; expected a variable name [A-Za-z_][A-Za-z0-9_]* "
                "set to a string",
            )
        if key.startswith("RLSUP_") or key in _OWNED_ENV:
            raise ctx.fail(
                ["games", i, "env", key],
                "set by the supervisor for every command game (docs/own-trainer.md): remove it",
            )
        env[key] = value
    cwd = None
    if v["cwd"]:
        cwd = str((path.parent / os.path.expanduser(v["cwd"])).resolve())
    game = GameSpec(
        name=v["name"],
        env_id="",
        algo="command",
        total_steps=v["total_steps"],
        seed=v["seed"],
        device=v["device"],
        gpu=_gpu_choice(v["gpu"]) or None,
        command=tuple(v["command"]),
        cwd=cwd,
        env=tuple(sorted(env.items())),
        heartbeat=v["heartbeat"],
        knobs=tuple(v["knobs"]),
        table=i,
    )
    if game.gpu is not None and game.device == "cpu":
        raise ctx.fail(["games", i, "gpu"], 'set on a game with device = "cpu"')
    return game


def _gpu_choice(value: Any) -> tuple[int, ...] | None:
    """`games.gpu` as GameSpec holds it: () for "auto" (None there), the indices otherwise;
    None when invalid."""
    if value == "auto":
        return ()
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, list) or not items:
        return None
    ok = all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items)
    return tuple(items) if ok and len(set(items)) == len(items) else None


def _section_fields(cls: type) -> dict[str, Field]:
    out: dict[str, Field] = {}
    for f in dataclasses.fields(cls):
        if isinstance(f.default, str):
            out[f.name] = ((str,), f.default, None, "a mode name")
        elif isinstance(f.default, int) and not isinstance(f.default, bool):
            out[f.name] = ((int,), f.default, _non_negative, "an integer >= 0")
        else:
            out[f.name] = (_NUM, f.default, _positive, "a number > 0")
    return out


_SECTIONS: dict[str, type] = {
    "restart": RestartConfig,
    "watchdog": WatchdogConfig,
    "stability": StabilityConfig,
    "gpu": GpuConfig,
}


class _Ctx:
    """Builds error messages that point at the file, line and key."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def fail(self, where: list[str | int], message: str) -> ConfigError:
        line = _locate(self.lines, where)
        at = f"line {line}: " if line else ""
        return ConfigError(f"{self.path}: {at}{_dotted(where)}: {message}")


def _dotted(where: list[str | int]) -> str:
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (("." if out else "") + part)
    return out


def _locate(lines: list[str], where: list[str | int]) -> int | None:
    """Best-effort line number of a key path such as ['games', 1, 'env_id']."""
    table: list[str | int] = []
    counts: dict[str, int] = {}
    best: int | None = None
    for no, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if m := re.fullmatch(r"\[\[\s*([^\]]+?)\s*\]\]", line):
            name = m.group(1)
            counts[name] = counts.get(name, -1) + 1
            table = [*name.split("."), counts[name]]
        elif m := re.fullmatch(r"\[\s*([^\]]+?)\s*\]", line):
            table = list(m.group(1).split("."))
        else:
            m = re.match(r"([A-Za-z0-9_\-\"]+)\s*=", line)
            if m and [*table, m.group(1).strip('"')] == where[: len(table) + 1]:
                return no
            continue
        if table == where[: len(table)]:
            best = no
    return best


def _check_keys(
    ctx: _Ctx, where: list[str | int], data: Mapping[str, Any], known: Mapping[str, Any]
) -> None:
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ctx.fail([*where, key], f"unknown key{hint} (known: {', '.join(known)})")


def _values(
    ctx: _Ctx, where: list[str | int], data: Any, fields: Mapping[str, Field]
) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ctx.fail(where, f"expected a table, got {data!r}")
    _check_keys(ctx, where, data, fields)
    out: dict[str, Any] = {}
    for key, (types, default, check, expect) in fields.items():
        if key not in data:
            if default is None:
                raise ctx.fail([*where, key], f"missing; expected {expect}")
            out[key] = default
            continue
        value = data[key]
        ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
        if ok and isinstance(value, float) and not math.isfinite(value):
            raise ctx.fail([*where, key], f"got {value!r}; expected a finite number ({expect})")
        if ok and check is not None:
            try:
                ok = bool(check(value))
            except TypeError:
                ok = False
        if not ok:
            raise ctx.fail([*where, key], f"got {value!r}; expected {expect}")
        out[key] = float(value) if types == _NUM else value
    return out


def load_config(path: str | os.PathLike[str], *, check_devices: bool = True) -> Config:
    """Read and validate one configuration file; raise ConfigError (nothing else) on any fault.

    `check_devices=False` skips the check that this host can give each game its device
    (`rlsup doctor` reports on that itself, at more length).
    """
    path = Path(path).absolute()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"no configuration file at {path}: pass --config PATH, set ${CONFIG_ENV}, "
            f"or create one with `rlsup init {path}`"
        ) from None
    except PermissionError:
        raise ConfigError(
            f"{path}: permission denied: reading it takes read access to the file (and search "
            "access to its directories); the installed service's files belong to its group: "
            "ask for membership (`usermod -aG rlsup $USER`) or use sudo"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot read the configuration file: {exc.strerror or exc}"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, path, text, check_devices=check_devices)


def parse_config(
    data: dict[str, Any], path: Path, text: str = "", *, check_devices: bool = True
) -> Config:
    ctx = _Ctx(path, text)
    _check_keys(ctx, [], data, {**_TOP, **dict.fromkeys(_TABLES)})
    top = _values(ctx, [], {k: v for k, v in data.items() if k in _TOP}, _TOP)
    modes = _parse_modes(ctx, data.get("modes"))
    names = [m.name for m in modes]
    initial = top["initial_mode"] or names[0]
    if initial not in names:
        raise ctx.fail(
            ["initial_mode"], f"got {initial!r}; expected one of the modes: {', '.join(names)}"
        )
    sections = {
        name: cls(**_values(ctx, [name], data.get(name, {}), _section_fields(cls)))
        for name, cls in _SECTIONS.items()
    }
    stability = sections["stability"]
    ceiling = stability.ceiling or names[-1]
    if ceiling not in names:
        raise ctx.fail(
            ["stability", "ceiling"],
            f"got {ceiling!r}; expected one of the modes: {', '.join(names)}",
        )
    stability = dataclasses.replace(stability, ceiling=ceiling)
    state_dir = Path(os.path.expanduser(top["state_dir"]))
    if "state_dir" not in data and os.environ.get("STATE_DIRECTORY"):
        # Under systemd (StateDirectory=): the unit's directory, unless the file names one.
        state_dir = Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    if not state_dir.is_absolute():
        state_dir = path.parent / state_dir
    logs_dir: Path | None = None
    if top["logs_dir"]:
        logs_dir = Path(os.path.expanduser(top["logs_dir"]))
        logs_dir = logs_dir if logs_dir.is_absolute() else path.parent / logs_dir
    elif os.environ.get("LOGS_DIRECTORY"):  # under systemd (LogsDirectory=)
        logs_dir = Path(os.environ["LOGS_DIRECTORY"].split(":")[0])
    games = _parse_games(ctx, data.get("games"), modes, top["checkpoint_every_s"])
    mirror = _parse_mirror(ctx, data["mirror"]) if "mirror" in data else None
    cluster = ClusterConfig(**_values(ctx, ["cluster"], data.get("cluster", {}), _CLUSTER))
    spare = SpareConfig(**_values(ctx, ["spare"], data.get("spare", {}), _SPARE))
    metrics = _parse_metrics(ctx, data.get("metrics", {}), path)
    preemption = _parse_preemption(ctx, data.get("preemption", {}))
    hooks = _parse_hooks(ctx, data.get("hooks", []), games)
    if cluster.backend == "ray" and mirror is None:
        raise ctx.fail(
            ["cluster", "backend"],
            'got "ray" without a [mirror] table: on several hosts a game that moves resumes '
            'from the mirror (add [mirror] url = "s3://bucket/prefix")',
        )
    if (
        cluster.backend == "ray"
        and (i := next((i for i, g in enumerate(games) if g.command), -1)) >= 0
    ):
        raise ctx.fail(
            ["games", games[i].table, "command"],
            f"game {games[i].name!r} is a command game: command games run on the local "
            'backend only ([cluster] backend = "local"), not on several hosts',
        )
    if check_devices and cluster.backend != "ray":  # on several hosts each has its own torch
        _check_cuda_usable(ctx, games)
    return Config(
        path=path,
        state_dir=state_dir,
        initial_mode=initial,
        checkpoint_every_s=top["checkpoint_every_s"],
        stop_grace_s=top["stop_grace_s"],
        cost_per_hour=top["cost_per_hour"],
        gpu_cost_share=top["gpu_cost_share"],
        tick_s=top["tick_s"],
        logs_dir_key=logs_dir,
        modes=modes,
        games=games,
        restart=sections["restart"],
        watchdog=sections["watchdog"],
        stability=stability,
        gpu=sections["gpu"],
        mirror=mirror,
        cluster=cluster,
        spare=spare,
        metrics=metrics,
        hooks=hooks,
        preemption=preemption,
    )


def _parse_preemption(ctx: _Ctx, data: Any) -> PreemptionConfig:
    v = _values(ctx, ["preemption"], data, _PREEMPTION)
    return PreemptionConfig(**{**v, "endpoint": v["endpoint"].rstrip("/")})


def _parse_metrics(ctx: _Ctx, data: Any, path: Path) -> MetricsConfig:
    v = _values(ctx, ["metrics"], data, _METRICS)
    textfile: Path | None = None
    if v["textfile"]:
        textfile = Path(os.path.expanduser(v["textfile"]))
        textfile = textfile if textfile.is_absolute() else path.parent / textfile
    host, port = "", 0
    if isinstance(v["listen"], int):
        host, port = "127.0.0.1", v["listen"]
    elif v["listen"]:
        host, port = _listen_address(v["listen"]) or ("", 0)
    return MetricsConfig(textfile, host, port, v["interval_s"])


def _parse_hooks(ctx: _Ctx, data: Any, games: tuple[GameSpec, ...]) -> tuple[HookSpec, ...]:
    if not isinstance(data, list):
        raise ctx.fail(["hooks"], "expected [[hooks]] tables (an array of tables)")
    from supervisor.ledger.db import EVENT_KINDS  # the contract's event kinds

    names = {g.name for g in games}
    hooks: list[HookSpec] = []
    for i, table in enumerate(data):
        v = _values(ctx, ["hooks", i], table, _HOOK)
        for kind in v["on"]:
            if kind not in EVENT_KINDS and kind != "*":
                close = difflib.get_close_matches(kind, sorted(EVENT_KINDS), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ctx.fail(
                    ["hooks", i, "on"],
                    f"unknown event kind {kind!r}{hint} (`rlsup events --help` lists them; "
                    '"*" matches every kind)',
                )
        for game in v["games"]:
            if game not in names:
                raise ctx.fail(
                    ["hooks", i, "games"],
                    f"unknown game {game!r}; configured: {', '.join(sorted(names))}",
                )
        # Whether the program exists is resolve_hook_programs' question, asked by `run`,
        # `check-config` and a reload only: a read-only command never fails on a hook.
        hooks.append(
            HookSpec(
                tuple(v["on"]),
                tuple(v["command"]),
                v["timeout_s"],
                tuple(v["games"]),
                pass_env=tuple(v["pass_env"]),
            )
        )
    return tuple(hooks)


def check_for_service(cfg: Config) -> Config:
    """What only the service's own use of a configuration needs checked, once: the hooks'
    programs (resolve_hook_programs) and the mirror's endpoint and region by the S3 client's
    own rules. For `rlsup run`, `check-config`, a reload and `rlsup pull`; read-only commands
    skip it, so they never fail on it and stay fast (botocore's import alone is ~260 ms)."""
    if cfg.mirror is not None:
        ctx = _Ctx(cfg.path, _read_or_empty(cfg.path))
        _check_mirror_client_values(ctx, cfg.mirror.endpoint_url, cfg.mirror.region)
    return resolve_hook_programs(cfg)


def resolve_hook_programs(cfg: Config) -> Config:
    """The configuration with each hook's program resolved once, as the service will run it:
    an absolute path must be an executable file; a bare name is looked up on
    HOOK_PROGRAM_PATH (systemd's), never on the caller's PATH. ConfigError naming the file,
    the key and the program otherwise. For `rlsup run`, `check-config` and a reload."""
    if not cfg.hooks:
        return cfg
    ctx = _Ctx(cfg.path, _read_or_empty(cfg.path))
    hooks = []
    for i, spec in enumerate(cfg.hooks):
        program, problem = _hook_program(spec.command[0])
        if problem:
            raise ctx.fail(["hooks", i, "command"], problem)
        hooks.append(dataclasses.replace(spec, program=program))
    return dataclasses.replace(cfg, hooks=tuple(hooks))


def _hook_program(prog: str) -> tuple[str, str]:
    """(the program's absolute path, "") or ("", what is wrong with it)."""
    if not os.path.isabs(prog):
        if "/" in prog:
            return "", f"got {prog!r}: give the program's absolute path (hooks run in /)"
        found = shutil.which(prog, path=HOOK_PROGRAM_PATH)
        if found is None:
            return "", (
                f"got {prog!r}: no such program on the service's PATH ({HOOK_PROGRAM_PATH}); "
                "give its absolute path, e.g. /usr/bin/curl (a service's PATH is not your "
                "shell's)"
            )
        return found, ""
    if not os.path.exists(prog):
        return "", f"got {prog!r}: no such file"
    if not os.path.isfile(prog) or not os.access(prog, os.X_OK):
        return "", f"got {prog!r}: not executable (a file with the x bit for the service's user)"
    return prog, ""


def _parse_mirror(ctx: _Ctx, data: Any) -> MirrorConfig:
    v = _values(ctx, ["mirror"], data, _MIRROR)
    every = v.pop("every")
    return MirrorConfig(every_s=0.0 if every == "each" else float(every[:-1]), **v)


def _check_mirror_client_values(ctx: _Ctx, endpoint_url: str, region: str) -> None:
    """The S3 client's own rules (botocore's validators, the ones its client creation runs),
    at load time: a value it refuses would otherwise crash every worker that restores, the
    uploader and `rlsup pull`, each at its first use. Imported only with a [mirror] table."""
    from botocore.utils import (
        InvalidRegionError,
        is_valid_endpoint_url,
        is_valid_ipv6_endpoint_url,
        validate_region_name,
    )

    if endpoint_url and not (
        is_valid_endpoint_url(endpoint_url) or is_valid_ipv6_endpoint_url(endpoint_url)
    ):
        raise ctx.fail(
            ["mirror", "endpoint_url"],
            f"got {endpoint_url!r}: the S3 client refuses it (the host must be a DNS name of "
            "letters, digits, hyphens and dots — no underscores — or an IP address), e.g. "
            '"http://s3-server:8333"',
        )
    if region:
        try:
            validate_region_name(region)
        except InvalidRegionError:
            raise ctx.fail(
                ["mirror", "region"],
                f"got {region!r}: the S3 client refuses it (letters, digits and hyphens, "
                'e.g. "eu-west-1")',
            ) from None


MIRROR_LOCATION_KEYS = ("url", "endpoint_url", "region")


def mirror_reload_refusal(old: Config, new: Config) -> str | None:
    """Why a reload from `old` to `new` must be refused whole, or None. The mirror's location
    (the table itself, url, endpoint_url, region) changes only with a restart: running
    workers restore, fence (several hosts) and are mirrored against the location they
    started with, and a new location holds none of their checkpoints or fences, so moving it
    under them would leave no fencing and start moved games from step 0. Its tuning (every,
    bandwidth, keep, concurrency, chunk size) may change: only the uploader reads it."""
    if old.mirror is None and new.mirror is None:
        return None
    if old.mirror is None or new.mirror is None:
        key, got, kept = "mirror", "added" if old.mirror is None else "removed", "as it was"
    else:
        changed = [
            k for k in MIRROR_LOCATION_KEYS if getattr(old.mirror, k) != getattr(new.mirror, k)
        ]
        if not changed:
            return None
        key = f"mirror.{changed[0]}"
        got = repr(getattr(new.mirror, changed[0]))
        kept = repr(getattr(old.mirror, changed[0]))
    return (
        f"{new.path}: {key}: got {got} (in force: {kept}); a reload cannot move the mirror "
        "(running workers restore, fence and upload against the location they started with, "
        "and a new one holds none of their checkpoints or fences). Kept the previous "
        "configuration, all of it; restart the supervisor to apply it (systemctl restart "
        "rlsup), after copying the bucket's contents when the games should resume from them"
    )


def _parse_modes(ctx: _Ctx, data: Any) -> tuple[ModeSpec, ...]:
    if not isinstance(data, dict) or not data:
        raise ctx.fail(
            ["modes"],
            "missing; expected at least one [modes.<name>] table "
            "(num_envs, batch_size, n_steps, max_concurrent)",
        )
    return tuple(
        ModeSpec(name=name, **_values(ctx, ["modes", name], table, _MODE))
        for name, table in data.items()
    )


# Where the supervisor takes each worker flag it owns (worker_args.SUPERVISOR_FIELDS): the key an
# operator sets instead of `args`.
_SET_FROM = {
    "game": "games.env_id",
    "algo": "games.algo",
    "run_dir": "state_dir: runs/<name>",
    "num_envs": "the mode: [modes.<name>] num_envs",
    "batch_size": "the mode: [modes.<name>] batch_size",
    "total_steps": "games.total_steps",
    "seed": "games.seed",
    "device": "games.device",
    "threads": "the host's cores shared among the running games",
    "mirror_url": "[mirror] url",
    "mirror_endpoint_url": "[mirror] endpoint_url",
    "mirror_region": "[mirror] region",
    "mirror_name": "[mirror]: the game's name",
    "epoch": "the placement on several hosts: its fencing epoch",
}


def _parse_games(
    ctx: _Ctx, data: Any, modes: tuple[ModeSpec, ...], checkpoint_every_s: float
) -> tuple[GameSpec, ...]:
    """The [[games]] tables, each expanded into its runs (`seeds` x `variants`), in a fair
    order: round-robin over the tables, so that every game's first run comes before any
    game's second (the order the queue starts them under `max_concurrent`)."""
    if not isinstance(data, list) or not data:
        raise ctx.fail(["games"], "missing; expected at least one [[games]] table")
    tables: list[list[GameSpec]] = []
    for i, table in enumerate(data):
        if isinstance(table, dict) and "command" in table:
            if "variants" in table:
                raise ctx.fail(
                    ["games", i, "variants"],
                    "a command game has no args to vary: give each variant its own [[games]] "
                    "table (its own command or env)",
                )
            base = _command_game(ctx, i, table, ctx.path)
            tables.append(_expand(ctx, i, table, base, {"": ()}))
            continue
        v = _values(ctx, ["games", i], table, _GAME)
        if v["env_id"] not in KNOWN_TASKS:
            close = suggest(v["env_id"])
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ctx.fail(
                ["games", i, "env_id"],
                f"got {v['env_id']!r}: not a supported "
                f"envpool task id (Atari *-v5, CartPole-v1, Acrobot-v1, MountainCar-v0){hint}",
            )
        args = v["args"]
        _check_args(ctx, ["games", i, "args"], args)
        variants: dict[str, tuple[tuple[str, Any], ...]] = {"": tuple(sorted(args.items()))}
        if "variants" in table:
            variants = {}
            for vname, vargs in v["variants"].items():
                where: list[str | int] = ["games", i, "variants", vname]
                if not GAME_NAME_RE.fullmatch(vname) or _SEED_PART_RE.fullmatch(vname):
                    raise ctx.fail(
                        where,
                        "a variant's name must match [a-z0-9_-]{1,40} and not look like a seed "
                        "part (s<digits>): it names the runs, e.g. pong/lr3/s1",
                    )
                if not isinstance(vargs, dict):
                    raise ctx.fail(
                        where, f"got {vargs!r}; expected a table of hyper-parameters, e.g. "
                        "{ learning_rate = 3e-4 } ({} for the game's own args)",
                    )  # fmt: skip
                _check_args(ctx, where, vargs)
                variants[vname] = tuple(sorted({**args, **vargs}.items()))
            if not variants:
                raise ctx.fail(
                    ["games", i, "variants"], "an empty table: give at least one variant"
                )
        base = GameSpec(
            name=v["name"],
            env_id=v["env_id"],
            algo=v["algo"],
            total_steps=v["total_steps"],
            seed=v["seed"],
            device=v["device"],
            gpu=_gpu_choice(v["gpu"]) or None,
            table=i,
        )
        if base.gpu is not None and base.device == "cpu":
            raise ctx.fail(["games", i, "gpu"], 'set on a game with device = "cpu"')
        runs = _expand(ctx, i, table, base, variants)
        for game in runs:
            for mode in modes:
                try:
                    worker_config(game, mode, Path("/nonexistent"), checkpoint_every_s, None)
                except (worker_args.ConfigError, TypeError, ValueError) as exc:
                    raise ctx.fail(
                        ["games", i], f"{game.name}: invalid worker settings in mode "
                        f"{mode.name!r}: {exc}",
                    ) from None  # fmt: skip
        tables.append(runs)
    games = [t[k] for k in range(max(map(len, tables))) for t in tables if k < len(t)]
    names = {g.name: g for g in games}
    for game in games:
        if dups := [g.table for g in games if g.name == game.name][1:]:
            raise ctx.fail(["games", max(dups), "name"], f"duplicate game name {game.name!r}")
        parts = game.name.split("/")
        for k in range(1, len(parts)):
            other = names.get("/".join(parts[:k]))
            if other is not None:
                raise ctx.fail(
                    ["games", other.table, "name"],
                    f"{other.name!r} is also the name of the runs of another [[games]] table "
                    f"({game.name}, ...): its run directory would hold theirs; rename one",
                )
    return tuple(games)


def _check_args(ctx: _Ctx, where: list[str | int], args: Mapping[str, Any]) -> None:
    """A game's `args` (or one variant's): known hyper-parameters with valid values, none of
    them the supervisor's own."""
    for key, value in args.items():
        if key in worker_args.SUPERVISOR_FIELDS:
            raise ctx.fail(
                [*where, key],
                f"set by the supervisor for every worker (from {_SET_FROM.get(key, 'it')}), "
                "not a hyper-parameter: remove it",
            )
        if key not in worker_args.HYPERPARAMETER_FIELDS:
            close = difflib.get_close_matches(key, sorted(worker_args.HYPERPARAMETER_FIELDS), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ctx.fail(
                [*where, key],
                f"unknown hyper-parameter{hint} "
                f"(allowed: {', '.join(sorted(worker_args.HYPERPARAMETER_FIELDS))})",
            )
        try:
            worker_args.check_value(key, value)
        except worker_args.ConfigError as exc:
            raise ctx.fail([*where, key], str(exc)) from None


def _expand(
    ctx: _Ctx,
    i: int,
    table: Mapping[str, Any],
    base: GameSpec,
    variants: Mapping[str, tuple[tuple[str, Any], ...]],
) -> list[GameSpec]:
    """One [[games]] table's runs: each seed (`seeds`, else `seed`) x each variant ("" = the
    game's own args), seed-major, named GAME[/VARIANT][/sSEED]."""
    seeds: list[int] = table.get("seeds", [])
    if "seeds" in table:
        if not seeds:
            raise ctx.fail(["games", i, "seeds"], "an empty list: give at least one seed")
        if "seed" in table:
            raise ctx.fail(
                ["games", i, "seed"], "set together with `seeds`: give one of them (the runs' "
                "seeds are the list's)",
            )  # fmt: skip
        dup = next((x for k, x in enumerate(seeds) if x in seeds[:k]), None)
        if dup is not None:
            raise ctx.fail(
                ["games", i, "seeds"], f"seed {dup} appears twice in {seeds}: each seed is one run"
            )
    runs = []
    for seed in seeds or [base.seed]:
        for vname, args in variants.items():
            name = base.name + (f"/{vname}" if vname else "") + (f"/s{seed}" if seeds else "")
            runs.append(dataclasses.replace(base, name=name, seed=seed, args=args, table=i))
    return runs


def _check_cuda_usable(ctx: _Ctx, games: tuple[GameSpec, ...]) -> None:
    """`device = "cuda"` on a host with an NVIDIA driver and a CPU-only torch is a configuration
    error naming the fix, not a worker that exits 78 at every start. Costs nothing unless a game
    asks for cuda (then a read of /proc and of torch's metadata; torch is never imported).
    Without a driver the supervisor ends the game FATAL at once, naming the fix (the other
    games run: a file shared by several hosts stays loadable)."""
    wanted = [i for i, game in enumerate(games) if game.device == "cuda" and not game.command]
    if not wanted:
        return
    driver = torchbuild.driver_version()
    if driver is None:
        return
    build = torchbuild.installed_torch()
    if build.cuda is not False:
        return
    raise ctx.fail(
        ["games", games[wanted[0]].table, "device"],
        f'got "cuda", but {build.describe()} cannot use the NVIDIA driver ({driver}) of '
        f"this host: {torchbuild.cuda_install_hint(build.public_version)}. Or set "
        'device = "auto" to train on the CPU meanwhile',
    )


def check_runs_match(cfg: Config) -> None:
    """Refuse a configuration that would resume a game's run as another env id or algorithm.

    The newest checkpoint of `runs/<name>/` records what it was trained for (its manifest's
    `meta`); a changed `env_id` or `algo` under the same name is one ConfigError naming both
    values and the two ways out. Reads manifests only: verifies nothing, moves nothing.
    """
    from checkpoints import CheckpointStore  # not needed by `rlsup status`

    ctx = _Ctx(cfg.path, _read_or_empty(cfg.path))
    for game in cfg.games:
        if game.command is not None:
            continue  # its checkpoints are the script's own: nothing of ours to compare
        root = cfg.run_dir(game.name) / protocol.CHECKPOINT_DIR
        newest = CheckpointStore(root).newest_meta()
        if newest is None:
            continue
        ref, meta = newest
        for key, have, trained in (
            ("env_id", game.env_id, meta.get("game")),
            ("algo", game.algo, meta.get("algo")),
        ):
            if trained is not None and trained != have:
                raise ctx.fail(
                    ["games", game.table, key],
                    f"got {have!r}, but {root} holds a run of this game trained with "
                    f"{key} = {trained!r} (newest: {ref.path.name}); a checkpoint of one game "
                    f"or algorithm is never loaded for another. Set {key} back to {trained!r} "
                    f"to continue that run, or move {root} aside (or give the game a new name) "
                    "to start it fresh",
                )


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def worker_config(
    game: GameSpec,
    mode: ModeSpec,
    run_dir: Path,
    checkpoint_every_s: float,
    threads: int | None,
    mirror: MirrorConfig | None = None,
) -> worker_args.WorkerConfig:
    """The worker's arguments for one game in one mode (validated by the protocol); with a
    mirror, where to restore from when the run dir has no checkpoint. Built-in games only: a
    command game runs its own program (launch/spawn.py `command_env`)."""
    if game.command is not None:
        raise ValueError(f"game {game.name!r} is a command game: it has no worker arguments")
    # The mode's rollout length and the file's checkpoint interval are defaults a game's args
    # may override; what the supervisor sets below is its own (args cannot name it: refused
    # at load) and is applied last all the same.
    values: dict[str, Any] = {"n_steps": mode.n_steps, "checkpoint_every_s": checkpoint_every_s}
    values.update(game.args_dict)
    if mirror is not None:
        values.update(
            mirror_url=mirror.url,
            mirror_endpoint_url=mirror.endpoint_url or None,
            mirror_region=mirror.region or None,
            mirror_name=game.name,
        )
    values.update(
        game=game.env_id,
        algo=game.algo,
        run_dir=str(run_dir),
        num_envs=mode.num_envs,
        batch_size=game.mode_batch(mode),
        total_steps=game.total_steps,
        seed=game.seed,
        device=game.device,
        threads=threads,
    )
    return worker_args.validate(worker_args.WorkerConfig(**values))
