"""CheckpointWriter: builds one checkpoint in a staging dir and commits it atomically.

Commit protocol (crash-safe at every point, see tests/checkpoints/test_ckpt_crash.py):
  1. each file: create in `.staging-<uuid>`, write, fsync, close
  2. fsync every subdirectory, then write MANIFEST.json last and fsync it
  3. fsync the staging dir, rename it to `ckpt-<step:012d>`, fsync the root
A crash before 3's rename leaves only a staging dir, which never matches `ckpt-*` and is
swept at the next start; after it, the new checkpoint is complete and verified by checksum.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from checkpoints import _parallel, _retry
from checkpoints._crashpoints import crash_point
from checkpoints.atomic import as_byte_view, create_file, fsync_dir, make_dir, write_all
from checkpoints.errors import CheckpointError, CheckpointWriteFailed
from checkpoints.manifest import (
    FileEntry,
    build_manifest,
    encode_manifest,
    parse_file_entries,
    parse_manifest,
)
from checkpoints.names import (
    MANIFEST_NAME,
    REPLACED_PREFIX,
    STAGING_PREFIX,
    CheckpointRef,
    validate_name,
)
from checkpoints.perms import FILE_MODE


class StoreSide(Protocol):
    """What a writer needs of its store (CheckpointStore is one): where checkpoints live,
    its log, and retention once a checkpoint is committed."""

    root: Path
    log: Any

    def path_for(self, step: int) -> Path: ...

    def retain_after_commit(self, committed_step: int) -> None: ...


@dataclass
class WriteStats:
    bytes_written: int = 0
    bytes_linked: int = 0
    files_written: int = 0
    files_linked: int = 0
    seconds: float = 0.0
    # Base files found rotten when about to link them ("ckpt-<step>/<name>"): rewritten.
    bad_bases: list[str] = field(default_factory=list)


class CheckpointWriter:
    """Writes the files of one checkpoint; use CheckpointStore.begin() to get one.

    As a context manager, an exception inside the `with` block (or leaving it without
    commit()) aborts, so a half-built checkpoint is never left behind.
    """

    def __init__(self, store: StoreSide, step: int, meta: dict[str, Any]) -> None:
        self._store = store
        self._log = store.log
        self.step = step
        self._meta = meta
        self.stats = WriteStats()
        self._started = time.monotonic()
        self._files: dict[str, FileEntry] = {}
        self._subdirs: set[str] = set()
        self._unsynced: list[str] = []  # written with sync_at_commit: fsynced by commit()
        self._base_entries_cache: dict[int, dict[str, FileEntry]] = {}
        self._state = "open"
        self.staging = store.root / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
        with self._failure_guard("creating the staging dir"):
            make_dir(self.staging)

    # ---- context manager -------------------------------------------------------------

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None and self._state == "open":
            self._log.warning("checkpoint_not_committed", step=self.step)
        self.abort()

    # ---- writing files ----------------------------------------------------------------

    def write_bytes(
        self, name: str, data: bytes | bytearray | memoryview, *, sync_at_commit: bool = False
    ) -> FileEntry:
        return self.write_stream(name, (data,), sync_at_commit=sync_at_commit)

    def write_json(self, name: str, obj: Any) -> FileEntry:
        # Strict JSON (no NaN): checkpoint contents must be readable by any tool.
        raw = json.dumps(obj, sort_keys=True, indent=2, allow_nan=False).encode("utf-8")
        return self.write_bytes(name, raw)

    def write_stream(
        self,
        name: str,
        chunks: Iterable[bytes | bytearray | memoryview],
        *,
        sync_at_commit: bool = False,
    ) -> FileEntry:
        """Write chunks as they come, hashing as it goes: memory used is one chunk.

        sync_at_commit: fsync the file at commit instead of now. For many large files (the
        SDK's array chunks) the kernel then writes them back while the next ones are written,
        instead of one synchronous flush per file; commit fsyncs them all (naming a file that
        fails) before the manifest, so the protocol's guarantee is the same."""
        path = self._prepare(name)
        digest = hashlib.sha256()
        size = 0
        with self._failure_guard(f"writing {name}"):
            fd = create_file(path)
            try:
                for chunk in chunks:
                    view = as_byte_view(chunk)
                    if len(view) >= _parallel.WORTH_IT_BYTES:
                        # Hash on another core while this one writes the same bytes.
                        hashed = _parallel.pool().submit(digest.update, view)
                        try:
                            size += write_all(fd, view)
                        finally:
                            hashed.result()
                    else:
                        digest.update(view)
                        size += write_all(fd, view)
                    crash_point(f"after_chunk:{name}")
                # fsync now rather than at commit: the data is still hot, and a failure
                # is attributed to the file that caused it.
                if not sync_at_commit:
                    os.fsync(fd)
            finally:
                os.close(fd)
        entry = FileEntry(size=size, sha256=digest.hexdigest())
        if sync_at_commit:
            self._unsynced.append(name)
        self._files[name] = entry
        self.stats.bytes_written += size
        self.stats.files_written += 1
        crash_point(f"after_write:{name}")
        return entry

    def link_or_write(
        self,
        name: str,
        data: bytes | bytearray | memoryview,
        *,
        unchanged_since_step: int | None,
        expect_same: bool = True,
        sync_at_commit: bool = False,
    ) -> FileEntry:
        """Hard-link `name` from checkpoint `unchanged_since_step` when its file there still
        holds exactly `data`; else write `data`.

        The base file is compared byte for byte with `data` before it is linked (a read, no
        write, no hashing): a hard link shares the inode, so linking a file whose bytes rotted
        since it was written would put the damage into every checkpoint from now on. A base
        that no longer matches is reported in `stats.bad_bases` and rewritten from memory.

        expect_same=False: the caller does not know whether `data` changed (the SDK's arrays),
        so a base that differs is simply a changed file, written without a warning.
        sync_at_commit: as `write_stream`'s, for a file that is written.
        """
        view = as_byte_view(data)
        if unchanged_since_step is not None:
            entry = self._try_link(name, view, unchanged_since_step, expect_same)
            if entry is not None:
                return entry
        return self.write_bytes(name, view, sync_at_commit=sync_at_commit)

    def _try_link(
        self, name: str, view: memoryview, base_step: int, expect_same: bool = True
    ) -> FileEntry | None:
        path = self._prepare(name)
        base_entry = self._base_entries(base_step).get(name)
        if base_entry is None or base_entry.size != len(view):
            return None
        src = self._store.path_for(base_step) / name
        try:
            same = _same_bytes(src, view)
            if same:
                _retry.link(src, path)
        except OSError as exc:
            # e.g. EXDEV/EPERM/EMLINK/EIO: linking is an optimisation, writing is always correct.
            self._log.debug("checkpoint_link_fallback", name=name, reason=str(exc))
            return None
        if not same and not expect_same:
            return None
        if not same:
            self.stats.bad_bases.append(f"{self._store.path_for(base_step).name}/{name}")
            self._log.warning(
                "checkpoint_base_mismatch",
                base=str(src),
                reason="its bytes no longer match what it was written with: rewritten from "
                "memory; older checkpoints that share this file are damaged",
            )
            return None
        self._files[name] = base_entry
        self.stats.bytes_linked += len(view)
        self.stats.files_linked += 1
        crash_point(f"after_link:{name}")
        return base_entry

    def _base_entries(self, base_step: int) -> dict[str, FileEntry]:
        cached = self._base_entries_cache.get(base_step)
        if cached is not None:
            return cached
        entries: dict[str, FileEntry] = {}
        manifest_path = self._store.path_for(base_step) / MANIFEST_NAME
        with contextlib.suppress(OSError, CheckpointError):
            manifest = parse_manifest(_read_all(manifest_path), base_step)
            entries = parse_file_entries(manifest["files"])
        self._base_entries_cache[base_step] = entries
        return entries

    def _prepare(self, name: str) -> Path:
        """Validate `name` and make its subdirectory; return its path in staging."""
        validate_name(name)
        self._ensure_open()
        if name in self._files:
            raise ValueError(f"checkpoint file {name!r} was already written")
        if name in self._subdirs:
            raise ValueError(f"checkpoint file {name!r} clashes with a subdirectory")
        if "/" in name:
            subdir = name.split("/", 1)[0]
            if subdir in self._files:
                raise ValueError(f"checkpoint file {name!r} clashes with file {subdir!r}")
            if subdir not in self._subdirs:
                with self._failure_guard(f"creating subdirectory {subdir}"):
                    make_dir(self.staging / subdir)
                self._subdirs.add(subdir)
        return self.staging / name

    def adopt_staged(self) -> list[str]:
        """Take into the manifest the files that someone wrote straight into `staging` (a
        user's `model.save(d / "model.zip")` through the SDK): each is fsynced and hashed as it
        lies. Only regular files at most one directory deep, with names `validate_name`
        accepts: a link, a FIFO or a deeper tree is a CheckpointError naming it (the
        checkpoint is then not committed). Returns the names adopted."""
        self._ensure_open()
        adopted: list[str] = []
        with self._failure_guard("adopting the staged files"):
            for rel in _staged_files(self.staging):
                if rel in self._files:
                    continue
                try:
                    validate_name(rel)
                except ValueError as exc:
                    raise CheckpointError(f"checkpoint step {self.step}: {exc}") from None
                self._files[rel] = self._adopt(rel)
                if "/" in rel:
                    self._subdirs.add(rel.split("/", 1)[0])
                adopted.append(rel)
        return adopted

    def _adopt(self, rel: str) -> FileEntry:
        path = self.staging / rel
        # O_NONBLOCK: a FIFO planted in the staging dir must not block the commit.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CheckpointError(f"checkpoint step {self.step}: {rel} is not a regular file")
            os.fchmod(fd, FILE_MODE)  # private like the files the writer makes itself
            digest = hashlib.sha256()
            size = 0
            with io.FileIO(fd, "rb", closefd=False) as f:
                while block := f.read(_COMPARE_BLOCK):
                    digest.update(block)
                    size += len(block)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.stats.bytes_written += size
        self.stats.files_written += 1
        return FileEntry(size=size, sha256=digest.hexdigest())

    # ---- commit / abort ---------------------------------------------------------------

    def commit(self) -> CheckpointRef:
        self._ensure_open()
        final = self._store.path_for(self.step)
        for name in self._unsynced:
            with self._failure_guard(f"syncing {name}"):
                fd = os.open(self.staging / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        with self._failure_guard("committing"):
            for subdir in sorted(self._subdirs):
                fsync_dir(self.staging / subdir)
            crash_point("before_manifest")
            self._write_manifest()
            crash_point("after_manifest")
            fsync_dir(self.staging)
            aside = self._move_existing_aside(final)
            try:
                crash_point("before_rename")
                _retry.rename(self.staging, final)
            except BaseException:
                self._restore_aside(aside, final)
                raise
        self._state = "committed"
        crash_point("after_rename")
        self._sync_root_or_roll_back(final, aside)
        crash_point("after_fsync_root")
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        self.stats.seconds = time.monotonic() - self._started
        self._store.retain_after_commit(self.step)
        self._log.info(
            "checkpoint_committed",
            step=self.step,
            bytes_written=self.stats.bytes_written,
            bytes_linked=self.stats.bytes_linked,
            seconds=round(self.stats.seconds, 3),
        )
        return CheckpointRef(path=final, step=self.step)

    def abort(self) -> None:
        """Remove the staging dir. Idempotent; a no-op after commit."""
        if self._state != "open":
            return
        self._state = "aborted"
        # Leftovers (e.g. rmtree hit EIO) are harmless: never loaded, swept at next start.
        shutil.rmtree(self.staging, ignore_errors=True)

    def _write_manifest(self) -> None:
        manifest = build_manifest(self.step, self._meta, self._files)
        fd = create_file(self.staging / MANIFEST_NAME)
        try:
            write_all(fd, encode_manifest(manifest))
            os.fsync(fd)
        finally:
            os.close(fd)

    def _move_existing_aside(self, final: Path) -> Path | None:
        """Same step committed twice: move the old one to a name the store can restore.

        `.replaced-<step>-<uuid>` (not `.staging-*`) so that a crash before the new one is
        renamed in never loses step N: sweep()/load_latest() rename it back.
        """
        if not os.path.lexists(final):
            return None
        aside = self._store.root / f"{REPLACED_PREFIX}{self.step:012d}-{uuid.uuid4().hex}"
        _retry.rename(final, aside)
        crash_point("after_move_aside")
        return aside

    def _restore_aside(self, aside: Path | None, final: Path) -> None:
        if aside is None:
            return
        try:
            _retry.rename(aside, final)
        except OSError as exc:
            # sweep()/load_latest() will restore it later.
            self._log.error("checkpoint_restore_failed", path=str(aside), reason=str(exc))

    def _sync_root_or_roll_back(self, final: Path, aside: Path | None) -> None:
        """fsync the root after the rename; if that fails the commit is not durable.

        Never retry the fsync (FIELD-NOTES 3): take the new checkpoint back out and
        restore the old one, so the caller can write a fresh one later from memory.
        """
        try:
            fsync_dir(self._store.root)
        except OSError as exc:
            with contextlib.suppress(OSError):
                _retry.rename(final, self.staging)
            shutil.rmtree(self.staging, ignore_errors=True)
            self._restore_aside(aside, final)
            self._state = "aborted"
            raise self._failed("fsync of the checkpoint root", exc) from exc

    # ---- failure handling -------------------------------------------------------------

    @contextlib.contextmanager
    def _failure_guard(self, what: str) -> Iterator[None]:
        """Any OSError fails this checkpoint cleanly: staging removed, previous intact."""
        try:
            yield
        except OSError as exc:
            self.abort()
            raise self._failed(what, exc) from exc
        except BaseException:
            self.abort()
            raise

    def _failed(self, what: str, exc: OSError) -> CheckpointWriteFailed:
        reason = f"checkpoint step {self.step}: {what} failed: {exc}"
        self._log.warning("checkpoint_write_failed", step=self.step, reason=reason)
        return CheckpointWriteFailed(reason)

    def _ensure_open(self) -> None:
        if self._state != "open":
            raise CheckpointError(f"checkpoint writer for step {self.step} is {self._state}")


_COMPARE_BLOCK = 1 << 20


def _staged_files(staging: Path) -> list[str]:
    """Every entry under `staging` as a relative name, directories left out, except the
    manifest. A link or special file is listed too (and refused by the caller)."""
    out: list[str] = []
    for entry in sorted(os.scandir(staging), key=lambda e: e.name):
        if entry.name == MANIFEST_NAME:
            continue
        if entry.is_dir(follow_symlinks=False):
            for sub in sorted(os.scandir(entry.path), key=lambda e: e.name):
                out.append(f"{entry.name}/{sub.name}")
        else:
            out.append(entry.name)
    return out


def _same_bytes(path: Path, view: memoryview) -> bool:
    """Does the regular file at `path` hold exactly `view`? Reads it once, compares with memcmp
    (a bytearray compared with a buffer), stops at the first difference."""
    fd = _retry.open_read(path)
    with io.FileIO(fd, "rb", closefd=True) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(view):
            return False
        block = bytearray(min(_COMPARE_BLOCK, len(view)))
        offset = 0
        while offset < len(view):
            want = min(len(block), len(view) - offset)
            if want < len(block):
                block = bytearray(want)
            if f.readinto(block) != want or block != view[offset : offset + want]:
                return False
            offset += want
        return f.read(1) == b""


def _read_all(path: Path) -> bytes:
    fd = _retry.open_read(path)
    with io.FileIO(fd, "rb", closefd=True) as f:
        return f.readall()
