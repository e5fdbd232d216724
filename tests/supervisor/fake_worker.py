"""A stand-in worker (no torch) that honours training.protocol, for fast daemon-loop tests.

Heart-beats every 0.05 s, advances global_step by num_envs per beat, exits 0 at total_steps,
75 on SIGTERM. `<run_dir>/fake.json` can script a failure: {"exit": 78, "message": "..."};
{"oom_above_envs": N}: exit 76 (OOM) when started with more than N envs;
{"checkpoint_failures": N, "last_checkpoint_error": "..."}: report failed checkpoint writes;
{"resume_from_checkpoints": true}: resume from the newest `checkpoints/ckpt-*` directory
(like the real worker: none left but `.corrupt-*` ones -> exit 78 no_valid_checkpoint);
{"crash_after_resume": true}: crash (exit 1) right after resuming, for a cause outside the
checkpoint (an env that fails to build, say); {"replay_damage": [...]}: report damaged replay
chunks in the heartbeat; {"stop_delay_s": S}: take S seconds to stop after SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from training.args import WorkerConfig
from training.protocol import ERROR_FILE, HEARTBEAT_FILE


def main() -> int:
    cfg = WorkerConfig.from_argv(sys.argv[1:])
    run = Path(cfg.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    script = json.loads((run / "fake.json").read_text()) if (run / "fake.json").exists() else {}
    if "exit" in script:
        return fail(run, int(script["exit"]), script.get("kind", "config"), script.get("message"))
    if cfg.num_envs > script.get("oom_above_envs", cfg.num_envs):
        return fail(run, 76, "oom", f"CUDA out of memory at {cfg.num_envs} envs")
    progress = run / "progress.txt"
    step = int(progress.read_text()) if progress.exists() else 0
    resumed: int | None = step
    last_ckpt: int | None = step
    crash_now = False
    if script.get("resume_from_checkpoints"):
        ckpts = run / "checkpoints"
        names = sorted(p.name for p in ckpts.glob("ckpt-*")) if ckpts.is_dir() else []
        if not names and ckpts.is_dir() and any(ckpts.glob(".corrupt-*")):
            return fail(run, 78, "no_valid_checkpoint", "checkpoints exist but none verifies")
        resumed = last_ckpt = int(names[-1][5:]) if names else None
        step = resumed or 0
        crash_now = bool(names) and bool(script.get("crash_after_resume"))
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
            "last_checkpoint_step": last_ckpt if script.get("resume_from_checkpoints") else step,
            "resumed_from_step": resumed,
            "num_envs": cfg.num_envs,
            "batch_size": cfg.batch_size,
            "device": "cpu",
            "gpu_mem_mb": None,
            "threads": cfg.threads,
            "checkpoint_failures": script.get("checkpoint_failures", 0),
            "last_checkpoint_error": script.get("last_checkpoint_error"),
            "replay_damage": script.get("replay_damage", []),
        }
        tmp = run / "hb.tmp"
        tmp.write_text(json.dumps(hb))
        os.replace(tmp, run / HEARTBEAT_FILE)
        # Atomic like the heartbeat: a SIGKILL between truncate and write left an empty file
        # once in CI, and every restart then died on int("").
        tmp = run / "progress.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, progress)
        if crash_now:
            return fail(run, 1, "crash", "RuntimeError: envpool failed to build the envs")
        if step >= cfg.total_steps:
            return 0
        if stop:
            time.sleep(float(script.get("stop_delay_s", 0)))
            return 75
        time.sleep(0.05)


def fail(run: Path, code: int, kind: str, message: str | None) -> int:
    (run / ERROR_FILE).write_text(
        json.dumps({"kind": kind, "message": message or "", "pid": os.getpid()})
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
