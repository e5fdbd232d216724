"""What only the service's own use of a configuration checks: the hooks' programs, the mirror's
endpoint and region by the S3 client's rules, a reload that would move the mirror, and runs
resumed as another game. `rlsup run`, `check-config`, a reload and `rlsup pull` ask; read-only
commands (`rlsup status`) never load this module, so they never fail on it and stay fast."""

from __future__ import annotations

import dataclasses
import os
import shutil

from supervisor.config.fields import ConfigSource, read_or_empty
from supervisor.config.hooks import HOOK_PROGRAM_PATH
from supervisor.config.mirror import MIRROR_LOCATION_KEYS
from supervisor.config.model import Config
from training import protocol


def check_for_service(cfg: Config) -> Config:
    """What only the service's own use of a configuration needs checked, once: the hooks'
    programs (resolve_hook_programs) and the mirror's endpoint and region by the S3 client's
    own rules. For `rlsup run`, `check-config`, a reload and `rlsup pull`; read-only commands
    skip it, so they never fail on it and stay fast (botocore's import alone is ~260 ms)."""
    if cfg.mirror is not None:
        ctx = ConfigSource(cfg.path, read_or_empty(cfg.path))
        _check_mirror_client_values(ctx, cfg.mirror.endpoint_url, cfg.mirror.region)
    return resolve_hook_programs(cfg)


def resolve_hook_programs(cfg: Config) -> Config:
    """The configuration with each hook's program resolved once, as the service will run it:
    an absolute path must be an executable file; a bare name is looked up on
    HOOK_PROGRAM_PATH (systemd's), never on the caller's PATH. ConfigError naming the file,
    the key and the program otherwise. For `rlsup run`, `check-config` and a reload."""
    if not cfg.hooks:
        return cfg
    ctx = ConfigSource(cfg.path, read_or_empty(cfg.path))
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


def _check_mirror_client_values(ctx: ConfigSource, endpoint_url: str, region: str) -> None:
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


def check_runs_match(cfg: Config) -> None:
    """Refuse a configuration that would resume a game's run as another env id or algorithm.

    The newest checkpoint of `runs/<name>/` records what it was trained for (its manifest's
    `meta`); a changed `env_id` or `algo` under the same name is one ConfigError naming both
    values and the two ways out. Reads manifests only: verifies nothing, moves nothing.
    """
    from checkpoints import CheckpointStore  # not needed by `rlsup status`

    ctx = ConfigSource(cfg.path, read_or_empty(cfg.path))
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
