"""Resuming a run: the newest checkpoint that verifies and loads, and the learner built from it.

The start of a session (training/session.py) before it trains: it refuses a checkpoint of
another game or algorithm, quarantines what does not verify (falling back to an older one, or
to the mirror's), tells a read error from corruption, seeds the RNGs for this resume and builds
the learner, reporting each step in the heartbeat.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from pickle import UnpicklingError  # raised by torch.load(weights_only=True)
from typing import TYPE_CHECKING, Any

import structlog
import torch

from checkpoints import (
    CheckpointCorrupt,
    CheckpointStore,
    CheckpointUnreadable,
    LoadedCheckpoint,
    NoValidCheckpoint,
)
from training import rng
from training.args import ConfigError, WorkerConfig
from training.checkpointing import checkpoint_meta, restore_learner
from training.device import is_out_of_memory
from training.errors import CheckpointMismatch, CheckpointUnreadableError, NoValidCheckpointError
from training.heartbeat import HeartbeatWriter
from training.mirroring import Mirror
from training.protocol import Phase
from training.replay import is_chunk_file

if TYPE_CHECKING:
    from training.learner import Learner


def loading_deadline_s(nbytes: int) -> float:
    return 120.0 + nbytes / 20e6  # verify + read at a pessimistic 20 MB/s


class Resumer:
    """One session's way back to where its run was; `load_newest`, then `restore`."""

    def __init__(
        self,
        cfg: WorkerConfig,
        log: structlog.stdlib.BoundLogger,
        hb: HeartbeatWriter,
        mirror: Mirror,
    ) -> None:
        self.cfg = cfg
        self.log = log
        self.hb = hb
        self.mirror = mirror
        self._learner: Learner | None = None  # being built; handed over by restore()
        self._repairs_reported: dict[Path, set[str]] = {}  # checkpoint -> files reported

    def load_newest(self, store: CheckpointStore) -> LoadedCheckpoint | None:
        # Before anything is verified or moved: a run is never resumed as another game.
        newest = store.newest_meta()
        if newest is not None:
            self._check_same_run(store, newest[0].path.name, newest[1])
        latest = store.latest()
        self.hb.set_phase(
            Phase.LOADING, loading_deadline_s(_dir_bytes(latest.path if latest else None))
        )
        try:
            loaded = store.load_latest(
                salvage=is_chunk_file,
                sources=self.mirror.repair_sources(),
                verify_on_read=is_chunk_file,  # hashed as they are read: one pass over the disk
            )
        except NoValidCheckpoint as exc:
            # Every local checkpoint was damaged (now quarantined): the mirror's may be whole.
            url = None if self.mirror.tried else self.cfg.mirror_url
            if not (url and self.mirror.restore(store, url)):
                raise NoValidCheckpointError(
                    f"checkpoints exist in {store.root} but none verifies; refusing to start "
                    f"from zero: {exc}"
                ) from exc
            names = [f"{name} ({reason})" for name, reason in exc.quarantined]
            self.log.warning("local_checkpoints_quarantined", quarantined=names)
            self.hb.update(quarantined=[*self.hb.current.quarantined, *names])
            loaded = self.load_newest(store)
        except CheckpointUnreadable as exc:
            raise CheckpointUnreadableError(
                f"{exc}; it was not moved (a read error is not corruption): the next start "
                "tries it again"
            ) from exc
        if loaded is None:
            return None
        self._check_same_run(store, loaded.path.name, loaded.meta)
        if loaded.quarantined:
            names = [f"{name} ({reason})" for name, reason in loaded.quarantined]
            self.log.warning("resumed_from_older_checkpoint", step=loaded.step, quarantined=names)
            self.hb.update(quarantined=[*self.hb.current.quarantined, *names])
        self._report_repairs(loaded)
        return loaded

    def _report_repairs(self, loaded: LoadedCheckpoint) -> None:
        """Rot put right from a good copy, found by the load or later as the replay chunks were
        read (each reported once): nothing lost, still reported."""
        reported = self._repairs_reported.get(loaded.path, set())
        new = {name: where for name, where in loaded.repaired.items() if name not in reported}
        if not new:
            return
        self._repairs_reported[loaded.path] = reported | set(new)
        entry = {
            "checkpoint": loaded.path.name,
            "when": "load",
            "files": sorted(new),
            "repaired": new,
            "transitions_dropped": 0,
        }
        self.hb.update(replay_damage=[*self.hb.current.replay_damage, entry])

    def _check_same_run(self, store: CheckpointStore, name: str, meta: dict[str, Any]) -> None:
        want = checkpoint_meta(self.cfg)
        if all(meta.get(key) in (None, value) for key, value in want.items()):
            return
        was = f"{meta.get('game')} / {meta.get('algo')}"
        now = f"{want['game']} / {want['algo']}"
        raise CheckpointMismatch(
            f"{store.root} holds checkpoints of {was} ({name}), but this worker is configured "
            f"for {now}: a checkpoint of one game or algorithm is never loaded for another. To "
            f"continue that run, set env_id/algo back to {was}; to start this game fresh, move "
            f"{store.root} aside (or give the game a new name)"
        )

    def restore(
        self, device: torch.device, store: CheckpointStore, loaded: LoadedCheckpoint | None
    ) -> tuple[Learner, LoadedCheckpoint | None, dict[str, Any]]:
        """Build the learner from the newest checkpoint that also *loads* safely; the learner
        is the caller's from then on (whatever is raised instead, the learner built on the way
        is closed first).

        A checkpoint can verify (its bytes are the ones that were written) and still be refused
        by the weights-only loader: one crafted to run code on load, say. That is a corrupt
        checkpoint, not a crash to retry: quarantine it and fall back to the previous one. A
        read error while loading is not: the checkpoint stays and the worker exits
        `checkpoint_unreadable`.
        """
        try:
            loaded, counters = self._build_from_newest_loadable(device, store, loaded)
        except BaseException:
            if self._learner is not None:
                self._learner.close()
                self._learner = None
            raise
        learner, self._learner = self._learner, None
        assert learner is not None, "restored without a learner"
        return learner, loaded, counters

    def _build_from_newest_loadable(
        self, device: torch.device, store: CheckpointStore, loaded: LoadedCheckpoint | None
    ) -> tuple[LoadedCheckpoint | None, dict[str, Any]]:
        while True:
            try:
                counters = self._build_learner(device, loaded)
            except (UnpicklingError, CheckpointCorrupt) as exc:
                if loaded is None:
                    raise
                self._quarantine_refused(store, loaded, exc)
                loaded = self.load_newest(store)
                continue
            except CheckpointUnreadable as exc:
                raise CheckpointUnreadableError(
                    f"{exc}; it was not moved: the next start tries it again"
                ) from exc
            self._report_replay_damage(loaded)
            return loaded, counters

    def _quarantine_refused(
        self, store: CheckpointStore, loaded: LoadedCheckpoint, exc: Exception
    ) -> None:
        what = "refused by the weights-only loader" if isinstance(exc, UnpicklingError) else ""
        reason = f"{what or 'changed since it was verified'}: {exc}"[:300]
        store.quarantine(loaded.step, reason)
        self.log.warning("checkpoint_refused", path=str(loaded.path), reason=reason)
        name = f"{loaded.path.name} ({reason})"
        self.hb.update(quarantined=[*self.hb.current.quarantined, name])
        if self._learner is not None:
            self._learner.close()
            self._learner = None

    def _report_replay_damage(self, loaded: LoadedCheckpoint | None) -> None:
        if loaded is not None:
            self._report_repairs(loaded)  # those found as the chunks were read
        damage = getattr(getattr(self._learner, "replay", None), "load_damage", None)
        if loaded is None or not damage:
            return
        entry = {"checkpoint": loaded.path.name, "when": "load", **damage}
        self.log.warning("replay_damaged", **entry)
        self.hb.update(replay_damage=[*self.hb.current.replay_damage, entry])

    def _build_learner(
        self, device: torch.device, loaded: LoadedCheckpoint | None
    ) -> dict[str, Any]:
        from training.registry import make_learner

        prior: dict[str, Any] = loaded.read_json("state.json") if loaded is not None else {}
        resume_count = int(prior.get("resume_count", -1)) + 1 if loaded is not None else 0
        rng.seed_everything(self.cfg.seed + resume_count)
        env_seed = rng.derive_env_seed(self.cfg.seed, resume_count)
        learner = self._learner = make_learner(self.cfg, device, env_seed)
        learner.warmup_optimizer()
        if loaded is not None:
            try:
                prior = restore_learner(loaded, learner, device)
            except (RuntimeError, KeyError, ValueError) as exc:
                if is_out_of_memory(exc):
                    raise  # exit 76: the policy steps down, the checkpoint is fine
                raise ConfigError(
                    f"checkpoint {loaded.path} does not fit this configuration "
                    f"(changed network or algorithm?): {exc}"
                ) from exc
            self.log.info("resumed", step=loaded.step, resume_count=resume_count)
        self.hb.live_step = lambda: int(learner.global_step)  # steps move within an iteration
        self.hb.update(
            global_step=learner.global_step,
            resumed_from_step=loaded.step if loaded is not None else None,
            last_checkpoint_step=loaded.step if loaded is not None else None,
            num_envs=self.cfg.num_envs,
            batch_size=self.cfg.train_batch_size(),
            resume_count=resume_count,
            episodes=learner.tracker.episodes,
            mean_return=learner.tracker.mean_return(),
            precision=learner.precision.name,
        )
        return {
            "resume_count": resume_count,
            "wall_time_s": float(prior.get("wall_time_s", 0.0)),
            "session_started": time.monotonic(),
            # When the loaded checkpoint's state was captured: a checkpoint.request older
            # than that is already satisfied.
            "loaded_time": _float_or_none(prior.get("time")) if loaded is not None else None,
        }


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _dir_bytes(path: Path | None) -> int:
    if path is None:
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total
