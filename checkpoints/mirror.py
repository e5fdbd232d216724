"""Mirroring committed local checkpoints to object storage, and restoring from it.

Upload: every file of a committed checkpoint becomes the blob of its manifest sha256 unless the
bucket already holds that blob (HEAD: size and sha256 metadata), so an incremental checkpoint
uploads only its new bytes; a local file is hashed before it is uploaded (a file that rotted on
this disk is never mirrored as good); the checkpoint's MANIFEST.json goes last, written once.

Restore: the newest remote manifest whose blobs all arrive intact is written through the local
store's normal writer (staging, fsync, manifest, rename) and so verifies like any checkpoint; a
damaged or missing blob aborts that one and the next older manifest is tried.

Garbage: the newest `keep` manifests of each game stay, and those its local retention keeps
beyond them (best-evaluated, milestones, pinned: checkpoints/retention.py); blobs are swept
after the manifests, only when no manifest names them and they are older than a grace period
(an upload in flight has blobs but no manifest yet).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoints.errors import CheckpointCorrupt, CheckpointError, CheckpointWriteFailed
from checkpoints.manifest import FileEntry, parse_file_entries, parse_manifest
from checkpoints.names import MANIFEST_NAME, CheckpointRef, ckpt_name
from checkpoints.remote import RemoteContentError, RemoteError, RemoteStore
from checkpoints.repair import RepairSource
from checkpoints.retention import RetentionPolicy, eval_score
from checkpoints.store import CheckpointStore

BLOB_GRACE_S = 3600.0


@dataclass
class Uploaded:
    step: int
    files: int = 0
    bytes_uploaded: int = 0
    bytes_present: int = 0  # already in the bucket (shared with an earlier checkpoint)
    new_manifest: bool = True
    seconds: float = 0.0


def _sha256_of(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def upload_checkpoint(
    remote: RemoteStore, game: str, ref: CheckpointRef, epoch: int | None = None
) -> Uploaded:
    """Mirror one committed local checkpoint. Raises CheckpointError (a local file that no
    longer matches its manifest, or an unreadable manifest) or RemoteError; a manifest is
    only written after every blob it names is present and verified. With a placement
    `epoch` (several hosts), PlacementFenced when the game's fence has moved past it: then
    no manifest is written (its blobs, named by no manifest, age out as garbage)."""
    started = time.monotonic()
    raw = (ref.path / MANIFEST_NAME).read_bytes()
    manifest = parse_manifest(raw, ref.step)
    out = Uploaded(ref.step)
    for name, entry in sorted(parse_file_entries(manifest["files"]).items()):
        out.files += 1
        if remote.has_blob(entry.sha256, entry.size):
            out.bytes_present += entry.size
            continue
        path = ref.path / name
        size, digest = _sha256_of(path)
        if (size, digest) != (entry.size, entry.sha256):
            raise CheckpointError(
                f"{path}: {size} bytes, sha256 {digest[:12]} no longer match the manifest "
                f"({entry.size} bytes, {entry.sha256[:12]}): not mirrored"
            )
        remote.put_blob(path, entry.sha256)
        if not remote.has_blob(entry.sha256, entry.size):
            # A server that accepts any PUT and answers any HEAD without our metadata (a web
            # server, not S3) ends here.
            raise remote.error(f"blob {entry.sha256[:12]} of {name}", "not there after upload")
        out.bytes_uploaded += entry.size
    if epoch is not None:
        remote.check_fence(game, epoch)
    out.new_manifest = remote.put_manifest(game, ref.step, raw)
    out.seconds = time.monotonic() - started
    return out


def newest_meta(remote: RemoteStore, game: str) -> tuple[int, dict[str, Any]] | None:
    """The step and `meta` of the game's newest mirrored manifest (None: none mirrored)."""
    steps = remote.manifest_steps(game)
    if not steps:
        return None
    manifest = parse_manifest(remote.get_manifest(game, steps[-1]), steps[-1])
    meta = manifest.get("meta")
    return steps[-1], dict(meta) if isinstance(meta, dict) else {}


@dataclass
class Restored:
    step: int
    bytes_downloaded: int
    skipped: list[str]  # "ckpt-<step>: why" for each newer manifest that could not be used


def same_run(want: dict[str, object]) -> Callable[[dict[str, object]], str | None]:
    """`accept` for `restore_newest`: a manifest whose meta names another game or algorithm
    than `want` is refused with a reason (a key it lacks is no objection)."""

    def accept(meta: dict[str, object]) -> str | None:
        if all(meta.get(key) in (None, value) for key, value in want.items()):
            return None
        return f"a checkpoint of {meta.get('game')} / {meta.get('algo')}"

    return accept


