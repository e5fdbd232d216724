"""Child process for the kill-during-retention sweep (test_ckpt_keep.py): applies retention
(newest 1, best 2, pins) to the store at ROOT and SIGKILLs itself at the N-th crash point it
passes (or, in "record" mode, lists the points).

Usage: python retention_kill_child.py ROOT (record OUT.json | kill N)
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from checkpoints import CheckpointStore, _crashpoints


def main(argv: list[str]) -> None:
    root, mode, arg = Path(argv[1]), argv[2], argv[3]
    passed: list[str] = []

    def hook(point: str) -> None:
        if mode == "kill" and len(passed) == int(arg):
            os.kill(os.getpid(), signal.SIGKILL)
        passed.append(point)

    _crashpoints.hook = hook
    CheckpointStore(root, keep=1, keep_best=2).apply_retention()
    if mode == "record":
        Path(arg).write_text(json.dumps(passed))
    else:
        sys.exit(f"crash point #{arg} was never reached")


if __name__ == "__main__":
    main(sys.argv)
