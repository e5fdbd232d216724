"""`rlsup pull --game G`: restore a game's newest mirrored checkpoint into its local run dir
by hand (what a worker does by itself at start when it finds none). `--repair` first puts
right the damaged files of the game's local checkpoints from the mirror's copies of their bytes
(a rotten replay chunk that every checkpoint shares through hard links): what a command game's
script cannot do itself, the SDK having no S3 client."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from checkpoints import CheckpointError, CheckpointStore, CheckpointWriteFailed
from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_USAGE,
    add_config_argument,
    become_state_owner,
    load_config_or_exit,
    retention_of,
)
from training.protocol import CHECKPOINT_DIR, LOCK_FILE

if TYPE_CHECKING:
    from checkpoints.remote import RemoteStore


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pull",
        help="restore a game's newest mirrored checkpoint into its run dir",
        description="Download the newest checkpoint of GAME from [mirror] whose files all "
        "verify (an older one when a newer one is damaged) and commit it to the game's local "
        "checkpoints. Nothing is done when the local store already has that step or a newer "
        "one, or while a worker runs for the game.",
    )
    add_config_argument(p)
    p.add_argument("--game", required=True, help="the game's name from the configuration")
    p.add_argument(
        "--repair",
        action="store_true",
        help="first verify the game's local checkpoints and restore each damaged file from "
        "the mirror's copy of its bytes (by sha256), in every checkpoint that shares it; "
        "exit 1 when a file stays damaged",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    if cfg.mirror is None:
        print(f"rlsup pull: {cfg.path} has no [mirror] table", file=sys.stderr)
        return EXIT_USAGE
    from supervisor.config import ConfigError, check_for_service

    try:
        check_for_service(cfg)  # the mirror's endpoint and region, by the S3 client's rules
    except ConfigError as exc:
        print(f"rlsup: {exc}", file=sys.stderr)
        return EXIT_USAGE
    games = {g.name: g for g in cfg.games}
    if args.game not in games:
        print(f"rlsup pull: no game {args.game!r}; configured: {', '.join(games)}", file=sys.stderr)
        return EXIT_USAGE
    game, run_dir = games[args.game], cfg.run_dir(args.game)
    from checkpoints.mirror import restore_newest, same_run
    from checkpoints.remote import RemoteError, RemoteLocation, RemoteStore, make_client

    # The game's own retention: the commit below must not delete what its worker keeps.
    store = CheckpointStore(run_dir / CHECKPOINT_DIR, **retention_of(game))
    try:
        # The client first: it reads the caller's credentials (root's ~/.aws under sudo).
        remote = RemoteStore(
            make_client(cfg.mirror.endpoint_url or None, cfg.mirror.region or None),
            RemoteLocation.parse(cfg.mirror.url),
        )
        become_state_owner(cfg.state_dir)
    except (ValueError, OSError) as exc:
        print(f"rlsup pull: {args.game}: {exc}", file=sys.stderr)
        return EXIT_FAIL

    damaged = False
    try:
        with _run_dir_lock(run_dir):
            steps = remote.manifest_steps(args.game)  # first: a mirror that is down says so
            if args.repair:
                damaged = not _repair_local(store, remote, args.game)
            local = store.latest()
            if not steps:
                print(f"rlsup pull: the mirror {cfg.mirror.url} has no checkpoint of {args.game}")
                return EXIT_FAIL if damaged else EXIT_OK
            if local is not None and local.step >= steps[-1]:
                print(
                    f"rlsup pull: {args.game} already has {local.path.name} locally "
                    f"(the mirror's newest is step {steps[-1]}): nothing to pull"
                )
                return EXIT_FAIL if damaged else EXIT_OK
            # A command game's checkpoints are its own (the SDK's meta holds what the script
            # put there, no env id of ours): nothing of ours to compare them with.
            want: dict[str, object] = {"game": game.env_id, "algo": game.algo}
            if game.command is not None:
                want = {}
            accept = same_run(want)
            restored = restore_newest(remote, args.game, store, accept=accept)
    except BlockingIOError:
        print(
            f"rlsup pull: a worker holds {run_dir / LOCK_FILE}: stop {args.game} first",
            file=sys.stderr,
        )
        return EXIT_LOCKED
    except (RemoteError, CheckpointWriteFailed, CheckpointError, OSError) as exc:
        print(f"rlsup pull: {args.game}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    assert restored is not None
    for why in restored.skipped:
        print(f"rlsup pull: skipped {why}", file=sys.stderr)
    print(
        f"rlsup pull: {args.game}: restored ckpt step {restored.step} "
        f"({restored.bytes_downloaded / 2**20:.1f} MiB) into {store.root}"
    )
    return EXIT_FAIL if damaged else EXIT_OK


def _repair_local(store: CheckpointStore, remote: RemoteStore, game: str) -> bool:
    """Verify each local checkpoint, newest first, repairing damaged files from an identical
    local file or the mirror's blob; say what was repaired and what stays damaged (nothing is
    quarantined or deleted here: the next load decides). True when every one is whole."""
    from checkpoints.errors import CheckpointCorrupt, CheckpointUnreadable
    from checkpoints.mirror import blob_source

    whole = True
    for ref in reversed(store.committed()):
        try:
            loaded = store.verify_or_repair(ref, [blob_source(remote)])
        except CheckpointCorrupt as exc:
            _say_repaired(game, ref.path.name, exc.repaired)
            print(
                f"rlsup pull: {game}: {ref.path.name}: still damaged: {', '.join(sorted(exc.bad))}"
                " (neither this disk nor the mirror holds a good copy)",
                file=sys.stderr,
            )
            whole = False
            continue
        except CheckpointUnreadable as exc:
            print(f"rlsup pull: {game}: {exc}", file=sys.stderr)
            whole = False
            continue
        _say_repaired(game, ref.path.name, loaded.repaired)
    return whole


def _say_repaired(game: str, name: str, repaired: dict[str, str]) -> None:
    for file, where in sorted(repaired.items()):
        print(f"rlsup pull: {game}: {name}: repaired {file} from {where}")


@contextlib.contextmanager
def _run_dir_lock(run_dir: Path) -> Iterator[None]:
    """The worker's own lock: pull and a worker never write one store at once."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)
