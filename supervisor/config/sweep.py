"""A sweep: a [[games]] table with a `[games.sweep]` search space, expanded into its trials'
runs (docs/sweeps.md).

    [games.sweep]
    trials = 12
    metric = "eval"            # the trials' periodic and final evaluations
    direction = "maximize"
    sampler = "tpe"            # tpe | random | grid
    pruner = "median"          # median | halving | none
    params = { learning_rate = { low = 1e-4, high = 3e-3, log = true }, n_steps = [64, 128] }

Each trial is `seeds` runs named GAME/tNNN/sSEED (GAME/tNNN without `seeds`): games like any
other (checkpoints, restarts, the modes, the spare, the mirror) whose parameters the study
draws when the trial's first run starts (supervisor/sweep/). Everything here is checked at load,
naming the file, line and key; the drawn values reach a built-in learner as its `args` (each
range's ends checked by the worker's own validation in every mode) and a command game as
`RLSUP_PARAMS` / `run.params`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from supervisor.config.fields import ConfigSource, Field, read_table
from supervisor.config.model import GameSpec
from supervisor.config.sweep_spec import ParamSpace, Scalar, SweepSpec
from training import args as worker_args

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "halving", "none")
DIRECTIONS = ("maximize", "minimize")
METRICS = ("eval",)
MAX_TRIALS = 10_000
_PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def _not_empty(v: Any) -> bool:
    return len(v) > 0


SWEEP_FIELDS: dict[str, Field] = {
    "trials": (
        (int,),
        None,
        lambda v: 0 < v <= MAX_TRIALS,
        f"a number of trials, 1 to {MAX_TRIALS}",
    ),
    "metric": ((str,), "eval", lambda v: v in METRICS, " | ".join(METRICS)),
    "direction": ((str,), "maximize", lambda v: v in DIRECTIONS, " | ".join(DIRECTIONS)),
    "sampler": ((str,), "tpe", lambda v: v in SAMPLERS, " | ".join(SAMPLERS)),
    "pruner": ((str,), "median", lambda v: v in PRUNERS, " | ".join(PRUNERS)),
    "min_trials": (
        (int,),
        4,
        lambda v: v >= 0,
        "an integer >= 0: completed trials before the pruner prunes any",
    ),
    "seed": ((int,), 0, lambda v: 0 <= v < 2**32, "an integer >= 0 (the sampler's seed)"),
    "params": ((dict,), None, _not_empty, "a table of parameters to search, NAME = a range "
               "{ low, high[, log][, step] } or a list of values"),
}  # fmt: skip


def parse_sweep(
    ctx: ConfigSource, i: int, table: Mapping[str, Any], base: GameSpec, seeds: list[int]
) -> SweepSpec:
    """`[games.sweep]` of the i-th [[games]] table (`base`: the game as the table names it)."""
    where: list[str | int] = ["games", i, "sweep"]
    refuse_variants(ctx, i, table)
    v = read_table(ctx, where, table["sweep"], SWEEP_FIELDS)
    kind = base.kind
    space = tuple(
        _param(ctx, [*where, "params", name], name, raw, base) for name, raw in v["params"].items()
    )
    spec = SweepSpec(
        name=base.name,
        trials=v["trials"],
        metric=v["metric"],
        direction=v["direction"],
        sampler=v["sampler"],
        pruner=v["pruner"],
        min_trials=v["min_trials"],
        seed=v["seed"],
        space=space,
        seeds=tuple(seeds),
        kind=kind,
    )
    if spec.sampler == "grid":
        size = 1
        for p in space:
            points = p.grid()
            if points is None:
                raise ctx.fail(
                    [*where, "params", p.name],
                    'sampler = "grid" needs points: give a list of values, an integer range, '
                    "or a `step`",
                )
            size *= len(points)
        if spec.trials > size:
            raise ctx.fail(
                [*where, "trials"],
                f"got {spec.trials}; the grid has {size} points: at most {size} trials",
            )
    if kind == "builtin":
        args = base.args_dict
        if spec.pruner != "none" and args.get("eval_every_steps") is None:
            raise ctx.fail(
                [*where, "pruner"],
                f"pruner = {spec.pruner!r} stops trials on their periodic evaluations: set "
                '`args.eval_every_steps` on the game (or pruner = "none")',
            )
        if args.get("eval_episodes", 1) == 0:
            raise ctx.fail(
                ["games", i, "args", "eval_episodes"],
                'set to 0: a sweep with metric = "eval" ranks its trials by their evaluations',
            )
    return spec


def refuse_variants(ctx: ConfigSource, i: int, table: Mapping[str, Any]) -> None:
    if "variants" in table:
        raise ctx.fail(
            ["games", i, "variants"],
            "a sweep draws its trials' values itself: a table has either `variants` or "
            "[games.sweep], not both",
        )


def _param(
    ctx: ConfigSource, where: list[str | int], name: str, raw: Any, base: GameSpec
) -> ParamSpace:
    if base.kind == "builtin":
        if name in worker_args.SUPERVISOR_FIELDS:
            raise ctx.fail(
                where,
                "set by the supervisor for every worker, not a hyper-parameter: a sweep cannot "
                "search it",
            )
        if name not in worker_args.HYPERPARAMETER_FIELDS:
            import difflib

            close = difflib.get_close_matches(name, sorted(worker_args.HYPERPARAMETER_FIELDS), 3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ctx.fail(where, f"unknown hyper-parameter{hint}")
    elif _PARAM_NAME_RE.fullmatch(name) is None:
        raise ctx.fail(where, "a parameter's name must match [A-Za-z_][A-Za-z0-9_.-]{0,63}")
    if isinstance(raw, list):
        space = _choices(ctx, where, name, raw)
    elif isinstance(raw, dict):
        space = _range(ctx, where, name, raw)
    else:
        raise ctx.fail(
            where,
            f"got {raw!r}; expected a range {{ low = ..., high = ... }} or a list of values",
        )
    if base.kind == "builtin":
        for value in space.ends():
            try:
                worker_args.check_value(name, value)
            except worker_args.ConfigError as exc:
                raise ctx.fail(where, f"{value!r}: {exc}") from None
    return space


def _choices(ctx: ConfigSource, where: list[str | int], name: str, raw: list[Any]) -> ParamSpace:
    if not raw:
        raise ctx.fail(where, "an empty list: give at least one value")
    for value in raw:
        ok = isinstance(value, str | bool | int | float)
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            raise ctx.fail(where, f"got {value!r}; expected numbers, strings or booleans")
    if len({json.dumps(x) for x in raw}) != len(raw):
        raise ctx.fail(where, f"{raw}: a value appears twice")
    return ParamSpace(name, choices=tuple(raw))


def _range(ctx: ConfigSource, where: list[str | int], name: str, raw: dict[str, Any]) -> ParamSpace:
    known = {"low", "high", "log", "step"}
    for key in raw:
        if key not in known:
            raise ctx.fail([*where, key], f"unknown key (known: {', '.join(sorted(known))})")
    for key in ("low", "high"):
        value = raw.get(key)
        if value is None:
            raise ctx.fail([*where, key], "missing; a range needs low and high")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ctx.fail([*where, key], f"got {value!r}; expected a number")
        if not math.isfinite(value):
            raise ctx.fail([*where, key], f"got {value!r}; expected a finite number")
    low, high = raw["low"], raw["high"]
    if not low < high:
        raise ctx.fail(where, f"low {low!r} is not below high {high!r}: an empty range")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise ctx.fail([*where, "log"], f"got {log!r}; expected true or false")
    if log and low <= 0:
        raise ctx.fail([*where, "low"], f"got {low!r}: a log range needs low > 0")
    step = raw.get("step")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int | float) or not step > 0:
            raise ctx.fail([*where, "step"], f"got {step!r}; expected a number > 0")
        if log:
            raise ctx.fail([*where, "step"], "set with log = true: give one of them")
    return ParamSpace(name, low=low, high=high, log=log, step=step)


def expand_trials(spec: SweepSpec, base: GameSpec, i: int) -> list[GameSpec]:
    """The sweep's runs, trial-major (each trial's seeds together: its value needs them all)."""
    runs = []
    for trial in range(spec.trials):
        for name, seed in zip(spec.runs_of(trial), spec.seeds or (base.seed,), strict=True):
            runs.append(
                dataclasses.replace(base, name=name, seed=seed, table=i, sweep=spec, trial=trial)
            )
    return runs


def extremes(spec: SweepSpec) -> list[tuple[str, dict[str, Scalar]]]:
    """Assignments that put each parameter at each of its ends (the others at their first),
    each with the parameter it tries: what the worker's validation checks at load in every
    mode."""
    first = {p.name: p.ends()[0] for p in spec.space}
    out: list[tuple[str, dict[str, Scalar]]] = []
    for p in spec.space:
        out.extend((p.name, {**first, p.name: v}) for v in p.ends())
    return out


def sweep_reload_refusal(old_cfg: Any, new_cfg: Any) -> str | None:
    """Why a reload may not apply (a sweep whose search changed: its study holds trials drawn
    from the old one; its trials or pruner: taken at the next start), else None. A sweep added
    or removed is fine."""
    before = {g.sweep.name: g.sweep for g in old_cfg.games if g.sweep is not None}
    new: Iterable[GameSpec] = new_cfg.games
    for g in new:
        s = g.sweep
        if s is None or s.name not in before or before[s.name] == s:
            continue
        if before[s.name].definition() != s.definition():
            return (
                f"sweep {s.name!r} changed ({_changed(before[s.name], s)}): its study holds "
                "trials drawn from the old search; a changed search is a new sweep: give it a "
                "new name"
            )
        return (
            f"sweep {s.name!r}: {_changed(before[s.name], s)} changed; a running sweep takes "
            "that at its next start (restart the service), not on a reload"
        )
    return None


def _changed(a: SweepSpec, b: SweepSpec) -> str:
    keys = [
        f.name for f in dataclasses.fields(SweepSpec) if getattr(a, f.name) != getattr(b, f.name)
    ]
    return ", ".join(keys)


__all__ = [
    "ParamSpace",
    "SweepSpec",
    "expand_trials",
    "extremes",
    "parse_sweep",
    "refuse_variants",
    "sweep_reload_refusal",
]
