"""Validation of file names inside a checkpoint."""

from __future__ import annotations

import re

MANIFEST_NAME = "MANIFEST.json"

# One optional subdirectory level; no component may start with '.', which rules out
# '.', '..' and hidden files in one rule.
_COMPONENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}"
_NAME_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})?")


def validate_name(name: str) -> str:
    """Return `name` if it is a safe relative checkpoint file name, else raise ValueError."""
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
        raise ValueError(
            f"invalid checkpoint file name {name!r}: must be relative, at most one '/', "
            "no component starting with '.', characters [A-Za-z0-9._/-]"
        )
    if name == MANIFEST_NAME:
        raise ValueError(f"invalid checkpoint file name {name!r}: reserved for the manifest")
    return name
