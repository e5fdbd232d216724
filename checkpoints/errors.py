"""Exceptions raised by the checkpoint store."""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class: a checkpoint could not be written, read or verified."""


class CheckpointWriteFailed(CheckpointError):
    """Writing a checkpoint failed (ENOSPC, EIO, failed fsync, ...).

    By the time this is raised the staging directory has been removed and the previous
    committed checkpoint is untouched, so the caller can keep training and try again later.
    """


class NoValidCheckpoint(CheckpointError):
    """Committed checkpoints existed but none verified.

    Raised instead of returning None so that a corrupt store never silently means
    "start training from zero" (FIELD-NOTES lesson 4).
    """
