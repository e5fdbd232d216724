"""What the tracking bridge costs the daemon's tick: `TrackingBridgeParticipant.tick()` with
tracking on (TensorBoard and MLflow on an SQLite store, their thread busy sending) against off
(`[tracking] tensorboard = false`, no mlflow), over GAMES command games whose progress.csv grows
by one row per game every tick.

    python benchmarks/tracking_tick.py [--games 16] [--ticks 2000] [--tick-s 0.005]

The tick's own share is small (a few fields per game copied into a snapshot); the thread reads
and sends off the tick, but it shares the interpreter's lock, so the figure is measured with it
running. Ends with one JSON line: per-tick microseconds (median, p99) on and off, and the rows
the thread sent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.config import load_config
from supervisor.lifecycle.runtime import GameRuntime
from supervisor.participants.tick import TickView
from supervisor.participants.tracking import TrackingBridgeParticipant

HEADER = "time,wall_s,global_step,episodes,sps,mean_return,num_envs,batch_size,resume_count,loss\n"


def config(where: Path, games: int, on: bool) -> Path:
    text = 'state_dir = "state"\n[modes.light]\nnum_envs = 2\nbatch_size = 8\nmax_concurrent = 1\n'
    for i in range(games):
        text += f'[[games]]\nname = "g{i}"\ncommand = ["true"]\ndevice = "cpu"\nknobs = []\n'
    text += "[tracking]\n" + (
        'mlflow = { experiment = "bench" }\n' if on else "tensorboard = false\n"
    )
    path = where / "rlsup.toml"
    path.write_text(text)
    return path


def measure(games: int, ticks: int, tick_s: float, on: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(config(Path(tmp), games, on))
        runtimes = tuple(GameRuntime(spec=spec) for spec in cfg.games)
        for spec in cfg.games:
            run_dir = cfg.run_dir(spec.name)
            run_dir.mkdir(parents=True)
            (run_dir / "progress.csv").write_text(HEADER)
        part = TrackingBridgeParticipant(cfg)
        part.start()
        took: list[float] = []
        try:
            for t in range(ticks):
                step = (t + 1) * 10
                for spec in cfg.games:
                    run_dir = cfg.run_dir(spec.name)
                    with (run_dir / "progress.csv").open("a") as f:
                        f.write(f"{time.time():.3f},{t},{step},1,10,1.5,2,8,0,{step / 1000}\n")
                    if t % 50 == 0:  # a checkpoint every 50 ticks
                        (run_dir / "checkpoints" / f"ckpt-{step:012d}").mkdir(parents=True)
                view = TickView(time.monotonic(), time.time(), False, runtimes,
                                None, None, None, frozenset())  # type: ignore[arg-type]  # fmt: skip
                began = time.perf_counter()
                part.tick(view)
                took.append((time.perf_counter() - began) * 1e6)
                time.sleep(tick_s)
        finally:
            part.close()
        sent = sum(int(run.get("step", -1)) > 0 for s in part.bridge.state.sinks.values()
                   for run in s.values())  # fmt: skip
        took.sort()
        return {
            "median_us": round(statistics.median(took), 1),
            "p99_us": round(took[int(len(took) * 0.99)], 1),
            "passes": part.bridge.passes,
            "runs_sent": sent,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--games", type=int, default=16)
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--tick-s", type=float, default=0.005)
    args = ap.parse_args()
    off = measure(args.games, args.ticks, args.tick_s, on=False)
    on = measure(args.games, args.ticks, args.tick_s, on=True)
    print(json.dumps({"games": args.games, "ticks": args.ticks, "off": off, "on": on}))


if __name__ == "__main__":
    main()
