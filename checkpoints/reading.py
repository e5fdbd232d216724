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
        verify_on_read: Callable[[str], bool] | None = None,
        repair: Callable[[Mapping[str, str]], dict[str, str]] | None = None,
        log: Logger | None = None,
    ) -> None:
        self.path = path
        self.step = step
        self.manifest = manifest
        # (dir name, reason) of newer checkpoints moved aside before this one verified.
        self.quarantined: list[tuple[str, str]] = list(quarantined or [])
        self.damaged: dict[str, str] = dict(damaged or {})
        self.repaired: dict[str, str] = dict(repaired or {})
        self._entries = parse_file_entries(manifest["files"])
        # Files whose size was checked but whose sha256 is checked as they are read (one pass
        # over the disk instead of two: see CheckpointStore.load_latest's verify_on_read).
        self.unverified: set[str] = {
            name
            for name in self._entries
            if verify_on_read is not None
            and verify_on_read(name)
            and name not in self.damaged
            and name not in self.repaired
        }
        self._repair = repair  # puts damaged files right from a good copy: name -> where from
        self._log = log

    def __repr__(self) -> str:
        return f"LoadedCheckpoint(path={str(self.path)!r}, step={self.step})"

    def repair_with(
        self, repair: Callable[[Mapping[str, str]], dict[str, str]], log: Logger
    ) -> None:
        """How files found damaged as they are read are put right (name -> where the good copy
        came from) and reported; see CheckpointStore.repairing_on_read."""
        self._repair, self._log = repair, log

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
        entry = self._readable_entry(name)
        data = self._read(name, _read_whole)
        if name in self.unverified:
            why = _mismatch(name, entry, len(data), hashlib.sha256(data).hexdigest())
            if why is not None:
                self._found_damaged({name: why}, raise_it=True)
                return self.read_bytes(name)  # repaired from a good copy
            self.unverified.discard(name)
        if len(data) != entry.size:
            raise CheckpointCorrupt(
                self.path,
                {name: f"{name} changed since it was verified: {len(data)} != {entry.size} bytes"},
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
        why = self._read_one_into(name, view)
        if why is not None:
            self._found_damaged({name: why}, raise_it=True)
            self.read_into(name, view)  # repaired from a good copy

    def read_many_into(self, items: Sequence[tuple[str, memoryview]]) -> dict[str, str]:
        """`read_into` for many files, side by side (file reads and hashing release the GIL),
        except that damage is returned, not raised: {name: what is wrong} of the files whose
        bytes did not match their manifest (hashed as they were read, when not verified
        before) and could not be repaired from a good copy. Their buffers hold whatever was
        read: the caller clears them. Each is also in `damaged` from then on. A read error
        that is not damage raises CheckpointUnreadable, as `read_into` does."""
        views = []
        for name, buf in items:
            view = as_byte_view(buf)
            expected = self._readable_entry(name).size
            if view.readonly or len(view) != expected:
                raise ValueError(f"buffer for {name!r} is read-only or not {expected} bytes")
            views.append((name, view))
        total = sum(len(view) for _, view in views)
        if len(views) > 1 and total >= _parallel.WORTH_IT_BYTES:
            reasons = list(_parallel.pool().map(lambda item: self._read_one_into(*item), views))
        else:
            reasons = [self._read_one_into(name, view) for name, view in views]
        bad = {name: why for (name, _), why in zip(views, reasons, strict=True) if why}
        if not bad:
            return {}
        repaired = self._found_damaged(bad, raise_it=False)
        for name, view in views:
            if name in repaired and self._read_one_into(name, view) is None:
                del bad[name]
            elif name in repaired:  # the good copy went bad between its check and this read
                self.damaged[name] = bad[name]
        return bad

    def _read_one_into(self, name: str, view: memoryview) -> str | None:
        """Fill `view` with `name`: None when its bytes are whole, else what is wrong (a file
        not verified before is hashed as it is read)."""
        entry = self.entry(name)
        if name not in self.unverified:
            filled = self._read(name, lambda path: _read_exactly_into(path, view))
            if filled != entry.size:
                return f"{name} is shorter than its manifest ({filled} < {entry.size})"
            return None
        try:
            size, digest = self._read(name, lambda path: _read_and_digest_into(path, view))
        except CheckpointCorrupt as exc:
            return exc.bad.get(name) or str(exc)
        except NotARegularFile:
            return f"{name} is not a regular file"
        why = _mismatch(name, entry, size, digest)
        if why is None:
            self.unverified.discard(name)
        return why

    def _found_damaged(self, bad: Mapping[str, str], *, raise_it: bool) -> dict[str, str]:
        """Files found damaged as they were read: repaired from a good copy when one exists
        (then verified: they read as any other), else `damaged` from now on, reported, and
        (raise_it) raised as CheckpointCorrupt. Returns what was repaired (name -> from)."""
        repaired = dict(self._repair(bad)) if self._repair is not None else {}
        for name in repaired:
            self.unverified.discard(name)
        self.repaired.update(repaired)
        left = {name: why for name, why in bad.items() if name not in repaired}
        self.damaged.update(left)
        for name in left:
            self.unverified.discard(name)
        if left and self._log is not None:
            self._log.warning(
                "checkpoint_salvaged", path=str(self.path), damaged=sorted(left), when="read"
            )
        if left and raise_it:
            raise CheckpointCorrupt(self.path, left, self.manifest)
        return repaired

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


def verify(
    ref: CheckpointRef, verify_on_read: Callable[[str], bool] | None = None
) -> LoadedCheckpoint:
    """`CheckpointStore.verify`'s body: see its docstring. Files for which `verify_on_read` is
    true get only their type and size checked here; the LoadedCheckpoint hashes them as they
    are read (`unverified`)."""
    manifest = read_manifest(ref)
    entries = sorted(parse_file_entries(manifest["files"]).items())
    later = verify_on_read or (lambda _name: False)
    hashed = [(name, entry) for name, entry in entries if not later(name)]
    if len(hashed) > 1 and sum(e.size for _, e in hashed) >= _parallel.WORTH_IT_BYTES:
        # Large checkpoints (replay chunks, the SDK's arrays): files side by side.
        reasons = list(_parallel.pool().map(lambda item: _check_file(ref.path, *item), hashed))
    else:
        reasons = [_check_file(ref.path, name, entry) for name, entry in hashed]
    reasons += [_check_file(ref.path, n, e, hash_it=False) for n, e in entries if later(n)]
    names = [name for name, _ in hashed] + [name for name, _ in entries if later(name)]
    bad = {name: r for name, r in zip(names, reasons, strict=True) if r is not None}
    if bad:
        raise CheckpointCorrupt(ref.path, bad, manifest)
    return LoadedCheckpoint(ref.path, ref.step, manifest, verify_on_read=verify_on_read)


class LoadingStore(Protocol):
    """What a load scan needs of its store (CheckpointStore is one): its log, verifying a
    checkpoint (with repair), and moving a corrupt one aside."""

    log: Logger

    def verify_or_repair(
        self,
        ref: CheckpointRef,
        sources: Sequence[RepairSource] = (),
        verify_on_read: Callable[[str], bool] | None = None,
    ) -> LoadedCheckpoint: ...

    def repairing_on_read(
        self, loaded: LoadedCheckpoint, sources: Sequence[RepairSource]
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
        verify_on_read: Callable[[str], bool] | None = None,
    ) -> None:
        self.store, self.refs = store, refs
        self.salvage, self.whole_first, self.sources = salvage, whole_first, sources
        self.verify_on_read = verify_on_read
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
                loaded = self.store.verify_or_repair(ref, self.sources, self.verify_on_read)
            except CheckpointCorrupt as exc:
                if self._salvageable(exc):
                    candidate = LoadedCheckpoint(
                        ref.path, ref.step, exc.manifest or {}, damaged=exc.bad,
                        repaired=exc.repaired, verify_on_read=self.verify_on_read,
                    )  # fmt: skip
                    self.store.repairing_on_read(candidate, self.sources)
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


def _check_file(
    directory: Path, name: str, entry: FileEntry, *, hash_it: bool = True
) -> str | None:
    """None when the file matches its entry (its size only, unless hash_it), else what is
    wrong with its bytes. CheckpointUnreadable when it cannot be read at all."""
    try:
        size, digest = _size_and_digest(directory / name, entry.size, hash_it)
    except NotARegularFile:
        return f"{name} is not a regular file"
    except FileNotFoundError:
        return f"missing file {name}"
    except OSError as exc:
        if _retry.is_damage(exc):
            return f"{name} is not a regular file: {exc.strerror}"
        raise CheckpointUnreadable(directory, name, exc) from exc
    if not hash_it and size == entry.size:
        return None
    return _mismatch(name, entry, size, digest)


def _mismatch(name: str, entry: FileEntry, size: int, digest: str) -> str | None:
    if size != entry.size:
        return f"size mismatch for {name}: manifest says {entry.size} bytes, file has {size}"
    if digest != entry.sha256:
        return f"checksum mismatch for {name}: sha256 {digest} != manifest"
    return None


class NotARegularFile(Exception):
    pass


@_retry.transient_read
def _size_and_digest(path: Path, expected_size: int, hash_it: bool = True) -> tuple[int, str]:
    """Size and sha256 of a regular file; skips hashing when the size is already wrong (or
    when not hash_it: the digest is then "")."""
    fd = _retry.open_read(path)
    with io.FileIO(fd, "rb", closefd=True) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(path.name)
        if st.st_size != expected_size or not hash_it:
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


@_retry.transient_read
def _read_and_digest_into(path: Path, view: memoryview) -> tuple[int, str]:
    """Fill `view` from `path` and hash the bytes as they arrive, a piece at a time while the
    piece is still in the CPU's cache: (the file's size, its sha256), with size != len(view)
    when the file is shorter or longer. One pass over the disk, no second copy."""
    fd = _retry.open_read(path)
    with io.FileIO(fd, "rb", closefd=True) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(path.name)
        digest = hashlib.sha256()
        filled = 0
        while filled < len(view):
            n = f.readinto(view[filled : filled + _READ_CHUNK])
            if not n:
                return filled, ""
            digest.update(view[filled : filled + n])
            filled += n
        if f.read(1):
            return max(st.st_size, filled + 1), ""
    return filled, digest.hexdigest()
