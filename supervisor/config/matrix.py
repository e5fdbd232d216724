"""The [[games]] tables as runs: each table expanded into its matrix (`seeds` x `variants`),
each run checked against every mode with the worker's own validation, in a fair order, under
names that never collide (a run's directory never holds another's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisor.config.fields import ConfigSource
from supervisor.config.games import Variants, builtin_game, command_game
from supervisor.config.model import GameSpec, ModeSpec
from supervisor.config.recipe import worker_config
from supervisor.config.sweep import expand_trials, extremes, parse_sweep, refuse_variants
from training import args as worker_args


def parse_games(
    ctx: ConfigSource, data: Any, modes: tuple[ModeSpec, ...], checkpoint_every_s: float
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
            base = command_game(ctx, i, table, ctx.path)
            if "sweep" in table:
                tables.append(sweep_runs(ctx, i, table, base))
            else:
                tables.append(expand(ctx, i, table, base, {"": ()}))
            continue
        if isinstance(table, dict) and "sweep" in table:
            refuse_variants(ctx, i, table)
            base, variants = builtin_game(ctx, i, table)
            runs = sweep_runs(ctx, i, table, dataclasses.replace(base, args=variants[""]))
            assert runs[0].sweep is not None
            check_sweep_values(ctx, i, runs[0], modes, checkpoint_every_s)
            tables.append(runs)
            continue
        base, variants = builtin_game(ctx, i, table)
        runs = expand(ctx, i, table, base, variants)
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


def check_sweep_values(
    ctx: ConfigSource, i: int, game: GameSpec, modes: tuple[ModeSpec, ...], every_s: float
) -> None:
    """Each searched value at its ends, the others at their first: the worker's own validation
    in every mode, as a variant's args are checked, naming the parameter."""
    assert game.sweep is not None
    for name, values in extremes(game.sweep):
        run = dataclasses.replace(game, args=tuple(sorted({**game.args_dict, **values}.items())))
        for mode in modes:
            try:
                worker_config(run, mode, Path("/nonexistent"), every_s, None)
            except (worker_args.ConfigError, TypeError, ValueError) as exc:
                raise ctx.fail(
                    ["games", i, "sweep", "params", name], f"{values[name]!r}: refused by the "
                    f"worker in mode {mode.name!r} (with {values}): {exc}",
                ) from None  # fmt: skip


def sweep_runs(
    ctx: ConfigSource, i: int, table: Mapping[str, Any], base: GameSpec
) -> list[GameSpec]:
    """A sweep's runs: its trials x `seeds` (docs/sweeps.md)."""
    seeds = check_seeds(ctx, i, table)
    return expand_trials(parse_sweep(ctx, i, table, base, seeds), base, i)


def check_seeds(ctx: ConfigSource, i: int, table: Mapping[str, Any]) -> list[int]:
    """`seeds` as given (checked: not empty, not with `seed`, no seed twice); [] without."""
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
    return seeds


def expand(
    ctx: ConfigSource,
    i: int,
    table: Mapping[str, Any],
    base: GameSpec,
    variants: Variants,
) -> list[GameSpec]:
    """One [[games]] table's runs: each seed (`seeds`, else `seed`) x each variant ("" = the
    game's own args), seed-major, named GAME[/VARIANT][/sSEED]."""
    seeds = check_seeds(ctx, i, table)
    runs = []
    for seed in seeds or [base.seed]:
        for vname, args in variants.items():
            name = base.name + (f"/{vname}" if vname else "") + (f"/s{seed}" if seeds else "")
            runs.append(dataclasses.replace(base, name=name, seed=seed, args=args, table=i))
    return runs
