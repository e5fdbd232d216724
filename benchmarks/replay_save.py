"""Replay-buffer checkpoint benchmark: rlsup (background snapshot) vs inline vs pickle+gzip vs dd.

    python benchmarks/replay_save.py --size-gib 2 [--method rlsup|rlsup-inline|pickle-gzip|dd|all]
                                     [--dir DIR] [--gzip-level 1]

Each method runs in its own subprocess, so "peak extra RSS" (psutil sampled every 5 ms, minus
the RSS just before the phase) is that method's alone. The buffer holds Atari-like 84x84 uint8
frames: a 64-frame block of blocky 8-grey images with 2 % noise (gzip level 1 compresses it
about 5x, like real Atari frames), tiled over the ring. A simulated training loop (single
thread: 8-env add_step + a 32-transition sample per iteration, paced at --loop-hz) runs while
the save happens; "longest pause" is the worst lateness of an iteration's end against its
schedule, so it includes GIL waits and copy-on-write copies. Load memory is measured in a
forked child with ru_maxrss (the kernel's peak), as extra beyond the buffer itself. Files are
evicted from the page cache (posix_fadvise DONTNEED) before each load, so loads read the disk.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostinfo import host_facts, host_line

from checkpoints import CheckpointStore
from training.replay import ReplayBuffer, is_chunk_file
from training.replay_load import load_buffer

FRAME = (84, 84)
FRAME_BYTES = 84 * 84
N_ENVS = 8
BATCH = 32
MIB = 1 << 20
METHODS = ("rlsup", "rlsup-inline", "pickle-gzip", "dd")

# ---- helpers -------------------------------------------------------------------------------


class PeakRss:
    """Samples this process's RSS in a thread; `extra` = peak minus the RSS at start."""

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
    def extra(self) -> int:
        return self.peak - self.start


def frame_block(rng: np.random.Generator, n: int = 64) -> np.ndarray:
    palette = np.array([0, 20, 40, 87, 110, 144, 180, 214], np.uint8)
    small = palette[rng.integers(0, len(palette), (n, 21, 21))]
    frames = np.repeat(np.repeat(small, 4, axis=1), 4, axis=2)
    noise = rng.random(frames.shape) < 0.02
    frames[noise] = rng.integers(0, 256, int(noise.sum()), dtype=np.uint8)
    # (n, 4, 84, 84) stacks; the buffer keeps only the newest frame of each next_obs.
    return np.stack([np.roll(frames, k, axis=0) for k in (3, 2, 1, 0)], axis=1)


