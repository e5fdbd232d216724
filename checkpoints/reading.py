"""Reading committed checkpoints: each listed file checked against its manifest (size and
sha256), the manifest itself read and parsed, `LoadedCheckpoint` (what a verified checkpoint is
read through), and one `load_latest` pass (`LoadScan`: newest first, a damaged checkpoint
quarantined, salvaged or passed over).

checkpoints/store.py's `CheckpointStore` is the front: it lists, repairs, quarantines, writes
and prunes, and calls into this module to verify and load.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from checkpoints import _parallel, _retry
from checkpoints._log import Logger
from checkpoints.atomic import as_byte_view
from checkpoints.errors import CheckpointCorrupt, CheckpointError, CheckpointUnreadable
from checkpoints.manifest import FileEntry, parse_file_entries, parse_manifest
from checkpoints.names import MANIFEST_NAME, CheckpointRef, validate_name
from checkpoints.repair import Inode, RepairSource, inode

_READ_CHUNK = 1 << 20
# A manifest lists file names and hashes; anything bigger than this is garbage, not a manifest.
_MAX_MANIFEST_BYTES = 64 << 20
_T = TypeVar("_T")


class LoadedCheckpoint:
    """A checkpoint whose files matched their manifest size and sha256 when loaded.

    `damaged` names the files that did not (with the reason) when the caller allowed them to be
    salvaged (see CheckpointStore.load_latest): reading one raises CheckpointCorrupt.
    `repaired` names those that did not at first and were put right from a good copy of their
    bytes (name -> where the copy came from): they read as any other.
    Every read that fails for another reason than damage raises CheckpointUnreadable.
    """

    def __init__(
        self,
        path: Path,
        step: int,
        manifest: dict[str, Any],
        quarantined: list[tuple[str, str]] | None = None,
        damaged: Mapping[str, str] | None = None,
        repaired: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path
        self.step = step
        self.manifest = manifest
        # (dir name, reason) of newer checkpoints moved aside before this one verified.
        self.quarantined: list[tuple[str, str]] = list(quarantined or [])
        self.damaged: dict[str, str] = dict(damaged or {})
        self.repaired: dict[str, str] = dict(repaired or {})
        self._entries = parse_file_entries(manifest["files"])

    def __repr__(self) -> str:
        return f"LoadedCheckpoint(path={str(self.path)!r}, step={self.step})"

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.manifest.get("meta") or {}
        return dict(meta) if isinstance(meta, dict) else {}

    def files(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> FileEntry:
        """The manifest entry of `name`; ValueError if malformed, KeyError if not listed."""
        validate_name(name)
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"{name!r} is not listed in the manifest of {self.path}") from None

    def read_bytes(self, name: str) -> bytes:
        expected = self._readable_entry(name).size
        data = self._read(name, _read_whole)
        if len(data) != expected:
            raise CheckpointCorrupt(
                self.path,
                {name: f"{name} changed since it was verified: {len(data)} != {expected} bytes"},
                self.manifest,
            )
        return data

    def read_json(self, name: str) -> Any:
        return json.loads(self.read_bytes(name))

    def open(self, name: str) -> io.BytesIO:
        """The whole of `name` in memory, as a file object (for small files, e.g. learner
        state for torch.load): a read error surfaces here, named, not inside a parser."""
        return io.BytesIO(self.read_bytes(name))

    def read_into(self, name: str, buf: memoryview | bytearray) -> None:
        """Read `name` straight into the caller's buffer (e.g. a numpy array's memory), so
        loading a large replay chunk needs no intermediate copy. Sizes must match exactly."""
        view = as_byte_view(buf)
        expected = self._readable_entry(name).size
        if view.readonly:
            raise ValueError(f"buffer for {name!r} is read-only")
        if len(view) != expected:
            raise ValueError(f"buffer for {name!r} is {len(view)} bytes, file is {expected}")
        filled = self._read(name, lambda path: _read_exactly_into(path, view))
        if filled != expected:
            raise CheckpointCorrupt(
                self.path,
                {name: f"{name} is shorter than its manifest ({filled} < {expected})"},
                None,
            )

    def _readable_entry(self, name: str) -> FileEntry:
        entry = self.entry(name)
        if name in self.damaged:
            raise CheckpointCorrupt(self.path, {name: self.damaged[name]}, self.manifest)
        return entry

    def _read(self, name: str, read: Callable[[Path], _T]) -> _T:
        try:
            return read(self.path / name)
        except OSError as exc:
            if _retry.is_damage(exc):
                raise CheckpointCorrupt(
                    self.path, {name: f"cannot open {name}: {exc}"}, None
                ) from exc
            raise CheckpointUnreadable(self.path, name, exc) from exc


def read_manifest(ref: CheckpointRef) -> dict[str, Any]:
    """`ref`'s MANIFEST.json, read and parsed. CheckpointCorrupt when it is missing or no
    manifest; CheckpointUnreadable when it cannot be read."""
    path = ref.path / MANIFEST_NAME
    try:
        raw = _read_small(path)
    except OSError as exc:
        if _retry.is_damage(exc):
            raise CheckpointCorrupt(
                ref.path, {MANIFEST_NAME: "missing MANIFEST.json"}, None
            ) from exc
        raise CheckpointUnreadable(ref.path, MANIFEST_NAME, exc) from exc
    try:
        return parse_manifest(raw, ref.step)
    except CheckpointError as exc:
        raise CheckpointCorrupt(ref.path, {MANIFEST_NAME: str(exc)}, None) from exc


def verify(ref: CheckpointRef) -> LoadedCheckpoint:
    """`CheckpointStore.verify`'s body: see its docstring."""
    manifest = read_manifest(ref)
    entries = sorted(parse_file_entries(manifest["files"]).items())
    if len(entries) > 1 and sum(e.size for _, e in entries) >= _parallel.WORTH_IT_BYTES:
        # Large checkpoints (replay chunks, the SDK's arrays): files side by side.
        reasons = list(_parallel.pool().map(lambda item: _check_file(ref.path, *item), entries))
    else:
        reasons = [_check_file(ref.path, name, entry) for name, entry in entries]
    bad = {name: r for (name, _), r in zip(entries, reasons, strict=True) if r is not None}
    if bad:
        raise CheckpointCorrupt(ref.path, bad, manifest)
    return LoadedCheckpoint(ref.path, ref.step, manifest)


