"""The SDK's array store against Stable-Baselines3's replay-buffer save, in the same run.

    python benchmarks/sdk_arrays.py [--gib 2] [--dir DIR]

A user's script keeps a replay buffer of Atari-like uint8 frames (N x 84 x 84). Two ways to
checkpoint it, each in a fresh subprocess:

- sdk: `with run.checkpoint(step): run.save_arrays("frames", frames)` (chunked, fsynced, in a
  manifest with sha256; a chunk equal to the previous checkpoint's is hard-linked);
- sb3: what SB3's `model.save_replay_buffer` does (`save_to_pkl`: a pickle of the whole
  `ReplayBuffer` object, here holding the same frames), then, to compare durable with durable,
  an fsync of that file (SB3 itself does not fsync).

The child announces each operation and waits; the parent samples the child's RSS with psutil
every 2 ms while it runs (a thread inside the child would be starved by a call that holds the
GIL) and reads the child's /proc/<pid>/io before and after. Per method: the save's extra RSS
(peak minus the RSS just before it), its wall time (the training loop waits that long: the
longest pause), the bytes it wrote (write() syscalls, and the SDK's own count); then, after 1 % of
the rows change (contiguous, as a ring buffer's cursor moves), the same for the second save;
then the load (page cache dropped first): its time and its extra RSS beyond the array itself.
Prints the host, a table with the ratios sdk/sb3, one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostinfo import host_facts, host_line

FRAME = (84, 84)
GIB = 1 << 30
MIB = 1 << 20
SAMPLE_EVERY_S = 0.002


# ---- child: build the buffer, do each operation when the parent says so ----------------------


def frames(gib: float) -> Any:
    """gib GiB of N x 84 x 84 uint8 frames (random bytes: no chunk equals another by chance)."""
    import numpy as np

    n = int(gib * GIB) // (FRAME[0] * FRAME[1])
    out = np.empty((n, *FRAME), dtype=np.uint8)
    rng = np.random.default_rng(0)
    for i in range(0, n, 4096):
        out[i : i + 4096] = rng.integers(0, 256, size=out[i : i + 4096].shape, dtype=np.uint8)
    return out


def change_one_percent(a: Any) -> None:
    """1 % of the rows, contiguous (a ring buffer's cursor moved over them)."""
    n = len(a) // 100
    start = len(a) // 3
    a[start : start + n] ^= 0x55


def drop_cache(path: Path) -> None:
    for p in [path] if path.is_file() else sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(name: str, fn: Callable[[], dict[str, Any] | None]) -> Any:
    """Tell the parent `name` is next, wait for its go (it is sampling now), run, report."""
    print(f"READY {name}", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the parent went away")
    t = time.perf_counter()
    info = fn() or {}
    seconds = time.perf_counter() - t
    print(f"DONE {name} " + json.dumps({"s": seconds, **info}), flush=True)
    return info


def child_sdk(gib: float, where: Path) -> None:
    import rlsup

    held = {"frames": frames(gib)}  # dropped before the load
    run = rlsup.attach(where / "run", handle_signals=False, keep=3)
    t = time.perf_counter()  # what the manifest's sha256 of every byte costs alone (untimed)
    flat = memoryview(held["frames"].reshape(-1))
    for i in range(0, len(flat), 16 * MIB):
        hashlib.sha256(flat[i : i + 16 * MIB]).digest()
    print(f"SHA256 {time.perf_counter() - t}", flush=True)

    def save(step: int) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            with run.checkpoint(step):
                run.save_arrays("frames", held["frames"])
            stats = run.last_save_stats or {}
            return {"sdk_written": stats["bytes_written"], "sdk_linked": stats["bytes_linked"]}

        return go

    timed("save", save(1))
    change_one_percent(held["frames"])
    timed("incremental", save(2))
    run.close()
    held.clear()
    drop_cache(where / "run")
    again = rlsup.attach(where / "run", handle_signals=False)
    loaded: list[Any] = []

    def load() -> dict[str, Any]:
        again.latest()
        loaded.append(again.load_arrays("frames"))
        return {"array_bytes": loaded[0].nbytes}

    timed("load", load)
    again.close()


def child_sb3(gib: float, where: Path) -> None:
    import gc

    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl

    data = frames(gib)
    buffer = ReplayBuffer(
        len(data), gym.spaces.Box(0, 255, FRAME, np.uint8), gym.spaces.Discrete(4),
        device="cpu", optimize_memory_usage=True, handle_timeout_termination=False,
    )  # fmt: skip
    buffer.observations[:, 0] = data  # the same frames (next_obs are the next rows)
    buffer.full = True
    del data
    held = {"buffer": buffer}  # dropped before the load
    del buffer
    path = where / "replay.pkl"

    def save() -> dict[str, Any]:
        t = time.perf_counter()
        save_to_pkl(path, held["buffer"])  # what model.save_replay_buffer(path) does
        pause = time.perf_counter() - t
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"pause_s": pause}

    timed("save", save)
    change_one_percent(held["buffer"].observations[:, 0])
    timed("incremental", save)
    held.clear()
    gc.collect()
    drop_cache(path)
    loaded: list[Any] = []

    def load() -> dict[str, Any]:
        loaded.append(load_from_pkl(path))
        return {"array_bytes": loaded[0].observations.nbytes}

    timed("load", load)


# ---- parent: sample each child from outside, print the table -----------------------------


class Sampler:
    """Peak RSS of another process, read every 2 ms from a thread of this one."""

    def __init__(self, proc: psutil.Process) -> None:
        self.proc = proc
        self.peak = proc.memory_info().rss
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.proc.memory_info().rss)
                self.samples += 1
            time.sleep(SAMPLE_EVERY_S)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(psutil.Error):
            self.peak = max(self.peak, self.proc.memory_info().rss)
        return self.peak


