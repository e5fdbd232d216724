"""Exceptions raised by the checkpoint store."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class CheckpointError(Exception):
    """Base class: a checkpoint could not be written, read or verified."""


class CheckpointWriteFailed(CheckpointError):
    """Writing a checkpoint failed (ENOSPC, EIO, failed fsync, ...).

    By the time this is raised the staging directory has been removed and the previous
    committed checkpoint is untouched, so the caller can keep training and try again later.
    """


class PlacementFenced(CheckpointError):
    """A commit refused: the game's placement fence in the mirror has moved past this
    writer's epoch (the game was placed on another host since). Nothing was committed."""

    def __init__(self, game: str, epoch: int, fence: int) -> None:
        self.game, self.epoch, self.fence = game, epoch, fence
        super().__init__(
            f"{game}: placement epoch {epoch} is fenced off (the mirror's fence is at {fence}: "
            "the game was placed elsewhere since); not committed"
        )


class CheckpointCorrupt(CheckpointError):
    """A checkpoint's bytes do not match its manifest: proof of damage, not a read error.

    `bad` maps every file that failed (MANIFEST.json included) to the reason, so a caller can
    tell "only replay chunks rotted" from "the learner is gone"; each reason names its file.
    `manifest` is the parsed
    manifest when it was itself readable and valid, else None. `repaired`: files that were
    damaged too but were put right from a good copy (name -> where it came from).
    """

    def __init__(
        self,
        path: Path,
        bad: dict[str, str],
        manifest: dict[str, Any] | None,
        repaired: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.bad = dict(bad)
        self.manifest = manifest
        self.repaired = dict(repaired or {})
        super().__init__("; ".join(reason for _, reason in sorted(bad.items())))


class CheckpointUnreadable(CheckpointError):
    """A checkpoint could not be read (EIO, EACCES, EMFILE, ESTALE, ...) after bounded retries.

    Not evidence against its bytes: the checkpoint stays where it is, and a later attempt
    (once the disk, the permissions or the file table recover) loads it as usual.
    """

    def __init__(self, path: Path, name: str, error: OSError) -> None:
        self.path = Path(path)
        self.name = name
        self.errno = error.errno
        super().__init__(f"cannot read {name} of {self.path}: {error}")


class NoValidCheckpoint(CheckpointError):
    """Committed checkpoints existed but none verified.

    Raised instead of returning None so that a corrupt store never silently means
    "start training from zero" (FIELD-NOTES lesson 4). `quarantined`: (name, reason) of the
    checkpoints this load moved aside.
    """

    def __init__(self, message: str, quarantined: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.quarantined = quarantined or []
