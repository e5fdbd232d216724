"""The training stall per checkpoint, as the worker runs it: PPO on an Atari game, DQN with its
replay buffer full.

    python benchmarks/checkpoint_stall.py [--algo ppo|dqn|both] [--game Pong-v5]
                                          [--checkpoints 8] [--buffer-size 100000] [--dir DIR]

Each learner trains in this process (envpool, the worker's settings) and is checkpointed the
way training/session.py does: `Checkpointer.save_async` after an iteration, the write, fsync and
commit on its thread while the next iterations run, into a real store under --dir. Per
checkpoint it records what the loop paid:

- the pause: `CheckpointResult.pause_s` (the capture: the learner's tensors copied into host
  buffers, the replay buffer's copy-on-write snapshot) plus any wait of the loop's own
  (`save_async` refused while one is in flight: counted; the loop simply asks again);
- the slowdown of the iterations that ran while the writer did (GIL, memory bandwidth, the
  replay chunks the loop copies before the writer reaches them): their time minus the median
  of the iterations that ran with no write in flight, summed per checkpoint.

Baselines measured in the same run: the capture as it was before (the learner serialised with
torch.save in the loop), and the synchronous save (what a checkpoint costs the loop when it is
not written in the background). The DQN buffer is filled to capacity with synthetic Atari-like
frames before training, so every checkpoint's snapshot spans the whole ring (the first writes
all of it; the later ones link the unchanged chunks and write the new ones). Ends with one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostinfo import host_facts, host_line

GOALS_S = {"ppo": 0.020, "dqn": 0.050}


def build(args: argparse.Namespace, algo: str) -> Any:
    import torch

    from training.args import WorkerConfig, validate
    from training.registry import make_learner

    torch.set_num_threads(args.threads)
    cfg = WorkerConfig(
        game=args.game, algo=algo, total_steps=10**9, threads=args.threads,
        buffer_size=args.buffer_size, eval_episodes=0,
    )  # fmt: skip
    cfg = validate(cfg)
    learner = make_learner(cfg, torch.device("cpu"), 1)
    learner.warmup_optimizer()
    if algo == "dqn":
        fill_replay(learner)
        if args.dqn_learning:
            # Past learning_starts, with the gradient steps due so far counted as taken.
            learner.global_step = cfg.learning_starts
            learner.updates = learner._updates_due(learner.global_step)
    return cfg, learner


def fill_replay(learner: Any) -> None:
    """Fill the learner's ring once round with blocky noisy frames (like Atari's: not zeros)."""
    buf = learner.replay
    rng = np.random.default_rng(0)
    n = learner.cfg.num_envs
    ids = np.arange(n)
    block = rng.integers(0, 8, (64, *buf.frame_shape), dtype=np.uint8) * 30
    stack = np.stack([np.roll(block, k, axis=0) for k in range(buf.stack - 1, -1, -1)], axis=1)
    zeros = np.zeros(n)
    buf.add_reset(ids, stack[:n])
    for i in range(-(-(buf.capacity + n) // n)):
        j = (i * 7) % (len(stack) - n)
        buf.add_step(ids, zeros, zeros, zeros, stack[j : j + n])
    learner.replay = buf  # the envs restart with add_reset, as after a restore


def counters() -> dict[str, Any]:
    return {"benchmark": "checkpoint_stall", "time": time.time()}


def run_algo(args: argparse.Namespace, algo: str, root: Path) -> dict[str, Any]:
    import structlog

    from checkpoints import CheckpointStore
    from training.checkpointing import Checkpointer, CheckpointResult

    cfg, learner = build(args, algo)
    results: list[CheckpointResult] = []
    log = structlog.get_logger("checkpoint_stall")
    store = CheckpointStore(root / algo, keep=2)
    ck = Checkpointer(store, cfg, log, results.append)
    learner.iterate()  # warm: oneDNN primitives, allocations
    learner.iterate()
    every = args.every or 1

    # The worker's path: save_async every `every` iterations, asked again while refused. Each
    # checkpoint is preceded, after the same iteration, by a capture the way it was before
    # (serialised in the loop; its snapshot released at once): the baseline, interleaved so
    # that both meet the same caches and the same load.
    iters: list[tuple[float, int | None]] = []  # (seconds, checkpoint overlapping it)
    waits: list[float] = []
    inline: list[float] = []
    inline_cpu: list[float] = []
    cpu: list[float] = []  # the loop thread's CPU time in each save_async that took one
    refused = 0
    due = False
    i = 0
    while len(results) < args.checkpoints:
        writing = len(results) if ck.in_flight else None
        t0 = time.perf_counter()
        learner.iterate()
        dt = time.perf_counter() - t0
        if writing is None and ck.in_flight:
            writing = len(results)
        iters.append((dt, writing))
        i += 1
        if i % every == 0:
            due = True
        if due and not ck.in_flight:
            t0, c0 = time.perf_counter(), time.thread_time()
            cap = ck.capture(learner, counters())
            inline.append(time.perf_counter() - t0)
            inline_cpu.append(time.thread_time() - c0)
            if cap.replay_snapshot is not None:
                cap.replay_snapshot.release()
        if due:
            t0, c0 = time.perf_counter(), time.thread_time()
            taken = ck.save_async(learner, counters())
            waits.append(time.perf_counter() - t0)
            if taken:
                cpu.append(time.thread_time() - c0)
                due = False
            else:
                refused += 1
    ck.wait()
    n = len(results)
    clean = [dt for dt, k in iters if k is None]
    base = statistics.median(clean) if clean else 0.0
    extra: dict[int, float] = {}
    for dt, k in iters:
        if k is not None:
            extra[k] = extra.get(k, 0.0) + (dt - base)
    pauses = [r.pause_s for r in results]

    # The synchronous save: capture, write, fsync, commit, all in the loop.
    sync: list[float] = []
    for _ in range(args.sync_saves):
        t0 = time.perf_counter()
        ck.save_sync(learner, counters())
        sync.append(time.perf_counter() - t0)
    learner.close()
    print(f"{algo}: {n} checkpoints, pauses {[round(p, 4) for p in pauses]}", flush=True)
    return {
        "algo": algo,
        "game": cfg.game,
        "num_envs": cfg.num_envs,
        "replay_bytes": int(learner.replay.nbytes) if learner.replay is not None else 0,
        "checkpoints": n,
        "ok": all(r.ok for r in results[:n]),
        "every_iterations": every,
        "pause_s": pauses,
        "pause_median_s": statistics.median(pauses),
        "pause_worst_s": max(pauses),
        "save_async_refused": refused,
        "write_s_median": statistics.median(r.seconds for r in results[:n]),
        # What each save_async call cost the loop (the pause, the thread's start; a refused
        # call returns at once).
        "save_async_call_s": waits,
        "save_async_call_median_s": statistics.median(waits),
        "save_async_call_worst_s": max(waits),
        "iteration_median_s": base,
        # Iterations that ran while a write did, minus the median of those that did not
        # (noise-bound where an iteration lasts seconds and the write a fraction of one).
        "overlap_extra_s": [extra.get(k, 0.0) for k in range(n)],
        "inline_capture_median_s": statistics.median(inline),
        "inline_capture_worst_s": max(inline),
        "inline_capture_cpu_median_s": statistics.median(inline_cpu),
        "pause_cpu_median_s": statistics.median(cpu),
        "sync_save_median_s": statistics.median(sync),
        "goal_s": GOALS_S[algo],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algo", choices=("ppo", "dqn", "both"), default="both")
    ap.add_argument("--game", default="Pong-v5")
    ap.add_argument("--checkpoints", type=int, default=8)
    ap.add_argument("--sync-saves", type=int, default=3)
    ap.add_argument("--every", type=int, default=0, help="iterations between checkpoints")
    ap.add_argument("--buffer-size", type=int, default=100_000, help="DQN replay capacity")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--dqn-learning",
        action="store_true",
        help="DQN past learning_starts (64 gradient steps per iteration: slow on 2 cores); by "
        "default it acts and fills the ring only, which checkpoints the same state",
    )
    ap.add_argument("--dir", default=None, help="where the store goes (default: a temp dir)")
    args = ap.parse_args()
    print(host_line(), flush=True)
    root = Path(tempfile.mkdtemp(prefix="rlsup-stall-", dir=args.dir))
    try:
        rows = [
            run_algo(args, a, root)
            for a in (("ppo", "dqn") if args.algo == "both" else (args.algo,))
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ms = 1000.0
    print(
        f"{'algo':<5}{'pause ms: median':>17}{'worst':>7}{'CPU':>6}{'refused':>9}{'write s':>9}"
        f"{'before: capture ms':>20}{'CPU':>6}{'sync save ms':>14}{'goal ms':>9}"
    )
    for r in rows:
        print(
            f"{r['algo']:<5}{r['pause_median_s'] * ms:>17.1f}{r['pause_worst_s'] * ms:>7.1f}"
            f"{r['pause_cpu_median_s'] * ms:>6.1f}{r['save_async_refused']:>9}"
            f"{r['write_s_median']:>9.2f}{r['inline_capture_median_s'] * ms:>20.1f}"
            f"{r['inline_capture_cpu_median_s'] * ms:>6.1f}{r['sync_save_median_s'] * ms:>14.0f}"
            f"{r['goal_s'] * ms:>9.0f}"
        )
        before = r["inline_capture_median_s"] / r["pause_median_s"]
        before_cpu = r["inline_capture_cpu_median_s"] / max(r["pause_cpu_median_s"], 1e-9)
        sync = r["sync_save_median_s"] / r["pause_median_s"]
        print(
            f"  {r['algo']}: the pause is {before:.1f}x shorter than the capture before (its CPU "
            f"time {before_cpu:.1f}x), {sync:.0f}x shorter than a synchronous save"
        )
    print(json.dumps({"benchmark": "checkpoint_stall", "host": host_facts(), "rows": rows}))


if __name__ == "__main__":
    main()