def measure(method: str, gib: float, where: Path) -> dict[str, dict[str, Any]]:
    cmd = [sys.executable, __file__, "--child", method, "--gib", str(gib), "--dir", str(where)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    ps = psutil.Process(proc.pid)
    out: dict[str, dict[str, Any]] = {}
    sampler: Sampler | None = None
    before_rss = before_wchar = 0
    try:
        for line in proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "READY":
                before_rss = ps.memory_info().rss
                before_wchar = ps.io_counters().write_chars
                sampler = Sampler(ps)
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif word == "SHA256":
                out["sha256"] = {"s": float(rest)}
            elif word == "DONE" and sampler is not None:
                peak = sampler.stop()
                name, _, info = rest.partition(" ")
                out[name] = {
                    **json.loads(info),
                    "extra_rss": peak - before_rss,
                    "rss_samples": sampler.samples,
                    "written": ps.io_counters().write_chars - before_wchar,
                }
                sampler = None
    finally:
        if sampler is not None:
            sampler.stop()
        if proc.wait(600) != 0 or not {"save", "incremental", "load"} <= set(out):
            raise SystemExit(f"{method}: the child failed (exit {proc.returncode}, got {out})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--child", choices=("sdk", "sb3"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        (child_sdk if args.child == "sdk" else child_sb3)(args.gib, args.dir)
        return
    print(host_line(), flush=True)
    res: dict[str, dict[str, dict[str, Any]]] = {}
    for method in ("sdk", "sb3"):
        where = Path(tempfile.mkdtemp(prefix=f"sdk-arrays-{method}-", dir=args.dir))
        try:
            print(f"# {method} ...", file=sys.stderr, flush=True)
            res[method] = measure(method, args.gib, where)
        finally:
            shutil.rmtree(where, ignore_errors=True)
    sdk, sb3 = res["sdk"], res["sb3"]
    sha256_s = sdk.pop("sha256")["s"]
    sb3_pause = {k: {"s": v.get("pause_s", v["s"])} for k, v in sb3.items()}
    for v in (*sdk.values(), *sb3.values()):
        v["extra_rss_beyond"] = v["extra_rss"] - v.get("array_bytes", 0)
    rows: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
        ("save: extra RSS (MiB)", sdk["save"], sb3["save"], "extra_rss", "mib"),
        ("save: time, durable (s)", sdk["save"], sb3["save"], "s", "s"),
        ("save: longest pause, sb3 without fsync (s)", sdk["save"], sb3_pause["save"], "s", "s"),
        ("save: bytes written (MiB)", sdk["save"], sb3["save"], "written", "mib"),
        ("1 % changed: bytes written (MiB)", sdk["incremental"], sb3["incremental"], "written",
         "mib"),
        ("1 % changed: extra RSS (MiB)", sdk["incremental"], sb3["incremental"], "extra_rss",
         "mib"),
        ("1 % changed: time, durable (s)", sdk["incremental"], sb3["incremental"], "s", "s"),
        ("1 % changed: pause, sb3 without fsync (s)", sdk["incremental"],
         sb3_pause["incremental"], "s", "s"),
        ("load: time, cold cache (s)", sdk["load"], sb3["load"], "s", "s"),
        ("load: extra RSS beyond the array (MiB)", sdk["load"], sb3["load"], "extra_rss_beyond",
         "mib"),
    ]  # fmt: skip
    print(f"\n{args.gib:g} GiB of 84x84 uint8 frames; each method in its own process")
    print(f"{'':44s} {'sdk':>9s} {'sb3 pickle':>11s} {'sdk/sb3':>9s}")
    for label, a_row, b_row, key, unit in rows:
        a, b = a_row[key], b_row[key]
        cells = f"{a / MIB:9.0f} {b / MIB:11.0f}" if unit == "mib" else f"{a:9.2f} {b:11.2f}"
        tiny = unit == "mib" and min(abs(a), abs(b)) < MIB  # a ratio of noise
        ratio = "        -" if tiny or b <= 0 else f"{a / b:9.3f}"
        print(f"{label:44s} {cells} {ratio}")
    inc = sdk["incremental"]
    print(
        f"sdk after 1 % changed: {inc['sdk_written'] / MIB:.0f} MiB of chunks written, "
        f"{inc['sdk_linked'] / MIB:.0f} MiB hard-linked from the previous checkpoint; "
        f"RSS sampled every {SAMPLE_EVERY_S * 1000:.0f} ms by the parent "
        f"({min(v['rss_samples'] for v in (*sdk.values(), *sb3.values()))} samples at least)"
    )
    print(
        f"sdk: the sha256 of every byte (its manifest; the load verifies them) takes "
        f"{sha256_s:.2f} s alone on this CPU; its 16 MiB chunks are hashed on a second core "
        "as they are written and fsynced together at commit"
    )
    facts = {"host": host_facts(), "gib": args.gib, "sdk_sha256_s": sha256_s}
    print(json.dumps({**facts, "sdk": sdk, "sb3": sb3}))


if __name__ == "__main__":
    main()
