"""Where a cold worker's boot goes, from the process's spawn to its first training step: PPO on
an Atari game resuming from its checkpoint, the stages the worker runs, timed in a fresh child.

    python benchmarks/boot_breakdown.py [--game Pong-v5] [--boots 3] [--dir DIR]

Stages (each timed in the child, from the parent's spawn on the system's monotonic clock):
interpreter up (before any import of ours), `import torch`, the rest of the worker's imports
(training.session: structlog, numpy, the checkpoint store), the learner built (envpool's envs
made, the network and its optimizer), the newest checkpoint read and verified (every file's
SHA-256) and restored into the learner, the first rollout step (an env step and the policy's
forward pass), and the first iteration done (what the worker's heartbeat marks `first_step`: a
whole rollout of num_envs x n_steps and its update). The baseline is `python -c pass` in the
same run. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostinfo import host_facts, host_line

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys, time, json
t0 = float(sys.argv[1]); mode = sys.argv[2]; root = sys.argv[3]; game = sys.argv[4]
marks = {"interpreter": time.monotonic() - t0}
import torch
marks["import torch"] = time.monotonic() - t0
import structlog
from pathlib import Path
from checkpoints import CheckpointStore
from training import session  # the worker's own import chain
from training.args import WorkerConfig, validate
from training.checkpointing import Checkpointer, restore_learner
from training.registry import make_learner
marks["other imports"] = time.monotonic() - t0
torch.set_num_threads(2)
cfg = validate(WorkerConfig(game=game, algo="ppo", total_steps=10**9, threads=2, eval_episodes=0))
cpu = torch.device("cpu")
learner = make_learner(cfg, cpu, 1)
learner.warmup_optimizer()
marks["envs + learner built"] = time.monotonic() - t0
store = CheckpointStore(Path(root), keep=2)
if mode == "make":
    learner.iterate()
    Checkpointer(store, cfg, structlog.get_logger(), lambda r: None).save_sync(learner, {"n": 1})
    learner.close()
    sys.exit(0)
loaded = store.load_latest()
restore_learner(loaded, learner, cpu)
marks["checkpoint read, verified, restored"] = time.monotonic() - t0
# The first rollout step, as PPO's rollout takes it (reset on the first iterate()).
obs, _ = learner.envs.reset()
with torch.inference_mode():
    learner.net(torch.as_tensor(obs))
learner.envs.step(torch.zeros(cfg.num_envs, dtype=torch.int64).numpy())
marks["first rollout step"] = time.monotonic() - t0
learner.restart_envs()
learner.iterate()
marks["first iteration done"] = time.monotonic() - t0
learner.close()
# The compiler: torch imports it lazily, and a worker that never compiles must not pay for it.
print("DYNAMO " + json.dumps("torch._dynamo" in sys.modules), flush=True)
print("MARKS " + json.dumps(marks), flush=True)
"""


def spawn(mode: str, root: Path, game: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, repr(t0), mode, str(root), game],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("MARKS "):
            marks: dict[str, float] = json.loads(line[6:])
            return marks
    return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--game", default="Pong-v5")
    ap.add_argument("--boots", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    print(host_line(), flush=True)
    root = Path(tempfile.mkdtemp(prefix="rlsup-boot-", dir=args.dir))
    try:
        spawn("make", root / "checkpoints", args.game)
        bare = []
        for _ in range(5):
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            bare.append(time.monotonic() - t0)
        boots = [spawn("boot", root / "checkpoints", args.game) for _ in range(args.boots)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    stages = list(boots[0])
    median = {k: statistics.median(b[k] for b in boots) for k in stages}
    print(f"{'stage (cumulative from spawn)':<40}{'median s':>10}{'stage s':>10}")
    prev = 0.0
    for k in stages:
        print(f"{k:<40}{median[k]:>10.2f}{median[k] - prev:>10.2f}")
        prev = median[k]
    print(f"{'baseline: python -c pass':<40}{statistics.median(bare):>10.3f}")
    print(json.dumps({"benchmark": "boot_breakdown", "host": host_facts(), "game": args.game,
                      "boots": boots, "median_s": median,
                      "python_pass_s": statistics.median(bare)}))  # fmt: skip


if __name__ == "__main__":
    main()