def restore_newest(
    remote: RemoteStore,
    game: str,
    store: CheckpointStore,
    accept: Callable[[dict[str, object]], str | None] = lambda meta: None,
) -> Restored | None:
    """Commit the newest mirrored checkpoint of `game` whose blobs all verify into `store`;
    None when the mirror has none. `accept(meta)` may refuse a manifest (a reason): one of
    another env_id or algo."""
    skipped: list[str] = []
    for step in reversed(remote.manifest_steps(game)):
        try:
            manifest = parse_manifest(remote.get_manifest(game, step), step)
            meta = manifest.get("meta") or {}
            why = accept(meta)
            if why is not None:
                skipped.append(f"{ckpt_name(step)}: {why}")
                continue
            files = parse_file_entries(manifest["files"])
            done = _download(remote, store, step, meta, files)
        except (RemoteContentError, CheckpointCorrupt) as exc:
            skipped.append(f"{ckpt_name(step)}: {exc}")  # this one is damaged: try older
            continue
        except (RemoteError, CheckpointWriteFailed):
            raise  # the store or the local disk failed: no verdict on any checkpoint
        except CheckpointError as exc:  # a manifest that does not parse
            skipped.append(f"{ckpt_name(step)}: {exc}")
            continue
        return Restored(step, done, skipped)
    if skipped:
        raise CheckpointError(
            f"no mirrored checkpoint of {game} could be restored: " + "; ".join(skipped)
        )
    return None


def _download(
    remote: RemoteStore,
    store: CheckpointStore,
    step: int,
    meta: dict[str, object],
    files: dict[str, FileEntry],
) -> int:
    writer = store.begin(step, meta)
    total = 0
    try:
        for name, entry in sorted(files.items()):
            got = writer.write_stream(name, remote.blob_chunks(entry.sha256, entry.size))
            if got != entry:
                raise RemoteContentError(f"{name}: downloaded {got}, manifest says {entry}")
            total += entry.size
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    return total


def blob_source(remote: RemoteStore) -> RepairSource:
    """The mirror as a source of good bytes for a damaged local file (CheckpointStore's
    `sources`): its blob of the file's sha256, verified as it is written. A blob that is
    missing or damaged, or a mirror that cannot be read, repairs nothing (the store goes on
    to salvage or quarantine, as without a mirror)."""
    where = f"the mirror s3://{remote.where.bucket}/{remote.where.prefix}"

    def candidates(name: str, entry: FileEntry) -> Iterator[tuple[str, Iterable[bytes]]]:
        yield where, remote.blob_chunks(entry.sha256, entry.size)

    return candidates


@dataclass
class Collected:
    manifests_deleted: int = 0
    blobs_deleted: int = 0
    sweep_skipped: str | None = None  # why no blob was swept (a manifest that cannot be read)


@dataclass(frozen=True)
class GameRetention:
    """What a game keeps beyond the mirror's newest `keep` (the local store's policy): its
    `keep_best` and `keep_every_steps`, and the steps pinned on its host."""

    keep_best: int = 0
    keep_every_steps: int | None = None
    pinned: frozenset[int] = frozenset()


def collect_garbage(
    remote: RemoteStore,
    keep: int,
    now: float | None = None,
    grace_s: float = BLOB_GRACE_S,
    games: Mapping[str, GameRetention] | None = None,
) -> Collected:
    """Keep each game's newest `keep` manifests, and (`games`) its best-evaluated, milestone
    and pinned ones as its local store does (checkpoints/retention.py); then delete blobs no
    remaining manifest names and older than `grace_s` (mark, then sweep: never a blob before
    its manifests). A kept manifest that cannot be read stops the sweep: its blobs are
    unknown."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    out = Collected()
    live: set[str] = set()
    for game in remote.games():
        policy = (games or {}).get(game, GameRetention())
        steps = remote.manifest_steps(game)
        retention = RetentionPolicy(keep, policy.keep_best, policy.keep_every_steps)
        parsed: dict[int, dict[str, Any] | CheckpointError] = {}
        scores: dict[int, float] = {}
        if policy.keep_best:
            for step in steps:
                parsed[step] = _parsed(remote, game, step)
                got = parsed[step]
                if not isinstance(got, CheckpointError):
                    score = eval_score(got.get("meta"))
                    if score is not None:
                        scores[step] = score
        kept = retention.select(steps, scores, policy.pinned)
        for step in steps:
            if step not in kept:
                remote.delete(remote.manifest_key(game, step))
                out.manifests_deleted += 1
        for step in kept:
            got = parsed[step] if step in parsed else _parsed(remote, game, step)
            try:
                if isinstance(got, CheckpointError):
                    raise got
                files = parse_file_entries(got["files"])
            except CheckpointError as exc:
                out.sweep_skipped = f"{game}/{ckpt_name(step)}: {exc}"
                continue
            live.update(e.sha256 for e in files.values())
    if out.sweep_skipped is not None:
        return out
    cutoff = (time.time() if now is None else now) - grace_s
    for sha, modified in remote.blobs().items():
        if sha not in live and modified < cutoff:
            remote.delete(remote.blob_key(sha))
            out.blobs_deleted += 1
    return out


def _parsed(remote: RemoteStore, game: str, step: int) -> dict[str, Any] | CheckpointError:
    """A mirrored manifest, or why it does not parse (RemoteError propagates: no verdict)."""
    try:
        return parse_manifest(remote.get_manifest(game, step), step)
    except CheckpointError as exc:
        return exc
