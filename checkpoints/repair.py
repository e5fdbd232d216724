"""Repairing a damaged file of a committed checkpoint from a good copy of its bytes.

A manifest names each file by its sha256, so any bytes with that hash are that file: another
file of this store with the same hash on another inode (the empty, identical chunks of a buffer
not yet full), or the mirror's blob of that hash. A hard-linked chunk that rotted is one inode
in every checkpoint that shares it; a repair puts the good bytes back under that name in each
of them, so one repair serves them all and they share one inode again.

Never a half-written file under a checkpoint's name: the copy is written beside it as
`.repair-<uuid>` (a name no manifest lists, so no load reads it), fsynced and hashed as it is
written, and renamed over the damaged entry only when size and sha256 match the manifest. A
crash leaves at most one such leftover in a checkpoint directory, removed with the checkpoint.
Stdlib only: the SDK uses it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from checkpoints import _retry
from checkpoints.atomic import as_byte_view, create_file, fsync_dir, write_all
from checkpoints.errors import CheckpointError
from checkpoints.manifest import FileEntry, parse_file_entries, parse_manifest
from checkpoints.names import MANIFEST_NAME, CheckpointRef

REPAIR_PREFIX = ".repair-"
_READ_BLOCK = 1 << 20

Inode = tuple[int, int]
Stream = Iterable[bytes | bytearray | memoryview]
# Good bytes for a file, by its name and manifest entry: candidates as (where they come from,
# the bytes), each checked against the entry as it is written; one that fails is dropped for the
# next. A source may offer nothing for some names (the worker asks the mirror for replay chunks
# only: a damaged learner has an exact predecessor).
RepairSource = Callable[[str, FileEntry], Iterator[tuple[str, Stream]]]


def inode(path: Path) -> Inode | None:
    """(device, inode) of `path` itself (a link is not followed), None when it cannot be
    stat()ed."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class LocalCopies:
    """Files of a store's committed checkpoints by sha256, from their manifests (read once,
    when first asked): a RepairSource that never offers the damaged inodes themselves."""

    def __init__(self, refs: Sequence[CheckpointRef]) -> None:
        self._refs = list(refs)
        self._by_sha: dict[str, list[tuple[str, Path]]] | None = None

    def source(self, avoid: set[Inode]) -> RepairSource:
        def candidates(name: str, entry: FileEntry) -> Iterator[tuple[str, Stream]]:
            for where, path in self._index().get(entry.sha256, []):
                if inode(path) not in avoid:  # never the damaged copy, under another name
                    yield where, _file_blocks(path)

        return candidates

    def _index(self) -> dict[str, list[tuple[str, Path]]]:
        if self._by_sha is None:
            self._by_sha = {}
            for ref in self._refs:
                for name, entry in _entries(ref).items():
                    where = f"{ref.path.name}/{name}"
                    self._by_sha.setdefault(entry.sha256, []).append((where, ref.path / name))
        return self._by_sha


def _entries(ref: CheckpointRef) -> dict[str, FileEntry]:
    """A checkpoint's manifest entries; {} when its manifest cannot be read or parsed (it then
    offers no copies: nothing is trusted that is not named by a manifest)."""
    try:
        with open(ref.path / MANIFEST_NAME, "rb") as f:
            manifest = parse_manifest(f.read(), ref.step)
        return parse_file_entries(manifest["files"])
    except (OSError, CheckpointError, KeyError, TypeError, ValueError):
        return {}


def _file_blocks(path: Path) -> Iterator[bytes]:
    fd = _retry.open_read(path)
    with os.fdopen(fd, "rb", buffering=0) as f:
        while block := f.read(_READ_BLOCK):
            yield block


def repair_file(
    ref: CheckpointRef,
    name: str,
    entry: FileEntry,
    sharers: Sequence[CheckpointRef],
    sources: Sequence[RepairSource],
    log: Any,
) -> str | None:
    """Put good bytes back under `name` in `ref` and in each of `sharers` whose `name` is the
    same damaged inode. Returns where the bytes came from, None when no source had them."""
    target = ref.path / name
    damaged = inode(target)
    for source in sources:
        for where, stream in _candidates(source, name, entry, log):
            tmp = target.with_name(f"{REPAIR_PREFIX}{uuid.uuid4().hex}")
            try:
                got = _write_hashed(tmp, stream)
            except (OSError, CheckpointError) as exc:  # this copy failed: try the next one
                _unlink(tmp)
                log.debug("checkpoint_repair_candidate_failed", where=where, error=str(exc))
                continue
            if got != entry:
                _unlink(tmp)
                log.debug("checkpoint_repair_candidate_wrong", where=where, name=name)
                continue
            try:
                _install(tmp, target, name, damaged, sharers, log)
            except OSError as exc:  # not in place (or not durably): still damaged, as before
                _unlink(tmp)
                log.warning("checkpoint_repair_failed", path=str(target), error=str(exc))
                return None
            return where
    return None


def _candidates(
    source: RepairSource, name: str, entry: FileEntry, log: Any
) -> Iterator[tuple[str, Stream]]:
    """A source's candidates; a source that fails while listing them offers no more."""
    try:
        yield from source(name, entry)
    except (OSError, CheckpointError) as exc:
        log.debug("checkpoint_repair_source_failed", error=str(exc))


def _write_hashed(path: Path, stream: Stream) -> FileEntry:
    digest, size = hashlib.sha256(), 0
    fd = create_file(path)
    try:
        for block in stream:
            view = as_byte_view(block)
            digest.update(view)
            size += write_all(fd, view)
        os.fsync(fd)
    finally:
        os.close(fd)
    return FileEntry(size=size, sha256=digest.hexdigest())


def _install(
    tmp: Path,
    target: Path,
    name: str,
    damaged: Inode | None,
    sharers: Sequence[CheckpointRef],
    log: Any,
) -> None:
    """Rename the verified copy over `target`, then link it over `name` in every other
    checkpoint that held the same damaged inode (one that fails keeps its damage: it fails
    verification again, no worse than before)."""
    _retry.replace(tmp, target)
    fsync_dir(target.parent)
    if damaged is None:
        return
    for other in sharers:
        path = other.path / name
        if path == target or inode(path) != damaged:
            continue
        link = path.with_name(f"{REPAIR_PREFIX}{uuid.uuid4().hex}")
        try:
            _retry.link(target, link)
            _retry.replace(link, path)
            fsync_dir(path.parent)
        except OSError as exc:
            _unlink(link)
            log.warning("checkpoint_repair_link_failed", path=str(path), error=str(exc))


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
