"""The launch recipe: a built-in game's worker arguments in one mode (training.args'
`WorkerConfig`). The parser builds one per game and mode to validate the file; the launcher
builds the one it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.config.mirror import MirrorConfig
from supervisor.config.model import GameSpec, ModeSpec
from training import args as worker_args


def worker_config(
    game: GameSpec,
    mode: ModeSpec,
    run_dir: Path,
    checkpoint_every_s: float,
    threads: int | None,
    mirror: MirrorConfig | None = None,
    host_mtbf_s: float | None = None,
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
        host_mtbf_s=host_mtbf_s,
    )
    return worker_args.validate(worker_args.WorkerConfig(**values))
