"""What the SDK raises and how it speaks: its exceptions (`rlsup.SdkError` and the rest, which
`rlsup` exports) and `say`, its one line on stderr. Stdlib only."""

from __future__ import annotations

import contextlib
import sys


class SdkError(RuntimeError):
    """A misuse of the SDK or a state it cannot go on from; the message says which."""


class RunDirLocked(SdkError):
    """Another process holds the run directory (two writers would corrupt each other)."""


class NoValidCheckpoint(SdkError):
    """Checkpoints exist but none verifies: never a silent restart from step 0."""


class CheckpointFailed(SdkError):
    """A checkpoint could not be committed (a full disk, an I/O error); nothing was changed."""


class ArrayDamaged(SdkError):
    """`load_arrays(name)`: chunks of the array are damaged in every checkpoint that holds them
    (one inode, hard-linked from checkpoint to checkpoint, rotted). `rows`: the [start, stop)
    ranges of the first axis they held; `load_arrays(name, salvage=True)` loads the rest with
    those rows zeroed."""

    def __init__(self, message: str, name: str, rows: list[tuple[int, int]]) -> None:
        super().__init__(message)
        self.name = name
        self.rows = rows


def say(message: str) -> None:
    """A line on stderr: under rlsup that is the game's log, on the state disk, which may be
    full: a line lost there must never turn into the script's crash (an OSError from print)."""
    with contextlib.suppress(OSError, ValueError):  # ValueError: stderr closed
        print(f"rlsup: {message}", file=sys.stderr, flush=True)
