"""CheckpointStore: lists, verifies, loads, quarantines and prunes committed checkpoints.

Layout under `root` (typically `<run_dir>/checkpoints`): see checkpoints/names.py. Reading a
checkpoint (its files checked against the manifest, `LoadedCheckpoint`, one `load_latest` pass)
is checkpoints/reading.py's; writing one is checkpoints/writer.py's (`begin()` hands it out).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from checkpoints import _retry, reading
from checkpoints._crashpoints import crash_point
from checkpoints._log import Logger, get_logger
from checkpoints.atomic import fsync_dir, make_dir
from checkpoints.errors import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointUnreadable,
    NoValidCheckpoint,
)
from checkpoints.manifest import parse_file_entries
from checkpoints.names import (
    CORRUPT_PREFIX,
    MAX_STEP,
    STAGING_PREFIX,
    CheckpointRef,
    ckpt_name,
    ckpt_step,
    replaced_step,
)
from checkpoints.reading import LoadedCheckpoint, LoadScan
from checkpoints.repair import LocalCopies, RepairSource, inode, repair_file
from checkpoints.retention import (
    PinsUnreadable,
    RetentionPolicy,
    eval_score,
    pins_locked,
    read_pins,
)
from checkpoints.writer import CheckpointWriter

# LoadedCheckpoint lives in checkpoints/reading.py; callers import it from here as well.
__all__ = ["CheckpointStore", "LoadedCheckpoint"]


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
        return reading.verify(ref)

    def load_latest(
        self,
        *,
        salvage: Callable[[str], bool] | None = None,
        before_step: int | None = None,
        whole_first: bool = False,
        sources: Sequence[RepairSource] = (),
        verify_on_read: Callable[[str], bool] | None = None,
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

        verify_on_read: salvageable files (a replay buffer's chunks) whose size is checked here
        but whose sha256 is checked as the caller reads them (`read_into`, `read_many_into`):
        one pass over the disk instead of a hashing pass and a reading pass. A mismatch found
        then is repaired as above when a good copy exists, else the file joins `damaged` and
        is reported (`checkpoint_salvaged`, when="read"); its bytes are never handed over as
        good. Not with whole_first: a file found damaged after the choice was made cannot send
        the scan to an older checkpoint.

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
        if verify_on_read is not None and (whole_first or salvage is None):
            raise ValueError("verify_on_read needs salvage and cannot go with whole_first")
        on_read = None
        if verify_on_read is not None and salvage is not None:
            can_lose, later = salvage, verify_on_read
            on_read = lambda name: can_lose(name) and later(name)  # noqa: E731
        scan = LoadScan(self, refs, salvage, whole_first, sources, on_read)
        loaded = scan.run()
        if loaded is not None:
            return loaded
        tried = "; ".join(f"{name}: {reason}" for name, reason in scan.quarantined)
        raise NoValidCheckpoint(
            f"no checkpoint in {self.root} verified (all quarantined as .corrupt-*): {tried}",
            scan.quarantined,
        )

    def verify_or_repair(
        self,
        ref: CheckpointRef,
        sources: Sequence[RepairSource] = (),
        verify_on_read: Callable[[str], bool] | None = None,
    ) -> LoadedCheckpoint:
        """`verify`, with each damaged file repaired from a good copy when one exists (see
        load_latest). Raises CheckpointCorrupt naming the files still bad (and `repaired`).
        verify_on_read: see load_latest; the checkpoint repairs such files as it reads them."""
        try:
            loaded = reading.verify(ref, verify_on_read)
        except CheckpointCorrupt as exc:
            if exc.manifest is None:
                raise
            repaired = self._repair(ref, exc.manifest, exc.bad, sources)
            left = {name: why for name, why in exc.bad.items() if name not in repaired}
            if left:
                raise CheckpointCorrupt(ref.path, left, exc.manifest, repaired) from exc
            loaded = LoadedCheckpoint(
                ref.path, ref.step, exc.manifest, repaired=repaired, verify_on_read=verify_on_read
            )
        return self.repairing_on_read(loaded, sources)

    def repairing_on_read(
        self, loaded: LoadedCheckpoint, sources: Sequence[RepairSource]
    ) -> LoadedCheckpoint:
        """`loaded`, set to repair (from this store's copies, then `sources`) and report the
        files it finds damaged as it reads them (those not verified before: `unverified`)."""
        ref = CheckpointRef(path=loaded.path, step=loaded.step)
        loaded.repair_with(lambda bad: self._repair(ref, loaded.manifest, bad, sources), self.log)
        return loaded

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
        return reading.read_manifest(ref)

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
