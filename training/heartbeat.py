"""The worker's heartbeat: `<run_dir>/heartbeat.json`, atomically replaced about once a second.

Written from a thread so that long phases (loading, checkpointing, evaluating) still show life;
the supervisor judges *progress* by `global_step` against `phase_deadline_s`, so a loop that is
stuck while this thread still runs is caught all the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from checkpoints import write_file_atomic
from training import logs
from training.protocol import HEARTBEAT_FILE, Heartbeat, Phase

# heartbeat.json is padded with spaces (still valid JSON) to a multiple of this, so that on a
# full disk it can be rewritten in place: its blocks are already allocated.
PAD_BYTES = 4096


def encode_heartbeat(hb: Heartbeat) -> bytes:
    raw = json.dumps(hb.to_json(), sort_keys=True).encode("utf-8") + b"\n"
    return raw + b" " * (-len(raw) % PAD_BYTES)


class StepRate:
    """Agent steps per second over a sliding window of recent samples."""

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, step: int) -> None:
        self._samples.append((now, step))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


class HeartbeatWriter:
    """Owns the mutable heartbeat fields; a daemon thread publishes them every `interval_s`."""

    def __init__(
        self,
        run_dir: Path,
        initial: Heartbeat,
        *,
        interval_s: float = 1.0,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.path = run_dir / HEARTBEAT_FILE
        self._hb = initial
        self._lock = threading.Lock()
        self._interval_s = interval_s
        self._on_tick = on_tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.rate = StepRate()
        # Read by the publishing thread so that steps show within a long iteration too.
        self.live_step: Callable[[], int] | None = None
        self._fresh_phase = True

    def start(self) -> None:
        self.publish()
        self._thread.start()

    def update(self, **fields: object) -> None:
        with self._lock:
            self._hb = dataclasses.replace(self._hb, **fields)  # type: ignore[arg-type]

    def set_phase(self, phase: Phase, deadline_s: float) -> None:
        self.update(phase=str(phase), phase_deadline_s=float(deadline_s))
        self._fresh_phase = True
        self.publish()

    def progress(self, global_step: int, **fields: object) -> None:
        now = time.monotonic()
        self.rate.add(now, global_step)
        self.update(global_step=global_step, sps=round(self.rate.rate(), 2), **fields)
        if self._fresh_phase:
            # The supervisor waits for the first progress after a (re)start: say it now.
            self._fresh_phase = False
            self.publish()

    @property
    def current(self) -> Heartbeat:
        with self._lock:
            return self._hb

    def count_failure(self, kind: str, n: int = 1) -> None:
        """A write that failed and was survived ("progress", "eval", ...): reported here."""
        with self._lock:
            failures = dict(self._hb.write_failures)
            failures[kind] = failures.get(kind, 0) + n
            self._hb = dataclasses.replace(self._hb, write_failures=failures)

    def count_dropped(self, kind: str, n: int = 1) -> None:
        """A reported value that was no finite number, dropped ("metric", "evaluation", ...)."""
        with self._lock:
            dropped = dict(self._hb.dropped)
            dropped[kind] = dropped.get(kind, 0) + n
            self._hb = dataclasses.replace(self._hb, dropped=dropped)

    def publish(self) -> None:
        lost_logs = logs.STDERR.failures
        with self._lock:
            if lost_logs != self._hb.write_failures.get("log", 0):
                self._hb = dataclasses.replace(
                    self._hb, write_failures={**self._hb.write_failures, "log": lost_logs}
                )
            self._hb = dataclasses.replace(self._hb, seq=self._hb.seq + 1, time=time.time())
            data = encode_heartbeat(self._hb)
        try:
            write_file_atomic(self.path, data, durable=False)
        except OSError:
            # A full disk must neither kill training nor look like a hang: count it, and say
            # so in place (the file's blocks are already there; see PAD_BYTES).
            self.count_failure("heartbeat")
            with contextlib.suppress(OSError):
                self._write_in_place(encode_heartbeat(self.current))

    def _write_in_place(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if len(data) > size:
                raise OSError(28, "heartbeat outgrew its file", str(self.path))
            os.pwrite(fd, data.ljust(size), 0)
        finally:
            os.close(fd)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.publish()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if self._on_tick is not None:
                self._on_tick()
            if self.live_step is not None:
                self.update(global_step=self.live_step())
            self.publish()


def initial_heartbeat(game: str, algo: str, total_steps: int, device: str) -> Heartbeat:
    return Heartbeat(
        seq=0,
        pid=os.getpid(),
        phase=str(Phase.STARTING),
        phase_deadline_s=180.0,
        global_step=0,
        total_steps=total_steps,
        episodes=0,
        sps=0.0,
        mean_return=None,
        last_checkpoint_step=None,
        resumed_from_step=None,
        num_envs=0,
        batch_size=0,
        device=device,
        gpu_mem_mb=None,
        game=game,
        algo=algo,
        time=time.time(),
    )
