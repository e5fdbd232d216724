"""Atomic, checksummed checkpoint store (ARCHITECTURE.md section 4).

Stdlib + structlog + tenacity only: no numpy/torch, so the supervisor can import it cheaply.
"""

from checkpoints.atomic import fsync_dir, write_file_atomic, write_json_atomic
from checkpoints.errors import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointUnreadable,
    CheckpointWriteFailed,
    NoValidCheckpoint,
)
from checkpoints.manifest import FileEntry
from checkpoints.names import CheckpointRef, validate_name
from checkpoints.store import CheckpointStore, LoadedCheckpoint
from checkpoints.writer import CheckpointWriter, WriteStats

__all__ = [
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointRef",
    "CheckpointStore",
    "CheckpointUnreadable",
    "CheckpointWriteFailed",
    "CheckpointWriter",
    "FileEntry",
    "LoadedCheckpoint",
    "NoValidCheckpoint",
    "WriteStats",
    "fsync_dir",
    "validate_name",
    "write_file_atomic",
    "write_json_atomic",
]
