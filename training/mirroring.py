"""The checkpoint mirror as one worker session sees it: restoring the newest mirrored
checkpoint into an empty (or superseded) local store, and the placement fence checked before
each commit on several hosts. boto3 (through checkpoints.remote) is imported only when a
mirror is configured.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from checkpoints import CheckpointError, CheckpointStore, CheckpointWriteFailed
from training.args import WorkerConfig
from training.checkpointing import checkpoint_meta
from training.errors import CheckpointUnreadableError, NoValidCheckpointError
from training.protocol import CHECKPOINT_DIR, Phase

if TYPE_CHECKING:
    from training.heartbeat import HeartbeatWriter

MIRROR_RESTORE_DEADLINE_S = 3600.0  # a download may take long: the step need not move


class Mirror:
    """The game's folder in the mirror (`--mirror-url`, `--mirror-name`) for one session: it
    reports what it restores or moves aside in the session's heartbeat and log."""

    def __init__(
        self,
        cfg: WorkerConfig,
        run_dir: Path,
        log: structlog.stdlib.BoundLogger,
        hb: HeartbeatWriter,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.log = log
        self.hb = hb
        self.tried = False  # once per session: a restored copy that fails is final
        self._remote_store: Any = None

    def remote(self) -> Any:
        from checkpoints.remote import RemoteLocation, RemoteStore, make_client

        if self._remote_store is None:
            assert self.cfg.mirror_url
            client = make_client(self.cfg.mirror_endpoint_url, self.cfg.mirror_region)
            self._remote_store = RemoteStore(client, RemoteLocation.parse(self.cfg.mirror_url))
        return self._remote_store

    def name(self) -> str:
        return self.cfg.mirror_name or self.run_dir.name

    def repair_sources(self) -> list[Any]:
        """The mirror as a source of good bytes for a damaged replay chunk (one that every
        checkpoint may share, so that no older checkpoint is whole): its blob of the chunk's
        sha256. Any other damaged file has an exact predecessor (the previous checkpoint), as
        without a mirror. None without a mirror; the client is made only when a chunk is found
        damaged."""
        if not self.cfg.mirror_url:
            return []

        def from_mirror(name: str, entry: Any) -> Any:
            from training.replay import is_chunk_file

            if not is_chunk_file(name):
                return
            from checkpoints.mirror import blob_source
            from checkpoints.remote import RemoteError

            try:
                remote = self.remote()
            except Exception as exc:  # no client at all (boto3, endpoint): no repair, no crash
                raise RemoteError(f"mirror {self.cfg.mirror_url}: no client: {exc}") from exc
            yield from blob_source(remote)(name, entry)

        return [from_mirror]

    def check_fence(self) -> None:
        """Before each commit: raise PlacementFenced when the game was placed elsewhere since.
        A mirror that cannot be read cannot say so: the commit goes on (a checkpoint of an
        older placement is superseded when the game comes back here: `superseded`)."""
        from checkpoints.remote import RemoteError

        try:
            self.remote().check_fence(self.name(), self.cfg.epoch)
        except RemoteError as exc:
            self.log.warning("fence_unreadable", error=str(exc), epoch=self.cfg.epoch)

    def superseded(self, store: CheckpointStore) -> bool:
        """A new placement on a host that holds this game's checkpoints of an earlier one:
        when the mirror's newest is ahead of the local newest by (placement epoch, step), the
        local ones belong to a superseded placement (the game ran elsewhere since). They are
        moved aside (`checkpoints.superseded/`, the previous such copy removed) and the
        mirror's newest is restored instead. A mirror that cannot be read keeps them. Where the
        local newest is of the placement just before this one, the mirror is not asked."""
        from checkpoints.mirror import newest_meta
        from checkpoints.remote import RemoteError

        newest = store.newest_meta()
        if newest is None:
            return False
        local = (int(newest[1].get("epoch") or 0), newest[0].step)
        if self.cfg.epoch and local[0] == self.cfg.epoch - 1:
            # The placement just before this one ran on this host (each placement moves the
            # epoch by one): no other placement has mirrored anything since, so the mirror is
            # not asked (two requests, ~0.1-0.5 s of a restart in place).
            self.log.info("mirror_check_skipped", local=list(local), epoch=self.cfg.epoch)
            return False
        try:
            remote = newest_meta(self.remote(), self.name())
        except RemoteError as exc:
            self.log.warning("mirror_unreadable", error=str(exc), kept="local checkpoints")
            return False
        if remote is None or (int(remote[1].get("epoch") or 0), remote[0]) <= local:
            return False
        aside = self.run_dir / (CHECKPOINT_DIR + ".superseded")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(store.root, aside)
        entry = {"local": list(local), "mirror": [int(remote[1].get("epoch") or 0), remote[0]],
                 "moved_to": str(aside)}  # fmt: skip
        self.log.warning("local_checkpoints_superseded", **entry)
        self.hb.update(superseded=entry)
        return True

    def restore(self, store: CheckpointStore, url: str) -> bool:
        """No local checkpoint (a fresh machine, a wiped disk, every one damaged): commit the
        newest mirrored one whose blobs all verify into the local store (True), to be loaded
        like any other; False when the mirror has none of this game. A mirror
        that cannot be read is a read error (retried after a backoff), never a start from
        zero; one that holds only checkpoints that cannot be used is refused the same way."""
        from checkpoints.mirror import restore_newest, same_run  # boto3: only with a mirror
        from checkpoints.remote import RemoteError, RemoteLocation, RemoteStore, make_client

        self.tried = True
        self.hb.set_phase(Phase.LOADING, MIRROR_RESTORE_DEADLINE_S)
        name = self.name()
        try:
            client = make_client(self.cfg.mirror_endpoint_url, self.cfg.mirror_region)
            remote = RemoteStore(client, RemoteLocation.parse(url))
            restored = restore_newest(
                remote, name, store, accept=same_run(checkpoint_meta(self.cfg))
            )
        except RemoteError as exc:
            raise CheckpointUnreadableError(
                f"no local checkpoint in {store.root} and the mirror {url} cannot be read: "
                f"{exc}; not starting from zero (retried after a backoff)"
            ) from exc
        except CheckpointWriteFailed as exc:
            raise CheckpointUnreadableError(
                f"no local checkpoint in {store.root} and the one restored from the mirror "
                f"{url} could not be written there: {exc}; nothing half-written is kept "
                "(retried after a backoff)"
            ) from exc
        except CheckpointError as exc:
            raise NoValidCheckpointError(
                f"no local checkpoint in {store.root} and none in the mirror {url} can be "
                f"used: {exc}; refusing to start from zero (remove [mirror] to start fresh)"
            ) from exc
        if restored is None:
            self.log.info("mirror_empty", url=url, game=name)
            return False
        entry = {"step": restored.step, "bytes": restored.bytes_downloaded,
                 "skipped": restored.skipped, "url": url}  # fmt: skip
        self.log.warning("mirror_restored", **entry)
        self.hb.update(mirror_restore=entry)
        return True
