"""CheckpointStore: lists, verifies, loads, quarantines and prunes committed checkpoints.

Layout under `root` (typically `<run_dir>/checkpoints`): see checkpoints/names.py.
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from checkpoints import _parallel, _retry
from checkpoints._crashpoints import crash_point
from checkpoints._log import Logger, get_logger
from checkpoints.atomic import as_byte_view, fsync_dir, make_dir
from checkpoints.errors import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointUnreadable,
    NoValidCheckpoint,
)
from checkpoints.manifest import FileEntry, parse_file_entries, parse_manifest
from checkpoints.names import (
    CORRUPT_PREFIX,
    MANIFEST_NAME,
    MAX_STEP,
    STAGING_PREFIX,
    CheckpointRef,
    ckpt_name,
    ckpt_step,
    replaced_step,
    validate_name,
)
from checkpoints.repair import Inode, LocalCopies, RepairSource, inode, repair_file
from checkpoints.retention import (
    PinsUnreadable,
    RetentionPolicy,
    eval_score,
    pins_locked,
    read_pins,
)
from checkpoints.writer import CheckpointWriter

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


class CheckpointStore:
    def __init__(
        self,
        root: Path,
        *,
        keep: int = 3,
        keep_best: int = 0,
        keep_every_steps: int | None = None,
        log: Logger | None = None,
    ) -> None:
        # Checked here, not only at retention: a bad value fails where it is given.
        RetentionPolicy(keep, keep_best, keep_every_steps)
        self.root = Path(root)
        self.keep = keep
        self.keep_best = keep_best
        self.keep_every_steps = keep_every_steps
        self.log: Logger = log if log is not None else get_logger("rlsup.checkpoints")

    def path_for(self, step: int) -> Path:
        return self.root / ckpt_name(step)

    # ---- listing ----------------------------------------------------------------------

    def committed(self) -> list[CheckpointRef]:
        """Committed checkpoints by directory name only (nothing verified), oldest first."""
        refs = []
        for entry in self._scan():
            step = ckpt_step(entry.name)
            if step is not None and entry.is_dir(follow_symlinks=False):
                refs.append(CheckpointRef(path=Path(entry.path), step=step))
        return sorted(refs, key=lambda ref: ref.step)

    def latest(self) -> CheckpointRef | None:
        refs = self.committed()
        return refs[-1] if refs else None

    def _scan(self) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(self.root) as it:
                return list(it)
        except FileNotFoundError:
            return []

    # ---- start-up housekeeping --------------------------------------------------------

    def sweep(self) -> list[Path]:
        """Remove leftover `.staging-*` dirs (crashed or failed writes). Call at worker start.

        Also resolves an interrupted same-step replace. Never touches `ckpt-*` or
        `.corrupt-*`. Returns the paths removed.
        """
        removed = self._recover_replaced()
        for entry in self._scan():
            if entry.name.startswith(STAGING_PREFIX):
                self._remove_tree(Path(entry.path))
                removed.append(Path(entry.path))
        if removed:
            self.log.info("checkpoint_sweep", removed=[p.name for p in removed])
        return removed

    def _recover_replaced(self) -> list[Path]:
        """A crash mid-replace can leave step N only as `.replaced-N-*`: put it back."""
        removed = []
        for entry in self._scan():
            step = replaced_step(entry.name)
            if step is None:
                continue
            target = self.path_for(step)
            if os.path.lexists(target):
                self._remove_tree(Path(entry.path))
                removed.append(Path(entry.path))
            else:
                _retry.rename(Path(entry.path), target)
                fsync_dir(self.root)
                self.log.warning("checkpoint_replace_recovered", path=str(target))
        return removed

    # ---- verification and loading -----------------------------------------------------

    def verify(self, ref: CheckpointRef) -> LoadedCheckpoint:
        """Check the manifest and every file's size and sha256.

        Raises CheckpointCorrupt naming every file that failed (not just the first), or
        CheckpointUnreadable when a file could not be read at all (after bounded retries of
        transient errors). Files present but not in the manifest are ignored: only listed files
        are ever read.
        """
        manifest = self._read_manifest(ref)
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

    def load_latest(
        self,
        *,
        salvage: Callable[[str], bool] | None = None,
        before_step: int | None = None,
        whole_first: bool = False,
        sources: Sequence[RepairSource] = (),
    ) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, quarantining newer corrupt ones on the way.

        A damaged file is first repaired from a good copy of its bytes when one exists: another
        file of this store with the same sha256 on another inode, else each of `sources` in
        turn (the mirror's blobs); the copy replaces the damaged file in every checkpoint that
        shares its inode (`LoadedCheckpoint.repaired` says what came from where).

        salvage: files the caller can do without (e.g. replay chunks, whose transitions can be
        dropped). When every file still bad is one of them, the checkpoint is returned with
        `damaged` set instead of quarantined: the rest of it (the learner) is exact, and it is
        the newest. whole_first: an older checkpoint that verifies in full is preferred to a
        newer salvageable one (for arrays whose meaning the caller cannot judge: the SDK's);
        the newest salvageable one is returned only when none is whole, and an older one
        holding the same damaged inode is known damaged without hashing it again.

        A read error is not corruption: CheckpointUnreadable propagates and nothing is moved.
        None only when there is nothing at all to resume from. Raises NoValidCheckpoint when
        checkpoints exist (or were quarantined earlier) but none verifies: a corrupt store must
        be a loud failure, never a silent restart from step 0.
        """
        self._recover_replaced()
        refs = self.committed()
        if before_step is not None:
            refs = [ref for ref in refs if ref.step < before_step]
        if not refs:
            self._refuse_if_only_corrupt()
            return None
        scan = _LoadScan(self, refs, salvage, whole_first, sources)
        loaded = scan.run()
        if loaded is not None:
            return loaded
        tried = "; ".join(f"{name}: {reason}" for name, reason in scan.quarantined)
        raise NoValidCheckpoint(
            f"no checkpoint in {self.root} verified (all quarantined as .corrupt-*): {tried}",
            scan.quarantined,
        )

    def verify_or_repair(
        self, ref: CheckpointRef, sources: Sequence[RepairSource] = ()
    ) -> LoadedCheckpoint:
        """`verify`, with each damaged file repaired from a good copy when one exists (see
        load_latest). Raises CheckpointCorrupt naming the files still bad (and `repaired`)."""
        try:
            return self.verify(ref)
        except CheckpointCorrupt as exc:
            if exc.manifest is None:
                raise
            repaired = self._repair(ref, exc.manifest, exc.bad, sources)
            left = {name: why for name, why in exc.bad.items() if name not in repaired}
            if left:
                raise CheckpointCorrupt(ref.path, left, exc.manifest, repaired) from exc
            return LoadedCheckpoint(ref.path, ref.step, exc.manifest, repaired=repaired)

    def _repair(
        self,
        ref: CheckpointRef,
        manifest: dict[str, Any],
        bad: Mapping[str, str],
        sources: Sequence[RepairSource],
    ) -> dict[str, str]:
        entries = parse_file_entries(manifest["files"])
        names = [name for name in sorted(bad) if name in entries]
        if not names:
            return {}
        refs = self.committed()
        avoid = {found for name in names if (found := inode(ref.path / name)) is not None}
        local = LocalCopies(refs).source(avoid)
        repaired: dict[str, str] = {}
        for name in names:
            where = repair_file(ref, name, entries[name], refs, [local, *sources], self.log)
            if where is not None:
                repaired[name] = where
        if repaired:
            self.log.warning("checkpoint_repaired", path=str(ref.path), files=repaired)
        return repaired

    def newest_meta(self) -> tuple[CheckpointRef, dict[str, Any]] | None:
        """The newest committed checkpoint and its manifest's `meta` (nothing verified, nothing
        moved): what the run in this store was trained for. None when there is none, or when
        its manifest cannot be read or parsed."""
        ref = self.latest()
        if ref is None:
            return None
        try:
            manifest = self._read_manifest(ref)
        except CheckpointError:
            return None
        meta = manifest.get("meta") or {}
        return ref, dict(meta)

    def meta(self, ref: CheckpointRef) -> dict[str, Any]:
        """A committed checkpoint's manifest `meta` (only the manifest is read). Raises
        CheckpointCorrupt or CheckpointUnreadable."""
        meta = self._read_manifest(ref).get("meta") or {}
        return dict(meta)

    def _refuse_if_only_corrupt(self) -> None:
        corrupt = sorted(e.name for e in self._scan() if e.name.startswith(CORRUPT_PREFIX))
        if corrupt:
            raise NoValidCheckpoint(
                f"no committed checkpoint in {self.root}, but quarantined ones exist: "
                f"{', '.join(corrupt)}; remove them to deliberately start from scratch"
            )

    def _read_manifest(self, ref: CheckpointRef) -> dict[str, Any]:
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

    def quarantine(self, step_or_ref: int | CheckpointRef, reason: str) -> Path:
        """Move a committed checkpoint aside as `.corrupt-<name>-<unix time>` (kept for
        forensics, never loaded again) and return its new path.

        For a checkpoint that verifies but is known bad (e.g. workers crash right after loading
        it). FileNotFoundError when no such committed checkpoint exists; OSError when the
        rename fails (nothing moved then). Quarantining the only checkpoint makes the next
        `load_latest()` raise NoValidCheckpoint: a loud failure, never a start from zero.
        """
        if isinstance(step_or_ref, CheckpointRef):
            ref = step_or_ref
        else:
            ref = CheckpointRef(path=self.path_for(step_or_ref), step=step_or_ref)
        if ref.path.parent != self.root or ckpt_step(ref.path.name) is None:
            raise ValueError(f"{ref.path} is not a committed checkpoint of {self.root}")
        if not ref.path.is_dir():
            raise FileNotFoundError(f"no committed checkpoint {ref.path}")
        dest = self._corrupt_name(ref.path.name)
        _retry.rename(ref.path, dest)
        fsync_dir(self.root)
        self.log.warning(
            "checkpoint_quarantined", path=str(ref.path), reason=reason, moved_to=str(dest)
        )
        return dest

    def _quarantine(self, ref: CheckpointRef, reason: str) -> None:
        dest = self._corrupt_name(ref.path.name)
        try:
            _retry.rename(ref.path, dest)
            fsync_dir(self.root)
        except OSError as exc:
            # Still skipped this time; it will fail verification again next time.
            self.log.error(
                "checkpoint_quarantine_failed", path=str(ref.path), reason=reason, error=str(exc)
            )
            return
        self.log.warning(
            "checkpoint_corrupt", path=str(ref.path), reason=reason, moved_to=str(dest)
        )

    def _corrupt_name(self, name: str) -> Path:
        base = self.root / f"{CORRUPT_PREFIX}{name}-{int(time.time())}"
        dest, n = base, 0
        while os.path.lexists(dest):
            n += 1
            dest = base.with_name(f"{base.name}-{n}")
        return dest

    # ---- writing and retention --------------------------------------------------------

    def begin(self, step: int, meta: Mapping[str, Any]) -> CheckpointWriter:
        if type(step) is not int or not 0 <= step <= MAX_STEP:
            raise ValueError(f"step must be an int in [0, {MAX_STEP}], got {step!r}")
        # Fail on unserialisable meta now, not after gigabytes have been written.
        json.dumps(meta, allow_nan=False)
        self._ensure_root()
        return CheckpointWriter(self, step, dict(meta))

    def _ensure_root(self) -> None:
        if self.root.is_dir():
            return
        self.root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            make_dir(self.root)
            # The first checkpoint is only durable if the root's own entry is.
            fsync_dir(self.root.parent)

    @property
    def policy(self) -> RetentionPolicy:
        return RetentionPolicy(self.keep, self.keep_best, self.keep_every_steps)

    def apply_retention(self, known_good: int | None = None) -> list[Path]:
        """Delete the committed checkpoints the policy does not keep; return what was deleted.

        Kept (checkpoints/retention.py): the newest `keep`, the best `keep_best` by the
        evaluation their manifest records, the milestones of `keep_every_steps` and the pinned
        ones (`pins.json`, read under the lock `rlsup pin` takes).

        Only ever on proof that a kept one newer than everything deleted is whole: `known_good`
        (the step just committed by this process, every byte of which was hashed or compared
        as it was written or linked), else the newest such kept checkpoint that verifies in
        full. Sizes prove nothing (a flipped bit keeps them), so when none verifies nothing is
        deleted: the newest valid checkpoint is never among the deleted. Each checkpoint holds
        its own hard links, so deleting one never touches the bytes of another. Deleted
        oldest first, each renamed away before it is removed: a kill at any point leaves every
        kept checkpoint whole and at most one `.staging-*` leftover, swept at the next start.
        """
        refs = self.committed()
        if len(refs) <= self.keep:
            return []
        with pins_locked(self.root):
            return self._apply_retention(self.committed(), known_good)

    def kept(self, refs: list[CheckpointRef] | None = None) -> dict[int, list[str]]:
        """The committed steps the policy keeps now, each with why ("newest", "best",
        "milestone", "pinned", "unread": a manifest that could not be read this time, whose
        evaluation may be the best). Nothing is verified or deleted. Raises PinsUnreadable."""
        refs = self.committed() if refs is None else refs
        pinned = read_pins(self.root)
        scores, unread = self._scores(refs) if self.keep_best else ({}, set())
        why = self.policy.select((ref.step for ref in refs), scores, pinned)
        for step in unread:
            why.setdefault(step, []).append("unread")
        return why

    def _apply_retention(self, refs: list[CheckpointRef], known_good: int | None) -> list[Path]:
        try:
            why = self.kept(refs)
        except PinsUnreadable as exc:
            self.log.warning("checkpoint_retention_held", reason=f"the pins cannot be read: {exc}")
            return []
        kept = [ref for ref in refs if ref.step in why]
        doomed = [ref for ref in refs if ref.step not in why]
        if not doomed:
            return []
        # Only a kept checkpoint newer than every doomed one proves the newest valid one is
        # not among them (the newest `keep` always are).
        proof = [ref for ref in kept if ref.step > doomed[-1].step]
        if known_good not in {ref.step for ref in proof} and not any(
            self._verifies(ref) for ref in reversed(proof)
        ):
            self.log.warning(
                "checkpoint_retention_held",
                reason="no kept checkpoint verifies: older ones are kept too",
                kept=[ref.path.name for ref in proof],
            )
            return []
        deleted = []
        for ref in doomed:
            try:
                self._remove_tree(ref.path)
            except OSError as exc:
                self.log.warning("checkpoint_retention_failed", path=str(ref.path), error=str(exc))
                continue
            deleted.append(ref.path)
        if deleted:
            self.log.info(
                "checkpoint_retention_kept",
                kept={ref.path.name: why[ref.step] for ref in kept},
            )
        return deleted

    def _scores(self, refs: list[CheckpointRef]) -> tuple[dict[int, float], set[int]]:
        """Each checkpoint's evaluation mean from its manifest (nothing verified beyond the
        manifest's own structure), and the steps whose manifest could not be read this time
        (a read error, not damage: kept until it can be). A damaged manifest has no score."""
        scores: dict[int, float] = {}
        unread: set[int] = set()
        for ref in refs:
            try:
                score = eval_score(self._read_manifest(ref).get("meta"))
            except CheckpointUnreadable:
                unread.add(ref.step)
                continue
            except CheckpointCorrupt:
                continue
            if score is not None:
                scores[ref.step] = score
        return scores, unread

    def retain_after_commit(self, committed_step: int) -> None:
        """Retention after a successful commit: a failure here must not fail the commit."""
        try:
            deleted = self.apply_retention(known_good=committed_step)
        except OSError as exc:
            self.log.warning("checkpoint_retention_failed", path=str(self.root), error=str(exc))
            return
        if deleted:
            self.log.info("checkpoint_retention", deleted=[p.name for p in deleted])

    def _verifies(self, ref: CheckpointRef) -> bool:
        try:
            self.verify(ref)
        except CheckpointError:
            return False
        return True

    def _remove_tree(self, path: Path) -> None:
        """Rename out of the way first, so a crash mid-delete never leaves a half-deleted
        `ckpt-*` that a later load would have to quarantine; the leftover is swept."""
        if not path.name.startswith(STAGING_PREFIX):
            doomed = self.root / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
            _retry.rename(path, doomed)
            crash_point("after_remove_rename")
            path = doomed
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        crash_point("after_remove")


class _LoadScan:
    """One `load_latest` pass, newest first: what it quarantined, and (whole_first) the
    salvageable checkpoints it passed over while looking for a whole one."""

    def __init__(
        self,
        store: CheckpointStore,
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
