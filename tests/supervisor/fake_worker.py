"""A stand-in worker (no torch) that honours training.protocol, for fast daemon-loop tests.

Heart-beats every 0.05 s, advances global_step by num_envs per beat, exits 0 at total_steps,
75 on SIGTERM. `<run_dir>/fake.json` can script a failure: {"exit": 78, "message": "..."}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from training.protocol import ERROR_FILE, HEARTBEAT_FILE, WorkerConfig


def main() -> int:
    cfg = WorkerConfig.from_argv(sys.argv[1:])
    run = Path(cfg.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    script = json.loads((run / "fake.json").read_text()) if (run / "fake.json").exists() else {}
    if "exit" in script:
        (run / ERROR_FILE).write_text(
            json.dumps({"kind": script.get("kind", "config"), "message": script.get("message", "")})
        )
        return int(script["exit"])
    progress = run / "progress.txt"
    step = int(progress.read_text()) if progress.exists() else 0
    resumed = step
    seq = 0
    while True:
        seq += 1
        step += cfg.num_envs
        hb = {
            "seq": seq,
            "pid": os.getpid(),
            "phase": "training",
            "phase_deadline_s": 10,
            "global_step": step,
            "total_steps": cfg.total_steps,
            "episodes": 0,
            "sps": 1.0,
            "mean_return": None,
            "last_checkpoint_step": step,
            "resumed_from_step": resumed,
            "num_envs": cfg.num_envs,
            "batch_size": cfg.batch_size,
            "device": "cpu",
            "gpu_mem_mb": None,
            "threads": cfg.threads,
        }
        tmp = run / "hb.tmp"
        tmp.write_text(json.dumps(hb))
        os.replace(tmp, run / HEARTBEAT_FILE)
        progress.write_text(str(step))
        if step >= cfg.total_steps:
            return 0
        if stop:
            return 75
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
