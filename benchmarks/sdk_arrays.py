"""The SDK's array store against Stable-Baselines3's replay-buffer save, in the same run.

    python benchmarks/sdk_arrays.py [--gib 2] [--dir DIR]

A user's script keeps a replay buffer of Atari-like uint8 frames (N x 84 x 84). Two ways to
checkpoint it, each measured in a fresh subprocess:

- sdk: `with run.checkpoint(step): run.save_arrays("frames", frames)` (chunked, fsynced, in a
  manifest with sha256; a chunk equal to the previous checkpoint's is hard-linked);
- sb3: SB3's `save_replay_buffer` (what its users do today: `save_to_pkl`, a pickle of the
  whole `ReplayBuffer` object holding the same frames).

For each: the extra RSS of the save (psutil sampled every 5 ms, minus the RSS just before it),
the save's wall time (training is blocked for that long: the longest pause), the bytes written;
then, after 1 % of the rows change (contiguous, as a ring buffer's cursor moves), the second
save's bytes written and time; then the load time (page cache dropped first) and the load's
extra RSS beyond the array itself. Prints the host, a table, the ratios sdk/sb3, one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostinfo import host_facts, host_line

FRAME_BYTES = 84 * 84
GIB = 1 << 30


class PeakRss:
    """This process's RSS sampled in a thread; `extra` = peak minus the RSS at the start."""

    def __init__(self, interval: float = 0.005) -> None:
        self._proc = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.start = self.peak = 0

    def __enter__(self) -> PeakRss:
        self.start = self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self._interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def extra_mib(self) -> float:
        return (self.peak - self.start) / (1 << 20)


def tree_bytes(path: Path, seen: set[int] | None = None) -> int:
    """Bytes of the files under `path` whose inodes are not in `seen` (hard links counted once)."""
    seen = set() if seen is None else seen
    total = 0
    for p in path.rglob("*"):
        st = p.lstat()
        if p.is_file() and st.st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_size
    return total


def drop_cache(path: Path) -> None:
    for p in [path] if path.is_file() else path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def frames(gib: float) -> Any:
    import numpy as np

    n = int(gib * GIB) // FRAME_BYTES
    rng = np.random.default_rng(0)
    block = rng.integers(0, 255, size=(64, 84, 84), dtype=np.uint8)
    out = np.empty((n, 84, 84), dtype=np.uint8)
    for i in range(0, n, 64):
        out[i : i + 64] = block[: min(64, n - i)]
    return out


def change_one_percent(a: Any) -> None:
    n = len(a) // 100
    start = len(a) // 3
    a[start : start + n] ^= 0x55


def run_sdk(gib: float, where: Path) -> dict[str, Any]:
    import numpy as np

    import rlsup

    data = frames(gib)
    run = rlsup.attach(where / "run", handle_signals=False, keep=3)
    out: dict[str, Any] = {}
    with PeakRss() as rss:
        t = time.perf_counter()
        with run.checkpoint(1):
            run.save_arrays("frames", data)
        out["save_s"] = time.perf_counter() - t
    out["save_extra_rss_mib"] = rss.extra_mib
    out["save_bytes"] = run.last_save_stats["bytes_written"]  # type: ignore[index]
    change_one_percent(data)
    t = time.perf_counter()
    with run.checkpoint(2):
        run.save_arrays("frames", data)
    out["incremental_s"] = time.perf_counter() - t
    out["incremental_bytes"] = run.last_save_stats["bytes_written"]  # type: ignore[index]
    run.close()
    want = data.copy() if gib <= 1 else None
    del data
    drop_cache(where / "run")
    again = rlsup.attach(where / "run", handle_signals=False)
    with PeakRss() as rss:
        t = time.perf_counter()
        again.latest()
        loaded = again.load_arrays("frames")
        out["load_s"] = time.perf_counter() - t
    out["load_extra_rss_mib"] = rss.extra_mib - loaded.nbytes / (1 << 20)
    if want is not None:
        assert np.array_equal(loaded, want)
    again.close()
    return out


def run_sb3(gib: float, where: Path) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl

    data = frames(gib)
    space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    buffer = ReplayBuffer(
        len(data), space, gym.spaces.Discrete(4), device="cpu", optimize_memory_usage=True,
        handle_timeout_termination=False,
    )  # fmt: skip
    buffer.observations[:, 0] = data  # the same frames, without a second copy kept
    buffer.full = True
    del data
    out: dict[str, Any] = {}
    path = where / "replay.pkl"
    with PeakRss() as rss:
        t = time.perf_counter()
        save_to_pkl(path, buffer)
        os.sync()  # SB3 does not fsync; the SDK does: both on disk before the clock stops
        out["save_s"] = time.perf_counter() - t
    out["save_extra_rss_mib"] = rss.extra_mib
    out["save_bytes"] = path.stat().st_size
    change_one_percent(buffer.observations[:, 0])
    t = time.perf_counter()
    save_to_pkl(path, buffer)
    os.sync()
    out["incremental_s"] = time.perf_counter() - t
    out["incremental_bytes"] = path.stat().st_size
    del buffer
    drop_cache(path)
    with PeakRss() as rss:
        t = time.perf_counter()
        loaded = load_from_pkl(path)
        out["load_s"] = time.perf_counter() - t
    out["load_extra_rss_mib"] = rss.extra_mib - loaded.observations.nbytes / (1 << 20)
    return out


def child(method: str, gib: float, where: Path) -> None:
    result = (run_sdk if method == "sdk" else run_sb3)(gib, where)
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--child", choices=("sdk", "sb3"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    base = args.dir or Path(tempfile.gettempdir())
    if args.child:
        child(args.child, args.gib, base)
        return
    print(host_line(), flush=True)
    results: dict[str, dict[str, Any]] = {}
    for method in ("sdk", "sb3"):
        where = Path(tempfile.mkdtemp(prefix=f"sdk-arrays-{method}-", dir=base))
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--child", method, "--gib", str(args.gib),
                 "--dir", str(where)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"{method} failed:\n{done.stdout}\n{done.stderr}")
            results[method] = json.loads(line[len("RESULT ") :])
            results[method]["disk_bytes"] = tree_bytes(where)
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(where)
    sdk, sb3 = results["sdk"], results["sb3"]
    rows = (
        ("save: extra RSS (MiB)", "save_extra_rss_mib", "{:.0f}"),
        ("save: time = longest pause (s)", "save_s", "{:.2f}"),
        ("save: bytes written (MiB)", "save_bytes", "mib"),
        ("after 1 % changed: bytes written (MiB)", "incremental_bytes", "mib"),
        ("after 1 % changed: time (s)", "incremental_s", "{:.2f}"),
        ("load: time, cold cache (s)", "load_s", "{:.2f}"),
        ("load: extra RSS beyond the array (MiB)", "load_extra_rss_mib", "{:.0f}"),
    )
    print(f"{args.gib:g} GiB of 84x84 uint8 frames; each method in its own process")
    print(f"{'':42s} {'sdk':>10s} {'sb3 pickle':>12s} {'sdk/sb3':>8s}")
    for label, key, fmt in rows:
        a, b = sdk[key], sb3[key]
        if fmt == "mib":
            cells = f"{a / (1 << 20):10.0f} {b / (1 << 20):12.0f}"
        else:
            cells = f"{fmt.format(a):>10s} {fmt.format(b):>12s}"
        ratio = f"{a / b:8.3f}" if b else "       -"
        print(f"{label:42s} {cells} {ratio}")
    print(json.dumps({"host": host_facts(), "gib": args.gib, "sdk": sdk, "sb3": sb3}))


if __name__ == "__main__":
    main()
