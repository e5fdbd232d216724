"""The checkpoint mirror's uploader: one process per host, started, watched and restarted by the
supervisor (`Uploader`), never by a worker. Workers commit locally and move on; this process
mirrors each game's newest committed checkpoint in the background (`python -m
supervisor.uploader --config PATH`) and says how far it got in `<state_dir>/mirror.json`,
which the supervisor turns into events and `rlsup status` reads.

It uploads only the newest checkpoint of each game (stale steps are skipped when it falls
behind), bounded in memory by the transfer limits, with botocore's own retries per request and
a capped backoff between attempts; killed at any point, it leaves no manifest whose blobs are
missing (manifests are written last). It exits when its parent (the supervisor) is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog

from checkpoints import CheckpointError, CheckpointStore
from supervisor.config import Config, ConfigError, load_config
from supervisor.mirror_state import GameMirror, MirrorState
from training import protocol

log = structlog.get_logger("rlsup.uploader")

GC_EVERY_S = 600.0
BACKOFF_MAX_S = 300.0


# ---- the uploader process ---------------------------------------------------------------


def _backoff(failures: int, rng: random.Random) -> float:
    return float(min(BACKOFF_MAX_S, 2.0 ** min(failures, 9)) * rng.uniform(0.5, 1.0))


def run_uploader(cfg: Config, stop: threading.Event, poll_s: float = 1.0) -> None:
    from checkpoints.mirror import collect_garbage, upload_checkpoint
    from checkpoints.remote import (
        RemoteError,
        RemoteLocation,
        RemoteStore,
        TransferLimits,
        make_client,
    )

    m = cfg.mirror
    assert m is not None
    limits = TransferLimits(
        concurrency=m.concurrency,
        chunk_bytes=int(m.chunk_mb * 2**20),
        bandwidth_bytes_s=int(m.bandwidth_mb_s * 1e6) or None,
    )
    remote = RemoteStore(
        make_client(m.endpoint_url or None, m.region or None), RemoteLocation.parse(m.url), limits
    )
    state = MirrorState.read(cfg.state_dir) or MirrorState()
    if state.url != m.url:  # another bucket: what was mirrored there says nothing here
        state = MirrorState(url=m.url)
    state.pid = os.getpid()
    rng = random.Random()
    retry_at: dict[str, float] = {}
    bucket_ok, next_gc = False, time.monotonic() + 60.0
    parent = os.getppid()
    state.write(cfg.state_dir)
    while not stop.is_set() and os.getppid() == parent:
        now = time.monotonic()
        uploaded = False
        for game in cfg.games:
            gm = state.games.setdefault(game.name, GameMirror())
            if now < retry_at.get(game.name, 0.0):
                continue
            store = CheckpointStore(cfg.run_dir(game.name) / protocol.CHECKPOINT_DIR)
            ref = store.latest()
            if ref is None or (gm.step is not None and ref.step <= gm.step):
                continue
            if m.every_s and gm.uploaded_at and time.time() - gm.uploaded_at < m.every_s:
                continue
            try:
                if not bucket_ok:
                    remote.ensure_bucket()
                    bucket_ok = True
                up = upload_checkpoint(remote, game.name, ref)
                created = json.loads((ref.path / "MANIFEST.json").read_bytes()).get("created")
            except FileNotFoundError:
                continue  # retention removed it meanwhile: the next pass takes the newer one
            except Exception as exc:
                if not isinstance(exc, RemoteError | CheckpointError | OSError | ValueError):
                    log.exception("mirror_unexpected_error", game=game.name)
                gm.failures += 1
                gm.last_error = f"{ref.path.name}: {exc}"[:500]
                gm.error_at = time.time()
                delay = _backoff(gm.failures, rng)
                retry_at[game.name] = now + delay
                log.warning("mirror_failed", game=game.name, error=gm.last_error, retry_s=delay)
                state.write(cfg.state_dir)
                continue
            gm.step, gm.created, gm.uploaded_at = ref.step, created, time.time()
            gm.bytes_uploaded, gm.bytes_present = up.bytes_uploaded, up.bytes_present
            gm.seconds, gm.uploads = round(up.seconds, 3), gm.uploads + 1
            gm.last_error = None
            retry_at.pop(game.name, None)
            uploaded = True
            log.info("mirror_ok", game=game.name, **asdict(up))
            state.write(cfg.state_dir)
        if uploaded and time.monotonic() >= next_gc:
            next_gc = time.monotonic() + GC_EVERY_S
            try:
                got = collect_garbage(remote, m.keep)
                state.gc = {**asdict(got), "at": time.time()}
                log.info("mirror_gc", **state.gc)
            except (RemoteError, CheckpointError) as exc:
                state.gc = {"error": str(exc)[:500], "at": time.time()}
                log.warning("mirror_gc_failed", error=str(exc))
            state.write(cfg.state_dir)
        stop.wait(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m supervisor.uploader")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"rlsup uploader: {exc}", file=sys.stderr)
        return 2
    if cfg.mirror is None:
        print(f"rlsup uploader: {cfg.path} has no [mirror] table", file=sys.stderr)
        return 2
    # SIGTERM keeps its default (exit at once): killed anywhere, an upload leaves no manifest
    # without its blobs, so there is nothing to finish first. The same when the supervisor
    # dies: the kernel sends it (PR_SET_PDEATHSIG), even in the middle of a long upload.
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # it died before the request took effect
        return 0
    run_uploader(cfg, threading.Event())
    return 0


def _die_with_parent() -> None:
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


# ---- the supervisor's handle ------------------------------------------------------------


class Uploader:
    """The supervisor's side: keeps one uploader process running while [mirror] is set
    (restarted after a capped backoff when it exits), and turns mirror.json's changes into
    events (`mirror_ok` per newly mirrored checkpoint, `mirror_failed` per failed attempt)."""

    def __init__(self, cfg: Config, event: Any, spawn_process: bool = True) -> None:
        self.cfg = cfg
        self.event = event  # (kind, game, detail) -> None
        # False on several hosts: each host mirrors its own games (raylaunch.WorkerHost) and
        # the launcher writes mirror.json; this only turns its changes into events.
        self.spawn_process = spawn_process
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_at = 0.0
        self.exits = 0
        self.seen: dict[str, tuple[int | None, int]] = {}
        state = MirrorState.read(cfg.state_dir)
        for name, gm in (state.games if state else {}).items():
            self.seen[name] = (gm.step, gm.failures)

    def tick(self, now: float) -> None:
        if self.cfg.mirror is None:
            return
        if not self.spawn_process:
            self._report()
            return
        if self.proc is not None and (rc := self.proc.poll()) is not None:
            self.exits += 1
            delay = min(BACKOFF_MAX_S, 2.0 ** min(self.exits, 8))
            self.event("uploader_exit", None, {"returncode": rc, "restart_in_s": delay})
            log.warning("uploader_exit", returncode=rc, restart_in_s=delay)
            self.proc, self.restart_at = None, now + delay
        if self.proc is None and now >= self.restart_at:
            self._spawn()
        self._report()

    def _spawn(self) -> None:
        logs = self.cfg.logs_dir
        logs.mkdir(parents=True, exist_ok=True)
        fd = os.open(
            logs / "uploader.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        with os.fdopen(fd, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "supervisor.uploader", "--config", str(self.cfg.path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=str(Path(__file__).resolve().parent.parent),
            )
        log.info("uploader_start", pid=self.proc.pid)

    def _report(self) -> None:
        state = MirrorState.read(self.cfg.state_dir)
        if state is None:
            return
        for name, gm in state.games.items():
            step, failures = self.seen.get(name, (None, 0))
            if gm.step is not None and gm.step != step:
                self.event("mirror_ok", name, {
                    "step": gm.step, "bytes_uploaded": gm.bytes_uploaded,
                    "bytes_present": gm.bytes_present, "seconds": gm.seconds,
                })  # fmt: skip
            if gm.failures > failures:
                self.event("mirror_failed", name, {
                    "error": gm.last_error, "failures": gm.failures,
                })  # fmt: skip
            self.seen[name] = (gm.step, gm.failures)

    def reconfigure(self, cfg: Config) -> None:
        """A reload: a changed [mirror] restarts the uploader (it reads its config at start)."""
        changed = cfg.mirror != self.cfg.mirror or cfg.games != self.cfg.games
        self.cfg = cfg
        if changed:
            self.stop()
            self.restart_at = 0.0

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


if __name__ == "__main__":
    raise SystemExit(main())
