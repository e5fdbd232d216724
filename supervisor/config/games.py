"""One [[games]] table: a game of rlsup's own worker (an envpool task, an algorithm, its
hyper-parameters and their variants, checked by the worker's own validation) or a command game
(the user's own program, docs/own-trainer.md). How tables become runs is matrix.py's."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisor.config.fields import ConfigSource, Field, non_negative, positive, read_table
from supervisor.config.model import GAME_NAME_RE, KNOBS, SEED_PART_RE, GameSpec
from training import args as worker_args
from training.tasks import KNOWN_TASKS, suggest

# Variants of a game's args: name -> the run's args (sorted pairs); "" = the game's own args.
Variants = dict[str, tuple[tuple[str, Any], ...]]

GAME_FIELDS: dict[str, Field] = {
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
    "total_steps": ((int,), None, positive, "a positive integer"),
    "seed": ((int,), 1, lambda v: 0 <= v < 2**63, "an integer >= 0"),
    "device": ((str,), "auto", lambda v: v in worker_args.DEVICES, " | ".join(worker_args.DEVICES)),
    "args": ((dict,), {}, None, "a table of worker hyper-parameters"),
    "gpu": (
        (str, int, list),
        "auto",
        lambda v: gpu_choice(v) is not None,
        '"auto", a GPU index >= 0 among the visible GPUs, or a list of distinct ones',
    ),
    "seeds": (
        (list,),
        [],
        lambda v: all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**63 for x in v),
        "a list of seeds (integers >= 0): one run per seed, named GAME/sSEED",
    ),
    "variants": ((dict,), {}, None, "a table of named argument variants: NAME = { key = value }"),
    "sweep": ((dict,), {}, None, "a search (docs/sweeps.md): [games.sweep] trials, params, ..."),
}

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# A command game's `params` (RLSUP_PARAMS, `run.params`): scalars under plain names.
_PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
MAX_PARAM_TEXT = 1000
# Variables a command game's `env` may not set: the supervisor sets them for every game.
_OWNED_ENV = ("CUDA_VISIBLE_DEVICES", "NOTIFY_SOCKET", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

COMMAND_GAME_FIELDS: dict[str, Field] = {
    "name": GAME_FIELDS["name"],
    "command": (
        (list,),
        None,
        lambda v: bool(v) and all(isinstance(a, str) and a and "\0" not in a for a in v),
        "a non-empty list of strings: the program and its arguments",
    ),
    "cwd": ((str,), "", lambda v: "\0" not in v, "a directory (relative to this file)"),
    "env": ((dict,), {}, None, "a table of environment variables"),
    "params": (
        (dict,),
        {},
        None,
        "a table of hyper-parameters, NAME = a number, a string or a boolean",
    ),
    "heartbeat": ((bool,), False, None, "true (it heartbeats through the SDK) or false"),
    "knobs": (
        (list,),
        [],
        lambda v: all(k in KNOBS for k in v) and len(set(v)) == len(v),
        f"a list of distinct knobs it honours among {', '.join(KNOBS)}",
    ),
    "total_steps": ((int,), 0, non_negative, "an integer >= 0 (0: not known)"),
    "seed": GAME_FIELDS["seed"],
    "device": GAME_FIELDS["device"],
    "gpu": GAME_FIELDS["gpu"],
    "seeds": GAME_FIELDS["seeds"],
    "sweep": GAME_FIELDS["sweep"],
}

# Where the supervisor takes each worker flag it owns (worker_args.SUPERVISOR_FIELDS): the key an
# operator sets instead of `args`.
SET_FROM = {
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
    "host_mtbf_s": "the ledger's MTBF (adaptive_checkpoints = false: none)",
}


def builtin_game(ctx: ConfigSource, i: int, table: Any) -> tuple[GameSpec, Variants]:
    """A [[games]] table of rlsup's own worker: the game as the table names it and its
    variants ({"": its own args} without `variants`)."""
    if isinstance(table, dict) and "params" in table:
        raise ctx.fail(
            ["games", i, "params"],
            "a game of rlsup's own worker takes its hyper-parameters in `args` (checked by the "
            "worker's validation); `params` is for a command game's own program",
        )
    v = read_table(ctx, ["games", i], table, GAME_FIELDS)
    if v["env_id"] not in KNOWN_TASKS:
        close = suggest(v["env_id"])
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ctx.fail(
            ["games", i, "env_id"],
            f"got {v['env_id']!r}: not a supported "
            f"envpool task id (Atari *-v5, CartPole-v1, Acrobot-v1, MountainCar-v0){hint}",
        )
    args = v["args"]
    check_args(ctx, ["games", i, "args"], args)
    variants: Variants = {"": tuple(sorted(args.items()))}
    if "variants" in table:
        variants = {}
        for vname, vargs in v["variants"].items():
            where: list[str | int] = ["games", i, "variants", vname]
            if not GAME_NAME_RE.fullmatch(vname) or SEED_PART_RE.fullmatch(vname):
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
            check_args(ctx, where, vargs)
            variants[vname] = tuple(sorted({**args, **vargs}.items()))
        if not variants:
            raise ctx.fail(["games", i, "variants"], "an empty table: give at least one variant")
    base = GameSpec(
        name=v["name"],
        env_id=v["env_id"],
        algo=v["algo"],
        total_steps=v["total_steps"],
        seed=v["seed"],
        device=v["device"],
        gpu=gpu_choice(v["gpu"]) or None,
        table=i,
    )
    if base.gpu is not None and base.device == "cpu":
        raise ctx.fail(["games", i, "gpu"], 'set on a game with device = "cpu"')
    return base, variants


def check_args(ctx: ConfigSource, where: list[str | int], args: Mapping[str, Any]) -> None:
    """A game's `args` (or one variant's): known hyper-parameters with valid values, none of
    them the supervisor's own."""
    for key, value in args.items():
        if key in worker_args.SUPERVISOR_FIELDS:
            raise ctx.fail(
                [*where, key],
                f"set by the supervisor for every worker (from {SET_FROM.get(key, 'it')}), "
                "not a hyper-parameter: remove it",
            )
        if key not in worker_args.HYPERPARAMETER_FIELDS:
            import difflib  # a misspelt key's message only

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