class LoadingStore(Protocol):
    """What a load scan needs of its store (CheckpointStore is one): its log, verifying a
    checkpoint (with repair), and moving a corrupt one aside."""

    log: Logger

    def verify_or_repair(
        self, ref: CheckpointRef, sources: Sequence[RepairSource] = ()
    ) -> LoadedCheckpoint: ...

    def _quarantine(self, ref: CheckpointRef, reason: str) -> None: ...


class LoadScan:
    """One `load_latest` pass, newest first: what it quarantined, and (whole_first) the
    salvageable checkpoints it passed over while looking for a whole one."""

    def __init__(
        self,
        store: LoadingStore,
        refs: list[CheckpointRef],
        salvage: Callable[[str], bool] | None,
        whole_first: bool,
        sources: Sequence[RepairSource],
    ) -> None:
        self.store, self.refs = store, refs
        self.salvage, self.whole_first, self.sources = salvage, whole_first, sources
        self.quarantined: list[tuple[str, str]] = []
        self.passed: list[tuple[CheckpointRef, str]] = []  # damaged, newest first: (ref, why)
        self.first: LoadedCheckpoint | None = None  # the newest salvageable one
        self.rotten: dict[str, set[Inode]] = {}  # name -> inodes found damaged under it

    def run(self) -> LoadedCheckpoint | None:
        for ref in reversed(self.refs):
            shared = self._shares_damage(ref)
            if shared is not None:
                self.store.log.info("checkpoint_shares_damage", path=str(ref.path), file=shared)
                self.passed.append((ref, f"shares the damaged {shared} of a newer checkpoint"))
                continue
            try:
                loaded = self.store.verify_or_repair(ref, self.sources)
            except CheckpointCorrupt as exc:
                if self._salvageable(exc):
                    candidate = LoadedCheckpoint(
                        ref.path, ref.step, exc.manifest or {}, damaged=exc.bad,
                        repaired=exc.repaired,
                    )  # fmt: skip
                    if not self.whole_first:
                        return self._salvaged(candidate)
                    self._pass_over(ref, candidate, str(exc))
                    continue
                self._quarantine(ref, str(exc))
                continue
            for older_damaged, why in self.passed:  # a whole one: they were worse
                self._quarantine(older_damaged, why)
            loaded.quarantined = self.quarantined
            return loaded
        if self.first is not None:
            return self._salvaged(self.first)
        return None

    def _salvageable(self, exc: CheckpointCorrupt) -> bool:
        return (
            exc.manifest is not None
            and self.salvage is not None
            and all(map(self.salvage, exc.bad))
        )

    def _pass_over(self, ref: CheckpointRef, candidate: LoadedCheckpoint, why: str) -> None:
        self.passed.append((ref, why))
        if self.first is None:
            self.first = candidate
        for name in candidate.damaged:
            found = inode(ref.path / name)
            if found is not None:
                self.rotten.setdefault(name, set()).add(found)

    def _shares_damage(self, ref: CheckpointRef) -> str | None:
        """The name of a file of `ref` that is an inode already found damaged (a hard link of
        it), or None: such a checkpoint is older and no better."""
        for name, inodes in self.rotten.items():
            if inode(ref.path / name) in inodes:
                return name
        return None

    def _salvaged(self, loaded: LoadedCheckpoint) -> LoadedCheckpoint:
        self.store.log.warning(
            "checkpoint_salvaged", path=str(loaded.path), damaged=sorted(loaded.damaged)
        )
        loaded.quarantined = self.quarantined
        return loaded

    def _quarantine(self, ref: CheckpointRef, reason: str) -> None:
        self.quarantined.append((ref.path.name, reason))
        self.store._quarantine(ref, reason)


