"""The TOML configuration (ARCHITECTURE.md section 8) read and validated into `Config`: the
top-level keys, the modes and the built-in sections here; each wing's table by its own module.

Every problem becomes one `ConfigError` whose message names the file, the line (when it can
be found) and the key, the value found and what was expected.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any

from supervisor.config.cluster import parse_cluster, parse_spare
from supervisor.config.fields import (
    NUMBER,
    ConfigError,
    ConfigSource,
    Field,
    check_keys,
    non_negative,
    positive,
    read_table,
)
from supervisor.config.games import check_cuda_usable
from supervisor.config.hooks import parse_hooks
from supervisor.config.location import CONFIG_ENV
from supervisor.config.matrix import parse_games
from supervisor.config.metrics import parse_metrics
from supervisor.config.mirror import parse_mirror
from supervisor.config.model import (
    Config,
    GpuConfig,
    ModeSpec,
    RestartConfig,
    StabilityConfig,
    WatchdogConfig,
)
from supervisor.config.preemption import parse_preemption
from supervisor.config.tracking import parse_tracking

_TOP: dict[str, Field] = {
    "state_dir": ((str,), "var/rlsup", None, "a path (string)"),
    "initial_mode": ((str,), "", None, "the name of a [modes.*] table"),
    # training.protocol.DEFAULT_CHECKPOINT_EVERY_S, not imported: `rlsup status` loads this file
    # and stays off the worker contract (tests/supervisor/config/test_config.py: the same).
    "checkpoint_every_s": (NUMBER, 15.0, positive, "seconds > 0"),
    # On a host that fails often, checkpoints come sooner than checkpoint_every_s: Young's rule
    # on the ledger's MTBF and each checkpoint's measured cost (training/protocol.py).
    "adaptive_checkpoints": ((bool,), True, None, "true or false"),
    "stop_grace_s": (NUMBER, 60.0, positive, "seconds > 0"),
    "cost_per_hour": (NUMBER, 0.0, non_negative, "a number >= 0"),
    "gpu_cost_share": (
        NUMBER,
        0.0,
        lambda v: 0 <= v <= 1,
        "a fraction in 0..1: the part of cost_per_hour that is the GPUs' (shared per GPU "
        "among the games placed on it)",
    ),
    # The loop's longest sleep: stop requests, mode changes and hang kills wait up to a tick
    # (above a minute they would lag visibly); below 10 ms it would spin a core for nothing.
    "tick_s": (NUMBER, 1.0, lambda v: 0.01 <= v <= 60, "seconds in 0.01..60"),
    "logs_dir": ((str,), "", None, "a path (string)"),
}
_TABLES = (
    "modes", "games", "restart", "watchdog", "stability", "gpu", "mirror", "cluster", "spare",
    "metrics", "hooks", "preemption", "tracking",
)  # fmt: skip
_MODE: dict[str, Field] = {
    "num_envs": ((int,), None, positive, "a positive integer"),
    "batch_size": (
        (int, str),
        None,
        lambda v: v == "auto" or (isinstance(v, int) and v > 0),
        'a positive integer or "auto"',
    ),
    "n_steps": ((int,), 128, positive, "a positive integer"),
    "max_concurrent": ((int,), None, positive, "a positive integer"),
}


def _section_fields(cls: type) -> dict[str, Field]:
    out: dict[str, Field] = {}
    for f in dataclasses.fields(cls):
        if isinstance(f.default, str):
            out[f.name] = ((str,), f.default, None, "a mode name")
        elif isinstance(f.default, int) and not isinstance(f.default, bool):
            out[f.name] = ((int,), f.default, non_negative, "an integer >= 0")
        else:
            out[f.name] = (NUMBER, f.default, positive, "a number > 0")
    return out


_SECTIONS: dict[str, type] = {
    "restart": RestartConfig,
    "watchdog": WatchdogConfig,
    "stability": StabilityConfig,
    "gpu": GpuConfig,
}


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
    ctx = ConfigSource(path, text)
    check_keys(ctx, [], data, {**_TOP, **dict.fromkeys(_TABLES)})
    top = read_table(ctx, [], {k: v for k, v in data.items() if k in _TOP}, _TOP)
    modes = _parse_modes(ctx, data.get("modes"))
    names = [m.name for m in modes]
    initial = top["initial_mode"] or names[0]
    if initial not in names:
        raise ctx.fail(
            ["initial_mode"], f"got {initial!r}; expected one of the modes: {', '.join(names)}"
        )
    sections = {
        name: cls(**read_table(ctx, [name], data.get(name, {}), _section_fields(cls)))
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
    games = parse_games(ctx, data.get("games"), modes, top["checkpoint_every_s"])
    mirror = parse_mirror(ctx, data["mirror"]) if "mirror" in data else None
    cluster = parse_cluster(ctx, data.get("cluster", {}))
    spare = parse_spare(ctx, data.get("spare", {}))
    metrics = parse_metrics(ctx, data.get("metrics", {}), path)
    preemption = parse_preemption(ctx, data.get("preemption", {}))
    tracking = parse_tracking(ctx, data.get("tracking", {}), state_dir)
    hooks = parse_hooks(ctx, data.get("hooks", []), {g.name for g in games})
    if cluster.backend == "ray" and mirror is None:
        raise ctx.fail(
            ["cluster", "backend"],
            'got "ray" without a [mirror] table: on several hosts a game that moves resumes '
            'from the mirror (add [mirror] url = "s3://bucket/prefix")',
        )
    if check_devices and cluster.backend != "ray":  # on several hosts each has its own torch
        check_cuda_usable(ctx, games)
    return Config(
        path=path,
        state_dir=state_dir,
        initial_mode=initial,
        checkpoint_every_s=top["checkpoint_every_s"],
        adaptive_checkpoints=top["adaptive_checkpoints"],
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
        tracking=tracking,
    )


def _parse_modes(ctx: ConfigSource, data: Any) -> tuple[ModeSpec, ...]:
    if not isinstance(data, dict) or not data:
        raise ctx.fail(
            ["modes"],
            "missing; expected at least one [modes.<name>] table "
            "(num_envs, batch_size, n_steps, max_concurrent)",
        )
    return tuple(
        ModeSpec(name=name, **read_table(ctx, ["modes", name], table, _MODE))
        for name, table in data.items()
    )
