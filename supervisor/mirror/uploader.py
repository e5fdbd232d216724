"""The checkpoint mirror's uploader: one process per host, started, watched and restarted by the
supervisor (`Uploader`), never by a worker. Workers commit locally and move on; this process
mirrors each game's newest committed checkpoint in the background and says how far it got in
`<state_dir>/mirror.json`, which the supervisor turns into events and `rlsup status` reads.

Started by the supervisor as `python -m supervisor.mirror.uploader --config PATH --plan PLAN`: PLAN
(`<state_dir>/uploader.json`) is the configuration in force in that supervisor (the mirror and
the games' run dirs), so a restarted uploader never mirrors an edit of the file that the
supervisor refused or has not reloaded. Without `--plan` it reads the file at PATH.

It uploads only the newest checkpoint of each game (stale steps are skipped when it falls
behind), bounded in memory by the transfer limits, with botocore's own retries per request and
a capped backoff between attempts; one game's failure (its folder unreadable, its upload
refused) backs off that game only. Killed at any point, it leaves no manifest whose blobs are
missing (manifests are written last). It exits when its parent (the supervisor) is gone, even
when that happens while it is still starting.
"""

from __future__ import annotations

import os

# training.protocol.PARENT_PID_ENV, spelled out: it is read before anything is imported.
_PARENT_PID_ENV = "RLSUP_PARENT_PID"


def _die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the parent dies (PR_SET_PDEATHSIG), then exit if the
    parent that started us is gone already: it may die before the request takes effect, and
    then nothing would ever be sent. First thing in the process: the imports below take
    0.2-0.4 s, a window in which a dying supervisor would leave us running forever."""
    import contextlib
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the loop's check remains
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    expected = os.environ.get(_PARENT_PID_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        raise SystemExit(0)


if __name__ == "__main__":
    _die_with_parent()

# ruff: noqa: E402  (the imports follow the parent-death check on purpose)
import argparse
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

from checkpoints import CheckpointError, CheckpointRef, CheckpointStore
from checkpoints.retention import PinsUnreadable, read_pins
from supervisor.config import Config, ConfigError, MirrorConfig, load_config
from supervisor.files import rotate_log
from supervisor.mirror.state import GameMirror, MirrorState
from supervisor.preemption.notice import asks_to_checkpoint
from training import protocol

log = structlog.get_logger("rlsup.uploader")

GC_EVERY_S = 600.0
BACKOFF_MAX_S = 300.0
PLAN_FILE = "uploader.json"  # in the state dir: the plan of the uploader last started


# ---- what one uploader mirrors --------------------------------------------------------------


@dataclass(frozen=True)
class UploadPlan:
    """What one uploader process mirrors, taken from the configuration in force when it was
    started (never re-read from the file by the process itself)."""

    state_dir: Path  # mirror.json goes here
    mirror: MirrorConfig
    runs: tuple[tuple[str, Path], ...]  # (game, its run dir), in the configuration's order
    # (game, keep_best, keep_every_steps) of the games that keep more than the newest: the
    # mirror keeps those too (the pins are read from each run dir when garbage is collected).
    retention: tuple[tuple[str, int, int | None], ...] = ()
    # [preemption] flush = "upload": a game asked to checkpoint for a preemption is mirrored
    # first, its newest checkpoint at once (mirror.every_s and a retry's wait do not hold it).
    preempt_first: bool = True

    @classmethod
    def of(cls, cfg: Config) -> UploadPlan:
        if cfg.mirror is None:
            raise ValueError(f"{cfg.path} has no [mirror] table")
        runs = tuple((g.name, cfg.run_dir(g.name)) for g in cfg.games)
        retention = []
        for g in cfg.games:
            args = g.args_dict
            best, every = args.get("keep_best", 0), args.get("keep_every_steps")
            if best or every:
                retention.append((g.name, int(best), int(every) if every else None))
        first = cfg.preemption.flush == "upload"
        return cls(cfg.state_dir, cfg.mirror, runs, tuple(retention), first)

    def to_json(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir),
            "mirror": self.mirror.as_dict(),
            "runs": [[name, str(path)] for name, path in self.runs],
            "retention": [list(r) for r in self.retention],
            "preempt_first": self.preempt_first,
        }

    @classmethod
    def from_json(cls, data: Any) -> UploadPlan:
        """Raises ValueError naming what is wrong."""
        try:
            runs = tuple((str(name), Path(path)) for name, path in data["runs"])
            retention = tuple(
                (str(name), int(best), None if every is None else int(every))
                for name, best, every in data.get("retention", [])
            )
            first = bool(data.get("preempt_first", True))
            mirror = MirrorConfig(**data["mirror"])
            return cls(Path(data["state_dir"]), mirror, runs, retention, first)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not an uploader plan: {exc!r}") from None

    def policy(self, game: str) -> tuple[int, int | None]:
        """The game's (keep_best, keep_every_steps)."""
        for name, best, every in self.retention:
            if name == game:
                return best, every
        return 0, None

    @classmethod
    def read(cls, path: Path) -> UploadPlan:
        """Raises OSError or ValueError."""
        return cls.from_json(json.loads(protocol.read_regular_file(path)))


