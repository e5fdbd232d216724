"""Child process for the crash-point sweep: commits a checkpoint and SIGKILLs itself at one
named point of the commit protocol (or, in "record" mode, lists the points it passes).

Usage: python ckpt_crash_child.py ROOT SCENARIO (record OUT.json | kill POINT)
  SCENARIO "next": commit step 2 on top of step 1 (keep=1, so step 1 is pruned after).
  SCENARIO "same": commit step 1 again, with new contents, on top of step 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from checkpoints import CheckpointStore, _crashpoints

CHUNK_A = b"\x0a" * 8192
REPLAY_NEW = b"\x0b" * 8192


def files_for(version: str) -> dict[str, bytes]:
    """Full expected contents of the old ("old") or newly committed ("new") checkpoint."""
    return {
        "learner.pt": f"learner-{version}".encode() * 50,
        "replay/frames-000000.bin": CHUNK_A,
        "replay/frames-000001.bin": REPLAY_NEW if version == "new" else b"\x01" * 100,
        "config.json": json.dumps({"version": version}).encode(),
    }


def write_base(store: CheckpointStore) -> None:
    with store.begin(1, {"game": "Pong-v5"}) as w:
        w.write_bytes("learner.pt", files_for("old")["learner.pt"])
        w.write_bytes("replay/frames-000000.bin", CHUNK_A)
        w.write_bytes("replay/frames-000001.bin", files_for("old")["replay/frames-000001.bin"])
        w.write_bytes("config.json", files_for("old")["config.json"])
        w.commit()


def write_new(store: CheckpointStore, step: int) -> None:
    new = files_for("new")
    with store.begin(step, {"game": "Pong-v5"}) as w:
        w.write_bytes("learner.pt", new["learner.pt"])
        w.link_or_write("replay/frames-000000.bin", CHUNK_A, unchanged_since_step=1)
        w.write_stream("replay/frames-000001.bin", (REPLAY_NEW[:4096], REPLAY_NEW[4096:]))
        w.write_bytes("config.json", new["config.json"])
        w.commit()


def main(argv: list[str]) -> None:
    root, scenario, mode, arg = Path(argv[1]), argv[2], argv[3], argv[4]
    passed: list[str] = []

    def hook(point: str) -> None:
        passed.append(point)
        if mode == "kill" and point == arg:
            os.kill(os.getpid(), signal.SIGKILL)

    _crashpoints.hook = hook
    write_new(CheckpointStore(root, keep=1), 2 if scenario == "next" else 1)
    if mode == "record":
        Path(arg).write_text(json.dumps(passed))
    elif arg not in passed:
        sys.exit(f"crash point {arg!r} was never reached")


if __name__ == "__main__":
    main(sys.argv)