class Feeder:
    """Feeds add_reset/add_step calls from a small random block (cheap, not all zeros)."""

    def __init__(self, buf: ReplayBuffer, seed: int = 0) -> None:
        self.buf = buf
        self.rng = np.random.default_rng(seed)
        self.block = frame_block(self.rng)
        self.ids = np.arange(N_ENVS)
        self.zeros = np.zeros(N_ENVS)
        self.i = 0
        buf.add_reset(self.ids, self.block[:N_ENVS])

    def step(self) -> None:
        j = (self.i * 7) % (len(self.block) - N_ENVS)
        self.i += 1
        self.buf.add_step(self.ids, self.zeros, self.zeros, self.zeros, self.block[j : j + N_ENVS])

    def fill(self, frames: int) -> None:
        for _ in range(-(-frames // N_ENVS)):
            self.step()


def make_buffer(size_bytes: int) -> tuple[ReplayBuffer, Feeder]:
    buf = ReplayBuffer(size_bytes // FRAME_BYTES, FRAME, np.uint8, 4)
    feeder = Feeder(buf)
    feeder.fill(buf.capacity + N_ENVS)  # wrapped once: every chunk holds data
    gc.collect()
    return buf, feeder


class Loop:
    """A paced single-thread training loop: add_step for 8 envs + one sample per iteration."""

    def __init__(self, feeder: Feeder, hz: float) -> None:
        self.feeder = feeder
        self.period = 1.0 / hz
        self.rng = np.random.default_rng(1)

    def run(
        self, until: Callable[[], bool], first: Callable[[], None] | None = None
    ) -> dict[str, float]:
        """Iterate until `until()`; `first` runs inside the first iteration (e.g. a save)."""
        pauses: list[float] = []
        starts: list[float] = []
        deadline = time.perf_counter()
        t0 = deadline
        while True:
            if first is not None:
                first()
                first = None
            self.feeder.step()
            self.feeder.buf.sample(BATCH, self.rng)
            end = time.perf_counter()
            pauses.append(end - deadline)
            starts.append(deadline - t0)
            if until():
                break
            deadline = max(deadline + self.period, end)  # never "catch up" in a burst
            delay = deadline - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        elapsed = time.perf_counter() - t0
        return {
            "iterations": len(pauses),
            "seconds": elapsed,
            "it_per_s": len(pauses) / elapsed if elapsed > 0 else 0.0,
            "max_pause_s": max(pauses),
            "p99_pause_s": float(np.percentile(pauses, 99)),
            "max_pause_at_s": starts[int(np.argmax(pauses))],
        }


def in_fresh_process(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run fn in a forked child and add its peak extra RSS: ru_maxrss (the kernel's own peak,
    which a sampler thread can miss while a C call holds the GIL) minus the RSS at fork."""
    import resource

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            start = psutil.Process().memory_info().rss
            res = fn()
            res["peak_extra_bytes"] = (
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start
            )
            os.write(w, json.dumps(res).encode())
        except BaseException as exc:
            os.write(w, json.dumps({"error": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = json.loads(f.read() or b"{}")
    os.waitpid(pid, 0)
    if "error" in out or not out:
        raise RuntimeError(f"child failed: {out}")
    return dict(out)


def load_in_fresh_interpreter(root: Path, how: str, nbytes: int) -> dict[str, Any]:
    """A worker's load, as a restarted worker does it: in a new interpreter (see load_child)."""
    cmd = [sys.executable, __file__, "--load-child", str(root), "--method", how]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            out = dict(json.loads(line[len("RESULT ") :]))
            assert out.get("nbytes", nbytes) == nbytes
            return out
    raise RuntimeError(f"load ({how}) failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def load_child(root: Path, how: str) -> dict[str, Any]:
    """one: the worker's load (chunks hashed as they are read: one pass over the disk), then
    the same bytes hashed again from memory on the same threads (the CPU's share). two: the
    two passes it replaced (every file hashed, then every chunk read into the arrays).
    two-evicted: the same with the files dropped from the page cache between the passes, as
    when the buffer is larger than the memory the page cache has left."""
    import resource

    from checkpoints import _parallel

    store = CheckpointStore(root, keep=3)
    start_rss = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    rchar0 = read_bytes_so_far()
    if how == "one":
        loaded = store.load_latest(salvage=is_chunk_file, verify_on_read=is_chunk_file)
    else:
        loaded = store.load_latest()
    verify_s = time.perf_counter() - t0
    assert loaded is not None
    if how == "two-evicted":  # a buffer larger than the page cache: the verify's pages are gone
        evict(root)
    back = load_buffer(loaded)
    load_s = time.perf_counter() - t0
    assert back.load_damage is None
    out = {
        "verify_s": verify_s,
        "load_s": load_s,
        "read": read_bytes_so_far() - rchar0,
        "nbytes": back.nbytes,
        "peak_extra_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start_rss,
    }
    if how == "one":
        import hashlib

        frames = back._frames.reshape(-1).view(np.uint8)
        step = 8 << 20
        pieces = [frames[i : i + step] for i in range(0, len(frames), step)]
        t0 = time.perf_counter()
        list(_parallel.pool().map(lambda a: hashlib.sha256(a).digest(), pieces))
        out["hash_mem_s"] = time.perf_counter() - t0
    return out


def read_bytes_so_far() -> int:
    """Bytes this process has read through read(2) (/proc/self/io rchar, cache hits too)."""
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def evict(root: Path) -> None:
    """Drop our own files from the page cache so the next read goes to disk."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield


# ---- methods (each runs in a child process) ----------------------------------------------


def bench_rlsup(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    size = int(args.size_gib * (1 << 30))
    t = time.perf_counter()
    buf, feeder = make_buffer(size)
    fill_s = time.perf_counter() - t
    store = CheckpointStore(work / "ckpt", keep=3)
    loop = Loop(feeder, args.loop_hz)
    start = time.perf_counter()
    baseline = loop.run(lambda: time.perf_counter() - start > 1.5)

    result: dict[str, Any] = {}
    done = threading.Event()
    snap_box: list[Any] = []

    def saver(buf: ReplayBuffer = buf) -> None:  # default arg: `buf` is deleted below
        snap = snap_box[0]
        t0 = time.perf_counter()
        with store.begin(1, {"game": "Pong-v5", "algo": "dqn"}) as w:
            buf.save(w, snap)
            w.commit()
        buf.mark_committed(snap, 1)
        result["save_s"] = time.perf_counter() - t0
        result["stats"] = vars(w.stats).copy()
        done.set()

    def start_save(buf: ReplayBuffer = buf, target: Callable[..., None] = saver) -> None:
        t0 = time.perf_counter()
        snap_box.append(buf.begin_snapshot())
        result["begin_snapshot_s"] = time.perf_counter() - t0
        threading.Thread(target=target, daemon=True).start()

    with PeakRss() as mem:
        during = loop.run(done.is_set, first=start_save)
    snap = snap_box[0]
    # The same loop with no save, as long as the save took (<= 10 s): this shared machine
    # has scheduling hiccups of its own, and a short baseline would miss them.
    span = min(result["save_s"], 10.0)
    start = time.perf_counter()
    after = loop.run(lambda: time.perf_counter() - start > span)
    baseline["max_pause_s"] = max(baseline["max_pause_s"], after["max_pause_s"])

    # Incremental: a base checkpoint that includes what the loop wrote during the save above,
    # then 1 % new data, then the measured checkpoint (inline: we want its own cost).
    for step, new_frames in ((2, 0), (3, buf.capacity // 100)):
        feeder.fill(new_frames)
        t0 = time.perf_counter()
        snap2 = buf.begin_snapshot()
        with store.begin(step, {"game": "Pong-v5", "algo": "dqn"}) as w:
            buf.save(w, snap2)
            w.commit()
        buf.mark_committed(snap2, step)
    inc_s = time.perf_counter() - t0
    inc = vars(w.stats).copy()

    nbytes = buf.nbytes
    del buf, feeder, loop, snap, snap2, saver, start_save
    gc.collect()
    evict(work / "ckpt")

    # The disk's own sequential read of the same files (the newest checkpoint's: its chunks
    # hard-linked from the older ones included), each from disk, in the same run: dd once per
    # file (a process each), and all of them read by one process (cat), with no process start
    # between files. The load is compared with the faster of the two.
    newest = max(p for p in (work / "ckpt").iterdir() if p.name.startswith("ckpt-"))
    files = sorted(p for p in newest.rglob("*") if p.is_file())

    def dd_each() -> float:
        t0 = time.perf_counter()
        for f in files:
            subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=16M", "status=none"], check=True)
        return time.perf_counter() - t0

    def cat_all() -> float:
        t0 = time.perf_counter()
        subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - t0

    # Interleaved, each from a cold page cache and in a fresh interpreter (as a restarted worker
    # loads), five times, medians and spreads: this VM's timings wander from run to run, and
    # the first load after the machine sat idle is seconds slower whichever way it reads.
    runs: dict[str, list[Any]] = {k: [] for k in ("one", "two", "two-evicted")}
    runs.update(dd=[], cat=[])
    evict(work / "ckpt")
    load_in_fresh_interpreter(work / "ckpt", "two", nbytes)  # a warm-up, not counted (below)
    for _ in range(5):
        for kind, measure in (
            ("one", lambda: load_in_fresh_interpreter(work / "ckpt", "one", nbytes)),
            ("two", lambda: load_in_fresh_interpreter(work / "ckpt", "two", nbytes)),
            (
                "two-evicted",
                lambda: load_in_fresh_interpreter(work / "ckpt", "two-evicted", nbytes),
            ),
            ("dd", dd_each),
            ("cat", cat_all),
        ):
            evict(work / "ckpt")
            runs[kind].append(measure())
    lres = sorted(runs["one"], key=lambda r: r["load_s"])[2]
    two = sorted(runs["two"], key=lambda r: r["load_s"])[2]
    two_evicted = sorted(runs["two-evicted"], key=lambda r: r["load_s"])[2]
    hash_mem_s = sorted(r["hash_mem_s"] for r in runs["one"])[2]
    dd_read_s = sorted(runs["dd"])[2]
    cat_read_s = sorted(runs["cat"])[2]
    read_bytes = sum(f.stat().st_size for f in files)
    return {
        "method": "rlsup",
        "dd_read_s": dd_read_s,
        "dd_read_bytes": read_bytes,
        "bytes": nbytes,
        "fill_s": fill_s,
        "save_s": result["save_s"],
        "gb_per_s": nbytes / result["save_s"] / 1e9,
        "begin_snapshot_s": result["begin_snapshot_s"],
        "peak_extra_rss_mib": mem.extra / MIB,
        "max_pause_s": during["max_pause_s"],
        "p99_pause_s": during["p99_pause_s"],
        "max_pause_at_s": during["max_pause_at_s"],
        "baseline_max_pause_s": baseline["max_pause_s"],
        "loop_it_per_s_baseline": baseline["it_per_s"],
        "loop_it_per_s_during_save": during["it_per_s"],
        "chunks_copied_by_loop": snap_box[0].chunks_copied_by_loop,
        "max_private_chunks": snap_box[0].max_private_chunks,
        "save_stats": result["stats"],
        "incremental_s": inc_s,
        "incremental_bytes_written": inc["bytes_written"],
        "incremental_bytes_linked": inc["bytes_linked"],
        "incremental_fraction_written": inc["bytes_written"] / result["stats"]["bytes_written"],
        "load_s": lres["load_s"],
        "load_verify_s": lres["verify_s"],
        "load_read_bytes": lres["read"],
        "load_extra_rss_mib": (lres["peak_extra_bytes"] - nbytes) / MIB,
        "two_pass_load_s": two["load_s"],
        "two_pass_verify_s": two["verify_s"],
        "two_pass_read_bytes": two["read"],
        "cat_read_s": cat_read_s,
        "two_pass_evicted_load_s": two_evicted["load_s"],
        "two_pass_evicted_runs_s": [r["load_s"] for r in runs["two-evicted"]],
        "hash_in_memory_s": hash_mem_s,
        "load_runs_s": [r["load_s"] for r in runs["one"]],
        "two_pass_runs_s": [r["load_s"] for r in runs["two"]],
        "dd_runs_s": runs["dd"],
        "cat_runs_s": runs["cat"],
    }


def bench_rlsup_inline(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    size = int(args.size_gib * (1 << 30))
    buf, feeder = make_buffer(size)
    store = CheckpointStore(work / "ckpt", keep=3)
    loop = Loop(feeder, args.loop_hz)
    box: dict[str, float] = {}

    def save_inline() -> None:
        t0 = time.perf_counter()
        snap = buf.begin_snapshot()
        with store.begin(1, {"game": "Pong-v5"}) as w:
            buf.save(w, snap)
            w.commit()
        buf.mark_committed(snap, 1)
        box["save_s"] = time.perf_counter() - t0

    n = [0]

    def until() -> bool:
        n[0] += 1
        return n[0] >= 50

    with PeakRss() as mem:
        during = loop.run(until, first=save_inline)
    return {
        "method": "rlsup-inline",
        "bytes": buf.nbytes,
        "save_s": box["save_s"],
        "gb_per_s": buf.nbytes / box["save_s"] / 1e9,
        "peak_extra_rss_mib": mem.extra / MIB,
        "max_pause_s": during["max_pause_s"],
    }


def bench_pickle_gzip(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    # pickle+gzip is slow (CPU-bound gzip): by default it runs at <= 1 GiB and is scaled
    # linearly to --size-gib (time and memory both grow linearly); the table says so.
    gib = args.pickle_gib if args.pickle_gib is not None else min(args.size_gib, 1.0)
    buf, _ = make_buffer(int(gib * (1 << 30)))
    state = {"frames": buf.frames, "slots": buf.slot_records, "cursor": buf.cursor}
    path = work / "replay.pkl.gz"
    with PeakRss() as mem:
        t0 = time.perf_counter()
        # What RL code commonly does: pickle (default protocol, 4) into a gzip stream.
        with open(path, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=args.gzip_level) as f:
                pickle.dump(state, f)
            raw.flush()
            os.fsync(raw.fileno())
        save_s = time.perf_counter() - t0
    nbytes = buf.nbytes
    file_bytes = path.stat().st_size
    del state, buf
    gc.collect()
    evict(work)

    def load() -> dict[str, Any]:
        t0 = time.perf_counter()
        with gzip.open(path, "rb") as f:
            back = pickle.load(f)  # our own file, benchmark only
        assert back["frames"].nbytes + back["slots"].nbytes == nbytes
        return {"load_s": time.perf_counter() - t0}

    lres = in_fresh_process(load)
    load_s = lres["load_s"]
    scale = args.size_gib / gib
    return {
        "method": "pickle-gzip",
        "gzip_level": args.gzip_level,
        "measured_gib": gib,
        "extrapolated": scale != 1.0,
        "bytes": nbytes,
        "file_bytes": file_bytes,
        "save_s": save_s * scale,
        "gb_per_s": nbytes / save_s / 1e9,
        "peak_extra_rss_mib": mem.extra / MIB * scale,
        "max_pause_s": save_s * scale,  # synchronous: the loop waits for all of it
        "load_s": load_s * scale,
        "load_extra_rss_mib": (lres["peak_extra_bytes"] - nbytes) / MIB * scale,
    }


def bench_dd(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    count = max(1, int(args.size_gib * (1 << 30)) // (16 * MIB))
    path = work / "dd.bin"
    t0 = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", "conv=fdatasync"],
        check=True,
        capture_output=True,
    )
    secs = time.perf_counter() - t0
    nbytes = count * 16 * MIB
    return {"method": "dd", "bytes": nbytes, "save_s": secs, "gb_per_s": nbytes / secs / 1e9}


BENCHES = {
    "rlsup": bench_rlsup,
    "rlsup-inline": bench_rlsup_inline,
    "pickle-gzip": bench_pickle_gzip,
    "dd": bench_dd,
}

# ---- parent: run children, print the table ----------------------------------------------


def run_child(method: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--method",
        method,
        "--size-gib",
        str(args.size_gib),
        "--dir",
        str(base),
        "--gzip-level",
        str(args.gzip_level),
        "--loop-hz",
        str(args.loop_hz),
    ]
    if args.pickle_gib is not None:
        cmd += ["--pickle-gib", str(args.pickle_gib)]
    print(f"# running {method} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    raise RuntimeError(f"{method} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def fmt(v: Any, spec: str) -> str:
    return format("-", ">" + spec.split(".")[0]) if v is None else format(v, spec)


def print_table(res: dict[str, dict[str, Any]], size_gib: float) -> None:
    print(f"\nreplay buffer checkpoint, {size_gib} GiB of 84x84 uint8 frames")
    head = f"{'method':<14}{'save s':>9}{'GB/s':>8}{'peak +RSS MiB':>15}{'load s':>9}"
    head += f"{'load +RSS MiB':>15}{'longest pause s':>17}"
    print(head)
    for name in METHODS:
        r = res.get(name)
        if r is None:
            continue
        row = f"{name:<14}{fmt(r.get('save_s'), '9.2f')}{fmt(r.get('gb_per_s'), '8.2f')}"
        row += f"{fmt(r.get('peak_extra_rss_mib'), '15.0f')}{fmt(r.get('load_s'), '9.2f')}"
        row += f"{fmt(r.get('load_extra_rss_mib'), '15.0f')}{fmt(r.get('max_pause_s'), '17.3f')}"
        print(row)
    r = res.get("rlsup")
    if r is None:
        return
    print(
        f"\nrlsup: begin_snapshot {r['begin_snapshot_s'] * 1e3:.2f} ms; loop max pause with no "
        f"save running (same duration) {r['baseline_max_pause_s']:.3f} s; "
        f"loop {r['loop_it_per_s_baseline']:.0f} it/s "
        f"before vs {r['loop_it_per_s_during_save']:.0f} it/s during the save; chunks copied by "
        f"the loop {r['chunks_copied_by_loop']} (max {r['max_private_chunks']} held at once)"
    )
    print(
        f"rlsup incremental after 1% new data: {r['incremental_bytes_written'] / MIB:.0f} MiB "
        f"written, {r['incremental_bytes_linked'] / MIB:.0f} MiB hard-linked, "
        f"{r['incremental_fraction_written'] * 100:.2f}% of a full save, "
        f"{r['incremental_s']:.2f} s"
    )
    print(
        f"rlsup load (median of 5, each cold): one pass (chunks hashed as they are read) "
        f"{r['load_s']:.2f} s, {r['load_read_bytes'] / MIB:.0f} MiB read; two passes (hash "
        f"every file, then read) {r['two_pass_load_s']:.2f} s = verify "
        f"{r['two_pass_verify_s']:.2f} s + read, {r['two_pass_read_bytes'] / MIB:.0f} MiB read; "
        f"two passes when the page cache cannot hold the buffer between them "
        f"{r['two_pass_evicted_load_s']:.2f} s"
    )
    print(
        f"rlsup load, its parts measured apart (medians): the disk's read of the files (cat) "
        f"{r['cat_read_s']:.2f} s; SHA-256 of the same bytes from memory on the same threads "
        f"{r['hash_in_memory_s']:.2f} s"
    )
    ratios = []
    if "rlsup-inline" in res:
        ri = res["rlsup-inline"]
        ratios.append(f"pause vs inline: {ri['max_pause_s'] / r['max_pause_s']:.0f}x shorter")
    if "pickle-gzip" in res:
        pg = res["pickle-gzip"]
        note = f" (measured at {pg['measured_gib']} GiB, scaled)" if pg["extrapolated"] else ""
        ratios.append(
            f"vs pickle+gzip level {pg['gzip_level']}{note}: "
            f"save {pg['save_s'] / r['save_s']:.1f}x faster, "
            f"load {pg['load_s'] / r['load_s']:.1f}x faster, peak +RSS "
            f"{pg['peak_extra_rss_mib']:.0f} vs {r['peak_extra_rss_mib']:.0f} MiB"
        )
    if "dd" in res:
        ratios.append(f"save throughput {r['gb_per_s'] / res['dd']['gb_per_s'] * 100:.0f}% of dd")
    if r.get("dd_read_s"):
        disk_s = min(r["dd_read_s"], r["cat_read_s"])
        ratios.append(
            f"load (read + verify every chunk's SHA-256 + into the arrays) {r['load_s']:.2f} s "
            f"against the disk's sequential read of the same {r['dd_read_bytes'] / MIB:.0f} "
            f"MiB (dd per file {r['dd_read_s']:.2f} s, cat of all {r['cat_read_s']:.2f} s; "
            f"the faster): {disk_s / r['load_s'] * 100:.0f}% of the disk's speed (two passes: "
            f"{disk_s / r['two_pass_load_s'] * 100:.0f}%)"
        )
    for line in ratios:
        print("ratio: " + line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gib", type=float, default=2.0)
    p.add_argument(
        "--method", choices=[*METHODS, "all", "one", "two", "two-evicted"], default="all"
    )
    p.add_argument("--dir", type=Path, default=None, help="scratch dir (default: $TMPDIR)")
    p.add_argument("--gzip-level", type=int, default=1)
    p.add_argument(
        "--pickle-gib", type=float, default=None, help="pickle+gzip size (default <= 1), scaled"
    )
    p.add_argument("--loop-hz", type=float, default=300.0, help="8 envs/it: 2400 steps/s")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--load-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.load_child is not None:
        with quiet_logs():
            res = load_child(args.load_child, args.method)
        print("RESULT " + json.dumps(res), flush=True)
        return

    if args.child:
        work = Path(tempfile.mkdtemp(prefix=f"{args.method}-", dir=args.dir))
        try:
            with quiet_logs():
                res = BENCHES[args.method](args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print("RESULT " + json.dumps(res), flush=True)
        return

    base = args.dir if args.dir is not None else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    methods = list(METHODS) if args.method == "all" else [args.method]
    res = {m: run_child(m, args, base) for m in methods}
    print_table(res, args.size_gib)
    print(host_line())
    print(
        json.dumps(
            {
                "benchmark": "replay_save",
                "host": host_facts(),
                "size_gib": args.size_gib,
                "results": res,
            }
        )
    )


if __name__ == "__main__":
    main()