# ---- the uploader process ---------------------------------------------------------------


def _backoff(failures: int, rng: random.Random) -> float:
    return float(min(BACKOFF_MAX_S, 2.0 ** min(failures, 9)) * rng.uniform(0.5, 1.0))


def _remote_store(m: MirrorConfig) -> Any:
    from checkpoints.remote import RemoteLocation, RemoteStore, TransferLimits, make_client

    limits = TransferLimits(
        concurrency=m.concurrency,
        chunk_bytes=int(m.chunk_mb * 2**20),
        bandwidth_bytes_s=int(m.bandwidth_mb_s * 1e6) or None,
    )
    client = make_client(m.endpoint_url or None, m.region or None)
    return RemoteStore(client, RemoteLocation.parse(m.url), limits)


class _Pass:
    """The uploader's bookkeeping across passes: mirror.json, each game's retry time."""

    def __init__(self, plan: UploadPlan, remote: Any) -> None:
        self.plan, self.remote = plan, remote
        state = MirrorState.read(plan.state_dir) or MirrorState()
        if state.url != plan.mirror.url:  # another bucket: what was mirrored there says nothing
            state = MirrorState(url=plan.mirror.url)
        state.pid = os.getpid()
        self.state = state
        self.rng = random.Random()
        self.retry_at: dict[str, float] = {}
        self.bucket_ok = False

    def save(self) -> None:
        self.state.write(self.plan.state_dir)

    def failed(self, game: str, gm: GameMirror, error: str, now: float) -> None:
        gm.failures += 1
        gm.last_error = error[:500]
        gm.error_at = time.time()
        delay = _backoff(gm.failures, self.rng)
        self.retry_at[game] = now + delay
        log.warning("mirror_failed", game=game, error=gm.last_error, retry_s=delay)
        self.save()

    def game(self, game: str, run_dir: Path, now: float, urgent: bool = False) -> bool:
        """One attempt at `game`'s newest checkpoint; True when one was mirrored. `urgent`
        (a preemption): neither mirror.every_s nor a retry's wait holds it back."""
        from checkpoints.mirror import upload_checkpoint
        from checkpoints.remote import RemoteError

        gm = self.state.games.setdefault(game, GameMirror())
        if now < self.retry_at.get(game, 0.0) and not urgent:
            return False
        folder = run_dir / protocol.CHECKPOINT_DIR
        try:
            ref = CheckpointStore(folder).latest()
        except OSError as exc:  # this game's folder only: the others go on
            self.failed(game, gm, f"{folder}: {exc}", now)
            return False
        if ref is None or (gm.step is not None and ref.step <= gm.step):
            return False
        every_s = self.plan.mirror.every_s
        if every_s and gm.uploaded_at and time.time() - gm.uploaded_at < every_s and not urgent:
            return False
        try:
            if not self.bucket_ok:
                self.remote.ensure_bucket()
                self.bucket_ok = True
            up = upload_checkpoint(self.remote, game, ref)
            created = json.loads((ref.path / "MANIFEST.json").read_bytes()).get("created")
        except FileNotFoundError:
            return False  # retention removed it meanwhile: the next pass takes the newer one
        except Exception as exc:
            if not isinstance(exc, RemoteError | CheckpointError | OSError | ValueError):
                log.exception("mirror_unexpected_error", game=game)
            self.failed(game, gm, f"{ref.path.name}: {exc}", now)
            return False
        gm.step, gm.created, gm.uploaded_at = ref.step, created, time.time()
        gm.bytes_uploaded, gm.bytes_present = up.bytes_uploaded, up.bytes_present
        gm.seconds, gm.uploads = round(up.seconds, 3), gm.uploads + 1
        gm.last_error = None
        self.retry_at.pop(game, None)
        log.info("mirror_ok", game=game, **asdict(up))
        self.save()
        self.keepers(game, folder)
        return True

    def keepers(self, game: str, folder: Path) -> None:
        """The mirror keeps what the game's retention keeps beyond the newest (best-evaluated,
        milestones, pinned): each such local checkpoint the mirror lacks is mirrored too
        (mostly blobs it has already: the replay chunks are shared). Best effort: a failure
        is logged and tried again after the next upload."""
        from checkpoints.mirror import upload_checkpoint
        from checkpoints.remote import RemoteError

        best, every = self.plan.policy(game)
        store = CheckpointStore(folder, keep=1, keep_best=best, keep_every_steps=every)
        try:
            wanted = {s for s, why in store.kept().items() if why != ["newest"]}
            if not wanted:
                return
            missing = sorted(wanted - set(self.remote.manifest_steps(game)))
            for step in missing:
                upload_checkpoint(self.remote, game, CheckpointRef(store.path_for(step), step))
                log.info("mirror_kept_checkpoint", game=game, step=step)
        except FileNotFoundError:
            return  # retention removed it meanwhile
        except (RemoteError, CheckpointError, OSError, ValueError, PinsUnreadable) as exc:
            log.warning("mirror_kept_failed", game=game, error=str(exc)[:500])

    def retention(self) -> dict[str, Any]:
        """Each game's retention beyond the newest: its keep_best and keep_every_steps, and
        the steps pinned in its run dir. Raises PinsUnreadable (no collection then)."""
        from checkpoints.mirror import GameRetention

        out: dict[str, Any] = {}
        for game, run_dir in self.plan.runs:
            best, every = self.plan.policy(game)
            pinned = frozenset(read_pins(run_dir / protocol.CHECKPOINT_DIR))
            out[game] = GameRetention(best, every, pinned)
        return out

    def collect_garbage(self) -> None:
        from checkpoints.mirror import collect_garbage
        from checkpoints.remote import RemoteError

        try:
            got = collect_garbage(self.remote, self.plan.mirror.keep, games=self.retention())
            self.state.gc = {**asdict(got), "at": time.time()}
            log.info("mirror_gc", **self.state.gc)
        except (RemoteError, CheckpointError, PinsUnreadable) as exc:
            self.state.gc = {"error": str(exc)[:500], "at": time.time()}
            log.warning("mirror_gc_failed", error=str(exc))
        self.save()


