"""Every name in a checkpoint store: committed checkpoint directories, the temporary and
quarantine prefixes beside them, and the files inside a checkpoint. The one place that builds
or parses them (the store, the writer, the supervisor, `rlsup status`, the soak).

  ckpt-<step:012d>/                 committed; MANIFEST.json is written last
  .staging-<uuid4hex>/              being written, or left by a crash: swept at start
  .replaced-<step:012d>-<uuid>/     old copy while the same step is re-committed
  .corrupt-<name>-<unix time>/      quarantined: failed verification, kept for forensics
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MANIFEST_NAME = "MANIFEST.json"
STAGING_PREFIX = ".staging-"
REPLACED_PREFIX = ".replaced-"
CORRUPT_PREFIX = ".corrupt-"
MAX_STEP = 10**12 - 1
_CKPT_RE = re.compile(r"ckpt-(\d{12})")
_REPLACED_RE = re.compile(re.escape(REPLACED_PREFIX) + r"(\d{12})-[0-9a-f]{32}")
_CORRUPT_RE = re.compile(re.escape(CORRUPT_PREFIX) + r"ckpt-(\d{12})-.*")


@dataclass(frozen=True)
class CheckpointRef:
    """A committed checkpoint directory and its step (nothing verified)."""

    path: Path
    step: int


def ckpt_name(step: int) -> str:
    return f"ckpt-{step:012d}"


def ckpt_step(name: str) -> int | None:
    """The step of a committed checkpoint directory's name, None for any other name."""
    match = _CKPT_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def replaced_step(name: str) -> int | None:
    """The step of a `.replaced-<step>-<uuid>` directory's name."""
    match = _REPLACED_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def corrupt_step(name: str) -> int | None:
    """The step of a quarantined `.corrupt-ckpt-<step>-<time>` directory's name."""
    match = _CORRUPT_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def newest_step(root: Path) -> int | None:
    """The newest committed checkpoint's step under `root` by directory name (nothing read)."""
    try:
        names = [entry.name for entry in Path(root).iterdir()]
    except OSError:
        return None
    steps = [s for n in names if (s := ckpt_step(n)) is not None]
    return max(steps) if steps else None


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
