"""What the time ledger costs the supervisor: a replay of the whole ledger against the
incremental fold (issue 40), at 200k events.

Builds a state database of N events (30 games, a host that reboots every 20 minutes,
evaluations, crashes and backoffs), then times, in the same run:

- `full`: the split folded from the ledger's start (`account_db`: what `rlsup report` does, and
  what the supervisor did every 30 s and at its exit);
- `incremental`: what a snapshot costs now: the fold read back from accounting.json, the events
  of one snapshot interval after it folded, the split computed and the fold written again;
- the tick: a thread doing what a tick does (a small SQLite read, a file read, a sleep), its
  latency p50/p99/max while each of the two runs beside it in another thread (the GIL).

`--old FILE` also times a previous accounting.py's replay (`git show REV:supervisor/ledger/
accounting.py > FILE`). Prints a table, then ONE JSON line with the figures and the CPU.

    .venv/bin/python benchmarks/accounting_fold.py [--events 200000] [--new 200] [--old FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hostinfo import host_facts, host_line  # noqa: E402

from supervisor.ledger import accounting, db  # noqa: E402
from supervisor.ledger.fold_state import dump, load  # noqa: E402

GAMES = [f"game{i:02d}" for i in range(30)]


def build_ledger(path: Path, n: int, seed: int = 0) -> float:
    """n events of the accounting kinds and others, one supervisor life per 20 minutes; returns
    the last event's time."""
    rng = random.Random(seed)
    conn = db.connect(path)
    t = mono = time.time() - n * 3.0
    rows: list[tuple[float, str, str | None, str, float]] = []
    life_end = t + 1200
    state = dict.fromkeys(GAMES, "off")

    def add(kind: str, game: str | None, **detail: Any) -> None:
        rows.append((t, kind, game, json.dumps(detail), mono))

    add("supervisor_start", None, after="first", pid=1)
    while len(rows) < n:
        dt = rng.expovariate(1 / 3.0)
        t += dt
        mono += dt
        if t > life_end:
            t += 90
            mono = rng.uniform(0, 1e5)
            add("host_reboot", None, downtime_s=90)
            add("supervisor_start", None, after="host_reboot", downtime_s=90.0, pid=len(rows))
            state = {g: ("waiting" if s != "off" else s) for g, s in state.items()}
            life_end = t + 1200
            continue
        g = rng.choice(GAMES)
        s = state[g]
        if s in ("off", "waiting", "backoff"):
            add("worker_start", g, gpu={"index": rng.randrange(8), "uuid": "GPU-x"})
            state[g] = "starting"
        elif s == "starting":
            add("worker_training", g, served="cold", pid=1)
            state[g] = "running"
        elif rng.random() < 0.6:
            add("evaluation", g, step=len(rows), time=t, seconds=rng.uniform(1, 20), mean=1.0)
        elif rng.random() < 0.5:
            add("checkpoint_saved", g, step=len(rows))  # not an accounting kind
        else:
            add("worker_exit", g, exit="crash", returncode=1, global_step=len(rows) * 100,
                last_checkpoint_step=len(rows) * 100 - 5000)  # fmt: skip
            add("backoff", g, delay_s=1.0)
            state[g] = "backoff"
    with db.transaction(conn):
        conn.executemany(
            "INSERT INTO events(ts, kind, game, detail, mono) VALUES (?, ?, ?, ?, ?)", rows[:n]
        )
    conn.close()
    return t


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def tick_latency(
    work: Callable[[sqlite3.Connection], Any], seconds: float, state_dir: Path
) -> dict[str, float]:
    """A tick's latency (ms) while `work` runs in a loop in another thread for `seconds`."""
    stop = threading.Event()

    def loop() -> None:
        own = sqlite3.connect(state_dir / "rlsup.db")  # the accounting thread's own
        while not stop.is_set():
            work(own)
        own.close()

    conn = sqlite3.connect(state_dir / "rlsup.db")
    lat: list[float] = []
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        conn.execute("SELECT COUNT(*) FROM workers").fetchone()  # the tick's reads and writes
        for _ in range(30):
            (state_dir / "rlsup.db").stat()
        lat.append((time.perf_counter() - t0) * 1000.0)
        time.sleep(0.01)
    stop.set()
    th.join()
    conn.close()
    lat.sort()
    return {
        "p50_ms": round(lat[len(lat) // 2], 2),
        "p99_ms": round(lat[int(len(lat) * 0.99)], 2),
        "max_ms": round(lat[-1], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--new", type=int, default=200, help="events per snapshot interval")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tick-s", type=float, default=8.0)
    ap.add_argument("--old", type=Path, help="a previous accounting.py, to time its replay")
    args = ap.parse_args()
    facts = host_facts()
    print(host_line())
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        build_ledger(state, args.events)
        conn = sqlite3.connect(state / "rlsup.db")
        now = time.time()
        total = conn.execute("SELECT MAX(id) FROM events").fetchone()[0]
        cut = total - args.new

        def full(conn: sqlite3.Connection = conn) -> Any:
            return accounting.account_db(conn, GAMES, now, 3.6, 0.5)

        # the state the previous snapshot persisted: everything up to `cut`
        base = accounting.Fold(GAMES, 8)
        base.feed([r for r in accounting.read_rows(conn, 0) if r.id <= cut])
        saved = json.dumps(dump(base))

        def incremental(conn: sqlite3.Connection = conn) -> Any:
            fold = load(json.loads(saved))
            accounting.catch_up(conn, fold)
            times = fold.result(now, 3.6, 0.5)
            snap = accounting.snapshot(times, now, 3.6, 0.5, fold.money_rates(3.6, 0.5), fold)
            return json.dumps(snap)

        full_ms = timed(full, args.runs)
        inc_ms = timed(incremental, max(10, args.runs * 5))
        old_ms: list[float] = []
        if args.old is not None:
            spec = importlib.util.spec_from_file_location("old_accounting", args.old)
            assert spec is not None and spec.loader is not None
            old = importlib.util.module_from_spec(spec)
            sys.modules["old_accounting"] = old  # its dataclasses look their module up
            spec.loader.exec_module(old)
            old_ms = timed(lambda: old.account_db(conn, GAMES, now, 3.6, 0.5), args.runs)

        def replay(c: sqlite3.Connection) -> Any:
            return old.account_db(c, GAMES, now, 3.6, 0.5) if old_ms else full(c)

        tick_idle = tick_latency(lambda c: time.sleep(0.05), args.tick_s, state)
        tick_full = tick_latency(replay, args.tick_s, state)

        def snapshot_every(c: sqlite3.Connection) -> None:
            incremental(c)
            time.sleep(0.5)  # a snapshot every 30 s, compressed

        tick_inc = tick_latency(snapshot_every, args.tick_s, state)
        rows = conn.execute(
            f"SELECT COUNT(*) FROM events WHERE kind IN ({','.join('?' * len(accounting.KINDS))})",
            list(accounting.KINDS),
        ).fetchone()[0]
        conn.close()
    f, i = statistics.median(full_ms), statistics.median(inc_ms)
    print(f"events {args.events} ({rows} of the accounting kinds), {args.new} new per snapshot")
    if old_ms:
        print(f"old replay (--old)        {statistics.median(old_ms):10.1f} ms")
    print(f"full fold (from the start) {f:10.1f} ms")
    print(f"incremental snapshot       {i:10.2f} ms   ratio full/incremental {f / i:8.0f}x")
    print(f"tick idle          {tick_idle}")
    print(f"tick beside replay {tick_full}")
    print(f"tick beside fold   {tick_inc}")
    out = {
        "bench": "accounting_fold",
        "host": facts,
        "events": args.events,
        "accounting_rows": rows,
        "new_per_snapshot": args.new,
        "old_replay_ms": round(statistics.median(old_ms), 1) if old_ms else None,
        "full_fold_ms": round(f, 1),
        "incremental_ms": round(i, 2),
        "ratio": round(f / i, 1),
        "tick_idle": tick_idle,
        "tick_beside_replay": tick_full,
        "tick_beside_incremental": tick_inc,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
