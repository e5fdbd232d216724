"""Atomic, checksummed checkpoint store (ARCHITECTURE.md section 4).

Stdlib + structlog + tenacity only: no numpy/torch, so the supervisor can import it cheaply.
The names below load on first use (PEP 562): `rlsup status` reads checkpoint names
(`checkpoints.names`) without paying for the store's logging and retry machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkpoints.atomic import fsync_dir as fsync_dir
    from checkpoints.atomic import write_file_atomic as write_file_atomic
    from checkpoints.atomic import write_json_atomic as write_json_atomic
    from checkpoints.errors import CheckpointCorrupt as CheckpointCorrupt
    from checkpoints.errors import CheckpointError as CheckpointError
    from checkpoints.errors import CheckpointUnreadable as CheckpointUnreadable
    from checkpoints.errors import CheckpointWriteFailed as CheckpointWriteFailed
    from checkpoints.errors import NoValidCheckpoint as NoValidCheckpoint
    from checkpoints.manifest import FileEntry as FileEntry
    from checkpoints.names import CheckpointRef as CheckpointRef
    from checkpoints.names import validate_name as validate_name
    from checkpoints.store import CheckpointStore as CheckpointStore
    from checkpoints.store import LoadedCheckpoint as LoadedCheckpoint
    from checkpoints.writer import CheckpointWriter as CheckpointWriter
    from checkpoints.writer import WriteStats as WriteStats

_WHERE = {
    "fsync_dir": "atomic",
    "write_file_atomic": "atomic",
    "write_json_atomic": "atomic",
    "CheckpointCorrupt": "errors",
    "CheckpointError": "errors",
    "CheckpointUnreadable": "errors",
    "CheckpointWriteFailed": "errors",
    "NoValidCheckpoint": "errors",
    "FileEntry": "manifest",
    "CheckpointRef": "names",
    "validate_name": "names",
    "CheckpointStore": "store",
    "LoadedCheckpoint": "store",
    "CheckpointWriter": "writer",
    "WriteStats": "writer",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'checkpoints' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"checkpoints.{module}"), name)
    globals()[name] = value
    return value
