"""A run's effective hyper-parameters (`rlsup results`, the dashboard, the trackers).

- a game of rlsup's own worker: the worker's arguments as it resolved them, from the newest
  committed checkpoint's config.json (what the run trained with last; a matrix variant's
  overrides and the mode's sizes included), else, for a run with no checkpoint yet, the launch
  recipe (supervisor/config/recipe.py) in the file's initial mode;
- a command game: the `params` its [[games]] table declares (what its program got as
  RLSUP_PARAMS);
- a sweep's trial run: the values its study drew for the trial (trial.json) over either.

The run's plumbing (its directory, thread budget, mirror, placement epoch) is no
hyper-parameter and is left out. Read from the state dir alone; the checkpoint's config.json
is another process's file: only its known keys with scalar values are taken. Stdlib only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.run_files import CHECKPOINT_DIR, TRIAL_FILE, read_json_file

if TYPE_CHECKING:
    from supervisor.config import Config

Param = str | int | float | bool | None
CONFIG_FILE = "config.json"  # training/checkpointing.py's, inside each checkpoint
# The worker's arguments that say where and how a run is kept, not how it learns.
PLUMBING = frozenset(
    {
        "run_dir",
        "threads",
        "mirror_url",
        "mirror_endpoint_url",
        "mirror_region",
        "mirror_name",
        "epoch",
    }
)
CHECKPOINTS_TRIED = 3  # the newest few: one being removed by retention as it is read


def run_params(cfg: Config, game: str) -> dict[str, Param]:
    """The effective hyper-parameters of the configured run `game` (KeyError: no such run),
    sorted by name."""
    spec = cfg.game(game)
    drawn = _trial_params(cfg.run_dir(game)) if spec.sweep is not None else {}
    if spec.command is not None:
        return {k: _scalar(v) for k, v in sorted({**dict(spec.params), **drawn}.items())}
    from training import args as worker_args

    resolved = _from_checkpoint(cfg.run_dir(game), worker_args.WORKER_FIELDS)
    if resolved is None:
        import dataclasses

        from supervisor.config import worker_config

        args = tuple(sorted({**spec.args_dict, **drawn}.items()))
        wcfg = worker_config(
            dataclasses.replace(spec, args=args), cfg.mode(cfg.initial_mode), cfg.run_dir(game),
            cfg.checkpoint_every_s, None,
        )  # fmt: skip
        resolved = wcfg.to_json()
    return {k: _scalar(v) for k, v in sorted(resolved.items()) if k not in PLUMBING}


def _trial_params(run_dir: Path) -> dict[str, Any]:
    """A sweep's trial run: the values its study drew (trial.json), {} before its first start."""
    doc = read_json_file(run_dir / TRIAL_FILE)
    params = doc.get("params") if isinstance(doc, dict) else None
    return dict(params) if isinstance(params, dict) else {}


def _from_checkpoint(run_dir: Path, known: frozenset[str]) -> dict[str, Any] | None:
    """The worker arguments in the newest committed checkpoint that holds a readable
    config.json (its known keys only), or None."""
    from checkpoints.names import ckpt_step

    root = run_dir / CHECKPOINT_DIR
    try:
        found = sorted(
            ((s, e) for e in root.iterdir() if (s := ckpt_step(e.name)) is not None),
            reverse=True,
        )
    except OSError:
        return None
    for _, entry in found[:CHECKPOINTS_TRIED]:
        data = read_json_file(entry / CONFIG_FILE)
        if data is not None and data.keys() & known:
            return {k: v for k, v in data.items() if k in known}
    return None


def _scalar(value: Any) -> Param:
    """A parameter as a table shows it: a scalar as it is, anything else (a list another
    writer put there, a non-finite number) as its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def differing(rows: list[dict[str, Param]]) -> list[str]:
    """The keys with more than one value among the rows that have them, in order of first
    appearance: what a table of several runs shows (a key of one kind of game only, the same
    in each of its rows, says nothing of the rows' differences)."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return [k for k in keys if len({repr(row[k]) for row in rows if k in row}) > 1]


def common(rows: list[dict[str, Param]]) -> dict[str, Param]:
    """The parameters every row has with the same value (a group's, over its seeds)."""
    if not rows:
        return {}
    first = rows[0]
    return {
        k: v
        for k, v in first.items()
        if all(k in row and repr(row[k]) == repr(v) for row in rows[1:])
    }