def command_game(ctx: ConfigSource, i: int, table: Any, path: Path) -> GameSpec:
    """A `[[games]]` table with `command`: the user's own program (docs/own-trainer.md)."""
    for key in ("env_id", "algo", "args"):
        if isinstance(table, dict) and key in table:
            raise ctx.fail(
                ["games", i, key],
                "a game with `command` runs your own program: it has no env_id, algo or args "
                "(those are rlsup's own worker's); remove it, or the command",
            )
    v = read_table(ctx, ["games", i], table, COMMAND_GAME_FIELDS)
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
    params = check_params(ctx, ["games", i, "params"], v["params"])
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
        gpu=gpu_choice(v["gpu"]) or None,
        command=tuple(v["command"]),
        cwd=cwd,
        env=tuple(sorted(env.items())),
        params=params,
        heartbeat=v["heartbeat"],
        knobs=tuple(v["knobs"]),
        table=i,
    )
    if game.gpu is not None and game.device == "cpu":
        raise ctx.fail(["games", i, "gpu"], 'set on a game with device = "cpu"')
    return game


def check_params(
    ctx: ConfigSource, where: list[str | int], params: Mapping[str, Any]
) -> tuple[tuple[str, Any], ...]:
    """A command game's `params`: plain names, each set to a scalar (a finite number, a string,
    a boolean), as the program gets them (RLSUP_PARAMS, JSON). Anything else (a table, a list,
    a date, inf) is refused naming the key and the value."""
    for key, value in params.items():
        if _PARAM_NAME_RE.fullmatch(key) is None:
            raise ctx.fail(
                [*where, key],
                f"got the name {key!r}; a parameter's name is 1-64 characters "
                "[A-Za-z0-9_.-], starting with a letter or _",
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ctx.fail([*where, key], f"got {value!r}; expected a finite number")
        if isinstance(value, str) and ("\0" in value or len(value) > MAX_PARAM_TEXT):
            raise ctx.fail(
                [*where, key],
                f"got a string of {len(value)} characters; expected at most {MAX_PARAM_TEXT}, "
                "without NUL",
            )
        if not isinstance(value, bool | int | float | str):
            kind = "a table" if isinstance(value, dict) else type(value).__name__
            raise ctx.fail(
                [*where, key],
                f"got {value!r} ({kind}); expected a number, a string or a boolean (params are "
                "scalars; the program gets them as RLSUP_PARAMS, JSON)",
            )
    return tuple(sorted(params.items()))


def gpu_choice(value: Any) -> tuple[int, ...] | None:
    """`games.gpu` as GameSpec holds it: () for "auto" (None there), the indices otherwise;
    None when invalid."""
    if value == "auto":
        return ()
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, list) or not items:
        return None
    ok = all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items)
    return tuple(items) if ok and len(set(items)) == len(items) else None


def check_cuda_usable(ctx: ConfigSource, games: tuple[GameSpec, ...]) -> None:
    """`device = "cuda"` on a host with an NVIDIA driver and a CPU-only torch is a configuration
    error naming the fix, not a worker that exits 78 at every start. Costs nothing unless a game
    asks for cuda (then a read of /proc and of torch's metadata; torch is never imported).
    Without a driver the supervisor ends the game FATAL at once, naming the fix (the other
    games run: a file shared by several hosts stays loadable)."""
    wanted = [i for i, game in enumerate(games) if game.device == "cuda" and not game.command]
    if not wanted:
        return
    from training import torchbuild  # only with a cuda game: not loaded for the rest

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