def run_uploader(plan: UploadPlan, stop: threading.Event, poll_s: float = 1.0) -> None:
    one = _Pass(plan, _remote_store(plan.mirror))
    next_gc = time.monotonic() + 60.0
    parent = protocol.ParentWatch.from_env()  # the supervisor (RLSUP_PARENT_PID)
    one.save()
    while not stop.is_set() and not parent.gone():
        now = time.monotonic()
        uploaded = False
        urgent = preemption_requests(plan) if plan.preempt_first else set()
        # The games a preemption notice asked to checkpoint go first: the machine may go
        # before a pass over every game ends.
        for game, run_dir in sorted(plan.runs, key=lambda r: r[0] not in urgent):
            uploaded = one.game(game, run_dir, now, game in urgent) or uploaded
        if uploaded and time.monotonic() >= next_gc:
            next_gc = time.monotonic() + GC_EVERY_S
            one.collect_garbage()
        stop.wait(poll_s)


def preemption_requests(plan: UploadPlan) -> set[str]:
    """The games whose run dir holds a preemption's checkpoint request, deadline not long
    past (the supervisor writes it; the preemption wing answers: `notice.asks_to_checkpoint`)."""
    return {game for game, run_dir in plan.runs if asks_to_checkpoint(run_dir)}


def _plan_of(args: argparse.Namespace) -> UploadPlan | str:
    """The plan to run, or why there is none."""
    if args.plan:
        try:
            return UploadPlan.read(Path(args.plan))
        except (OSError, ValueError) as exc:
            return f"{args.plan}: {exc}"
    try:
        return UploadPlan.of(load_config(args.config))
    except (ConfigError, ValueError) as exc:
        return str(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m supervisor.mirror.uploader")
    parser.add_argument("--config", required=True, help="the configuration (read without --plan)")
    parser.add_argument("--plan", help="what to mirror: the supervisor's configuration in force")
    args = parser.parse_args(argv)
    # SIGTERM keeps its default (exit at once): killed anywhere, an upload leaves no manifest
    # without its blobs, so there is nothing to finish first. The same when the supervisor
    # dies: the kernel sends it (PR_SET_PDEATHSIG, armed first thing), even mid-upload.
    plan = _plan_of(args)
    if isinstance(plan, str):
        print(f"rlsup uploader: {plan}", file=sys.stderr)
        return 2
    run_uploader(plan, threading.Event())
    return 0


# ---- the supervisor's handle ------------------------------------------------------------


def _restart_delay(exits: int) -> float:
    return float(min(BACKOFF_MAX_S, 2.0 ** min(exits, 8)))


class Uploader:
    """The supervisor's side: keeps one uploader process running while [mirror] is set
    (restarted after a capped backoff when it exits, or when it cannot even be started: an
    `uploader_exit` event with `returncode` null and the `error`; never a failed tick), and
    turns mirror.json's changes into events (`mirror_ok` per newly mirrored checkpoint,
    `mirror_failed` per failed attempt)."""

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
            self._backoff(now, {"returncode": rc})
            self.proc = None
        if self.proc is None and now >= self.restart_at:
            try:
                self._spawn()
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                # fork's EAGAIN, a full disk, an unusable log: the helper waits, the tick goes on
                self.proc = None
                self._backoff(now, {"returncode": None, "error": f"cannot start: {exc}"[:500]})
        self._report()

    def _backoff(self, now: float, detail: dict[str, Any]) -> None:
        self.exits += 1
        delay = _restart_delay(self.exits)
        self.event("uploader_exit", None, {**detail, "restart_in_s": delay})
        log.warning("uploader_exit", **detail, restart_in_s=delay)
        self.restart_at = now + delay

    def _spawn(self) -> None:
        from checkpoints import write_json_atomic

        logs = self.cfg.logs_dir
        logs.mkdir(parents=True, exist_ok=True)
        plan = self.cfg.state_dir / PLAN_FILE
        write_json_atomic(plan, UploadPlan.of(self.cfg).to_json(), durable=False)
        log_path = logs / "uploader.log"
        rotate_log(log_path)
        # O_NOFOLLOW: a link planted at the log's name never redirects the service's writes.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(log_path, flags, 0o600)
        argv = [
            "-m",
            "supervisor.mirror.uploader",
            "--config",
            str(self.cfg.path),
            "--plan",
            str(plan),
        ]
        with os.fdopen(fd, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=str(Path(__file__).resolve().parent.parent.parent),
                env={**os.environ, protocol.PARENT_PID_ENV: str(os.getpid())},
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
        """A reload: a changed plan (the mirror's tuning, the games) restarts the uploader
        with it. The mirror's location never changes here: the reload refuses that
        (`config.mirror_reload_refusal`)."""
        changed = _plan_or_none(cfg) != _plan_or_none(self.cfg)
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


def _plan_or_none(cfg: Config) -> UploadPlan | None:
    return UploadPlan.of(cfg) if cfg.mirror is not None else None


if __name__ == "__main__":
    raise SystemExit(main())
