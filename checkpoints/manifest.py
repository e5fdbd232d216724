"""MANIFEST.json: building it at commit time and validating it at load time."""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The boot id moved to checkpoints/boot.py (status reads it without the manifest); these names
# keep working here for the store, the ledger and `rlsup join`.
from checkpoints.boot import BOOT_ID_ENV as BOOT_ID_ENV
from checkpoints.boot import DEFAULT_BOOT_ID_PATH as DEFAULT_BOOT_ID_PATH
from checkpoints.boot import read_boot_id as read_boot_id
from checkpoints.errors import CheckpointError
from checkpoints.names import validate_name

SCHEMA = 1
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint as recorded in its manifest."""

    size: int
    sha256: str


@functools.lru_cache(maxsize=1)
def rlsup_version() -> str:
    import importlib.metadata  # only when a checkpoint is written: it is slow to import

    try:
        return importlib.metadata.version("rlsup")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def build_manifest(
    step: int, meta: Mapping[str, Any], files: Mapping[str, FileEntry]
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "step": step,
        "created": time.time(),
        "boot_id": read_boot_id(),
        "rlsup_version": rlsup_version(),
        "meta": dict(meta),
        "files": {
            name: {"size": entry.size, "sha256": entry.sha256}
            for name, entry in sorted(files.items())
        },
    }


def encode_manifest(manifest: Mapping[str, Any]) -> bytes:
    # allow_nan=False: a manifest must be strict JSON so any tool can read it.
    text = json.dumps(manifest, sort_keys=True, indent=2, allow_nan=False)
    return text.encode("utf-8") + b"\n"


def parse_manifest(raw: bytes, expected_step: int) -> dict[str, Any]:
    """Decode and structurally validate a manifest; raise CheckpointError with the reason."""
    try:
        manifest = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"MANIFEST.json is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise CheckpointError("MANIFEST.json is not a JSON object")
    if manifest.get("schema") != SCHEMA:
        raise CheckpointError(f"unsupported manifest schema {manifest.get('schema')!r}")
    step = manifest.get("step")
    if type(step) is not int or step != expected_step:
        raise CheckpointError(
            f"step mismatch: manifest says {step!r}, directory name says {expected_step}"
        )
    if not isinstance(manifest.get("meta", {}), dict):
        raise CheckpointError("manifest 'meta' is not an object")
    parse_file_entries(manifest.get("files"))
    return manifest


def parse_file_entries(files: Any) -> dict[str, FileEntry]:
    if not isinstance(files, dict):
        raise CheckpointError("manifest 'files' is missing or not an object")
    return {name: _parse_entry(name, entry) for name, entry in files.items()}


def _parse_entry(name: Any, entry: Any) -> FileEntry:
    # A manifest is input from disk: a name like '../../etc/x' must never reach open().
    try:
        validate_name(name)
    except ValueError as exc:
        raise CheckpointError(f"manifest lists an invalid file name {name!r}") from exc
    if not isinstance(entry, dict):
        raise CheckpointError(f"manifest entry for {name!r} is not an object")
    size, digest = entry.get("size"), entry.get("sha256")
    if type(size) is not int or size < 0:
        raise CheckpointError(f"manifest entry for {name!r} has a bad size {size!r}")
    if not isinstance(digest, str) or _SHA256_RE.fullmatch(digest) is None:
        raise CheckpointError(f"manifest entry for {name!r} has a bad sha256 {digest!r}")
    return FileEntry(size=size, sha256=digest)
