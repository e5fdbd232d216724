"""Several hosts: a command game's first moments on its host, before its own program runs.

The host's actor (host.py, `WorkerHost.start_command`) starts
`python -P -m supervisor.launch.ray.command --cwd DIR --host NAME -- PROGRAM ARGS...` in the
game's run dir on that host, in a session of its own, with the RLSUP_* environment (the run
dir on this host, the placement's epoch, the mirror). In that process, before anything of the
user's runs:

1. The command must reach this host at the same absolute path as on the supervisor's (a shared
   mount, or the same checkout on every host): its working directory, its program, and the
   script an interpreter is given (`python train.py`). One that is missing ends the game
   FATAL (exit 78, error.json naming the path and the host): another host would not have it
   either, or the cluster is set up wrong.
2. The mirror's newest checkpoint of the game is restored into the run dir when the host has
   none of it, or only older ones of a superseded placement (the game ran elsewhere since):
   the SDK's `run.latest()` then resumes from it, as rlsup's own worker does. A mirror that
   cannot be read is a failure retried after a backoff (exit 1), never a start from zero; one
   whose checkpoints are all unusable ends the game FATAL (78), naming it.
3. The program is exec'd in this very process (the pid the supervisor knows, the session its
   signals go to), with `RLSUP_MIRROR_RESTORE` saying what was restored (the SDK's heartbeat
   reports it: the `mirror_restored` event).

Standard library and checkpoints/ only (boto3 with a mirror): it runs on every host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from training import protocol as P

CONFIG_EXIT = int(P.ExitCode.CONFIG)
SHARED_PATH_HINT = (
    "a command game on several hosts runs from the same absolute path on every host (a "
    "shared mount such as NFS, or the same checkout at the same place): docs/own-trainer.md"
)


class StartRefused(Exception):
    def __init__(self, code: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.code, self.kind = code, kind


def _error(run_dir: Path, code: int, kind: str, message: str) -> None:
    """error.json for the supervisor (relayed by the actor): why this start ended."""
    from checkpoints import write_json_atomic

    with contextlib.suppress(OSError, ValueError):
        write_json_atomic(
            run_dir / P.ERROR_FILE,
            {"kind": kind, "message": message, "exit_code": code, "time": time.time(),
             "pid": os.getpid(), "step": None, "traceback": ""},
        )  # fmt: skip


def _is_python(program: str) -> bool:
    name = os.path.basename(program)
    return name.startswith("python") and not name.endswith((".py", ".sh"))


def check_paths(argv: list[str], cwd: Path, host: str, path_env: str | None) -> str:
    """The program to exec (resolved), once the cwd, the program and an interpreter's script
    are all here; StartRefused (78) naming the first one missing and this host."""
    if not cwd.is_dir():
        raise StartRefused(
            CONFIG_EXIT, "command_missing",
            f"on host {host}: the command's working directory {cwd} does not exist there; "
            + SHARED_PATH_HINT,
        )  # fmt: skip
    program = argv[0]
    if os.sep in program:
        found = program if os.path.isabs(program) else str(cwd / program)
        if not (os.path.isfile(found) and os.access(found, os.X_OK)):
            raise StartRefused(
                CONFIG_EXIT, "command_missing",
                f"on host {host}: the command's program {found} is not there (or not "
                f"executable); " + SHARED_PATH_HINT,
            )  # fmt: skip
    else:
        which = shutil.which(program, path=path_env)
        if which is None:
            raise StartRefused(
                CONFIG_EXIT, "command_missing",
                f"on host {host}: the command's program {program!r} is not on its PATH "
                f"({path_env or os.defpath}); " + SHARED_PATH_HINT,
            )  # fmt: skip
        found = which
    if _is_python(program) and len(argv) > 1 and not argv[1].startswith("-"):
        script = Path(argv[1]) if os.path.isabs(argv[1]) else cwd / argv[1]
        if not script.is_file():
            raise StartRefused(
                CONFIG_EXIT, "command_missing",
                f"on host {host}: the command's script {script} does not exist there; "
                + SHARED_PATH_HINT,
            )  # fmt: skip
    return found


def _superseded(store: Any, remote: Any, game: str, epoch: int) -> bool:
    """The host's checkpoints of the game belong to an earlier placement that another one has
    overtaken in the mirror (by placement epoch, then step): moved aside (training/mirroring.py
    does the same for rlsup's own worker)."""
    from checkpoints.mirror import newest_meta

    newest = store.newest_meta()
    if newest is None:
        return False
    local = (int(newest[1].get("epoch") or 0), newest[0].step)
    if epoch and local[0] == epoch - 1:
        return False  # the placement just before this one ran here: nothing newer elsewhere
    mirrored = newest_meta(remote, game)
    if mirrored is None or (int(mirrored[1].get("epoch") or 0), mirrored[0]) <= local:
        return False
    aside = store.root.with_name(P.CHECKPOINT_DIR + ".superseded")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(store.root, aside)
    print(f"rlsup: the host's checkpoints {list(local)} (epoch, step) are superseded by the "
          f"mirror's; moved to {aside}", file=sys.stderr, flush=True)  # fmt: skip
    return True


def restore(run_dir: Path, env: dict[str, str]) -> dict[str, Any] | None:
    """The mirror's newest checkpoint of the game into `run_dir`, where the host has none of
    it (or only superseded ones): what was restored, None when nothing was (no mirror, a
    local checkpoint to resume from, or none mirrored yet). StartRefused otherwise."""
    url = env.get(P.MIRROR_URL_ENV)
    if not url:
        return None
    from checkpoints import CheckpointError, CheckpointStore, CheckpointWriteFailed
    from checkpoints.mirror import restore_newest, same_run
    from checkpoints.remote import RemoteError, RemoteLocation, RemoteStore, make_client

    game = env[P.GAME_ENV]
    epoch = int(env.get(P.EPOCH_ENV) or 0)
    store = CheckpointStore(run_dir / P.CHECKPOINT_DIR)
    try:
        client = make_client(env.get(P.MIRROR_ENDPOINT_URL_ENV) or None,
                             env.get(P.MIRROR_REGION_ENV) or None)  # fmt: skip
        remote = RemoteStore(client, RemoteLocation.parse(url))
        store.sweep()
        if store.latest() is not None and not _superseded(store, remote, game, epoch):
            return None
        restored = restore_newest(remote, game, store, accept=same_run({"name": game}))
    except RemoteError as exc:
        raise StartRefused(
            1, "checkpoint_unreadable",
            f"no checkpoint of {game} on this host and the mirror {url} cannot be read: {exc}; "
            "not starting from zero (retried after a backoff)",
        ) from exc  # fmt: skip
    except CheckpointWriteFailed as exc:
        raise StartRefused(
            1, "checkpoint_unreadable",
            f"the checkpoint restored from the mirror {url} could not be written to "
            f"{store.root}: {exc} (retried after a backoff)",
        ) from exc  # fmt: skip
    except CheckpointError as exc:
        raise StartRefused(
            CONFIG_EXIT, "no_valid_checkpoint",
            f"no checkpoint of {game} on this host and none in the mirror {url} can be used: "
            f"{exc}; refusing to start from zero",
        ) from exc  # fmt: skip
    except OSError as exc:
        raise StartRefused(
            1, "checkpoint_unreadable", f"cannot read the checkpoints in {store.root}: {exc}"
        ) from exc
    if restored is None:
        return None
    entry = {"step": restored.step, "bytes": restored.bytes_downloaded,
             "skipped": restored.skipped, "url": url}  # fmt: skip
    print(f"rlsup: restored {game} at step {restored.step} from the mirror {url}",
          file=sys.stderr, flush=True)  # fmt: skip
    return entry


def main(args: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="supervisor.launch.ray.command")
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    ns = parser.parse_args(args)
    # A stop asked before the program runs (during a restore): nothing of it started, nothing
    # to checkpoint: exit 75 (stopped) rather than die of the signal. Default again before the
    # exec: the program installs its own.
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    env = dict(os.environ)
    run_dir = Path(env.get(P.RUN_DIR_ENV) or os.getcwd())
    cwd = Path(ns.cwd)
    try:
        if not argv:
            raise StartRefused(CONFIG_EXIT, "command_missing", "no command to run")
        program = check_paths(argv, cwd, ns.host, env.get("PATH"))
        restored = restore(run_dir, env)
        if restored is not None:
            env[P.MIRROR_RESTORE_ENV] = json.dumps(restored, sort_keys=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if stop:
            print("rlsup: stopped before the program started", file=sys.stderr, flush=True)
            raise SystemExit(int(P.ExitCode.STOPPED))
        os.chdir(cwd)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(program, argv, env)
    except StartRefused as exc:
        print(f"rlsup: {exc}", file=sys.stderr, flush=True)
        _error(run_dir, exc.code, exc.kind, str(exc))
        raise SystemExit(exc.code) from None
    except OSError as exc:  # the exec itself: not executable, a bad interpreter line
        message = f"on host {ns.host}: cannot start the command `{' '.join(argv)}`: {exc}"
        print(f"rlsup: {message}", file=sys.stderr, flush=True)
        _error(run_dir, CONFIG_EXIT, "command_missing", message)
        raise SystemExit(CONFIG_EXIT) from None
    raise SystemExit(1)  # not reached: execve does not return


if __name__ == "__main__":
    main()