def _check_file(directory: Path, name: str, entry: FileEntry) -> str | None:
    """None when the file matches its entry, else what is wrong with its bytes.
    CheckpointUnreadable when it cannot be read at all."""
    try:
        size, digest = _size_and_digest(directory / name, entry.size)
    except NotARegularFile:
        return f"{name} is not a regular file"
    except FileNotFoundError:
        return f"missing file {name}"
    except OSError as exc:
        if _retry.is_damage(exc):
            return f"{name} is not a regular file: {exc.strerror}"
        raise CheckpointUnreadable(directory, name, exc) from exc
    if size != entry.size:
        return f"size mismatch for {name}: manifest says {entry.size} bytes, file has {size}"
    if digest != entry.sha256:
        return f"checksum mismatch for {name}: sha256 {digest} != manifest"
    return None


class NotARegularFile(Exception):
    pass


@_retry.transient_read
def _size_and_digest(path: Path, expected_size: int) -> tuple[int, str]:
    """Size and sha256 of a regular file; skips hashing when the size is already wrong."""
    fd = _retry.open_read(path)
    with io.FileIO(fd, "rb", closefd=True) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(path.name)
        if st.st_size != expected_size:
            return st.st_size, ""
        digest = hashlib.sha256()
        buf = bytearray(_READ_CHUNK)
        view = memoryview(buf)
        size = 0
        while n := f.readinto(view):
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


@_retry.transient_read
def _read_small(path: Path) -> bytes:
    fd = _retry.open_read(path)
    with io.FileIO(fd, "rb", closefd=True) as f:
        return f.read(_MAX_MANIFEST_BYTES)


@_retry.transient_read
def _read_whole(path: Path) -> bytes:
    fd = _retry.open_read(path)
    with io.FileIO(fd, "rb", closefd=True) as f:
        return f.readall()


@_retry.transient_read
def _read_exactly_into(path: Path, view: memoryview) -> int:
    """Unbuffered: readinto goes from the kernel straight into `view`. Returns bytes read."""
    fd = _retry.open_read(path)
    with io.FileIO(fd, "rb", closefd=True) as f:
        filled = 0
        while filled < len(view):
            n = f.readinto(view[filled:])
            if not n:
                break
            filled += n
    return filled
