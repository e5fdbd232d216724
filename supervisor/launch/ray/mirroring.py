"""Several hosts: the mirror from the supervisor's side. The hosts upload the checkpoints; the
supervisor moves each game's placement fence one epoch on before it places the game (a worker
left on a host declared lost then commits nothing more), and keeps mirror.json for `rlsup
status` and the mirror events from what the hosts report (`MirrorBook`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor.config import MIRROR_LOCATION_KEYS, Config
from supervisor.launch.ray.process import RayWorkerProcess
from supervisor.mirror.state import GameMirror, MirrorState

# The mirror's answer to a placement's fence, at most (the tick waits: with START_TIMEOUT_S,
# one spawn stays well below WatchdogSec=60, where botocore's own retries take minutes).
FENCE_TIMEOUT_S = 10.0


def mirror_location(cfg: Config) -> tuple[str, ...] | None:
    """Where the mirror is: what the fence client is built from."""
    m = cfg.mirror
    return None if m is None else tuple(getattr(m, k) for k in MIRROR_LOCATION_KEYS)


def advance_fence(store: Callable[[], Any], game: str, host: str) -> int:
    """`game`'s new placement epoch on `host`, from the mirror `store()` gives, within
    FENCE_TIMEOUT_S; OSError (a spawn failure: a backoff) past it, rather than a tick held
    past systemd's watchdog. The request runs in a daemon thread (an abandoned one never
    delays the supervisor's exit) and may still move the fence later: harmless, an epoch no
    worker was given."""
    from checkpoints.remote import RemoteError

    got: list[int | BaseException] = []
    done = threading.Event()

    def advance() -> None:
        try:
            got.append(store().advance_fence(game, {"host": host, "at": time.time()}))
        except BaseException as exc:  # handed to the waiting tick
            got.append(exc)
        finally:
            done.set()

    threading.Thread(target=advance, name="rlsup-fence", daemon=True).start()
    if not done.wait(FENCE_TIMEOUT_S):
        raise OSError(
            f"the mirror did not move the placement fence of {game} within {FENCE_TIMEOUT_S:g} s"
        )
    [outcome] = got
    if isinstance(outcome, RemoteError | ValueError):
        raise OSError(
            f"cannot move the placement fence of {game} in the mirror: {outcome}"
        ) from outcome
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


class MirrorBook:
    """mirror.json in the state dir, kept from the hosts' reports: each game's last mirrored
    step and its upload failures (the uploader turns its changes into events)."""

    def __init__(self, state_dir: Path, url: str) -> None:
        self.state_dir = state_dir
        state = MirrorState.read(state_dir)
        self.state = state if state is not None and state.url == url else MirrorState(url=url)
        self._failures_seen: dict[int, int] = {}  # id(proc) -> its actor's failures reported

    def record(self, proc: RayWorkerProcess, st: dict[str, Any]) -> None:
        """One status report of `proc`'s actor."""
        gm = self.state.games.setdefault(proc.game, GameMirror())
        changed = False
        step = st.get("mirror_step")
        if step is not None and step != gm.step:
            gm.step, gm.created, gm.uploaded_at = step, st.get("mirror_created"), time.time()
            gm.uploads += 1
            gm.last_error = None
            changed = True
        failures = int(st.get("mirror_failures") or 0)
        new = failures - self._failures_seen.get(id(proc), 0)
        if new > 0:
            self._failures_seen[id(proc)] = failures
            gm.failures += new
            gm.last_error, gm.error_at = st.get("mirror_error"), time.time()
            changed = True
        if changed:
            self.state.pid = os.getpid()
            self.state.write(self.state_dir)

    def forget(self, proc: RayWorkerProcess) -> None:
        """The tick loop is done with `proc`: its failures were counted."""
        self._failures_seen.pop(id(proc), None)
