"""Child process for the background-writer crash points: a real DQN learner (CartPole, a ring of
many small replay chunks) commits step A synchronously, trains on, then checkpoints step B with
`save_async` and keeps training while the writer thread writes; the writer SIGKILLs the whole
process at one named point of the commit protocol, once the loop has run an iteration during the
write (or, in "record" mode, lists the points it passes).

Usage: python bg_ckpt_child.py ROOT (record OUT.json | kill POINT)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import structlog
import torch

from checkpoints import CheckpointStore, _crashpoints
from training.args import WorkerConfig, validate
from training.checkpointing import Checkpointer, CheckpointResult
from training.registry import make_learner

CFG = dict(
    game="CartPole-v1", algo="dqn", num_envs=4, threads=1, eval_episodes=0, batch_size=32,
    buffer_size=3000, learning_starts=200, replay_chunk_kib=1, total_steps=10**9,
)  # fmt: skip


def config() -> WorkerConfig:
    return validate(WorkerConfig(**CFG))  # type: ignore[arg-type]


def main(argv: list[str]) -> None:
    root, mode, arg = Path(argv[1]), argv[2], argv[3]
    torch.set_num_threads(1)
    cfg = config()
    learner = make_learner(cfg, torch.device("cpu"), 1)
    results: list[CheckpointResult] = []
    ck = Checkpointer(CheckpointStore(root, keep=3), cfg, structlog.get_logger(), results.append)
    learner.iterate()
    assert ck.save_sync(learner, {"n": 1}).ok
    for _ in range(6):
        learner.iterate()
    passed: list[str] = []
    trained_during_write = threading.Event()

    def hook(point: str) -> None:
        if threading.current_thread().name != "checkpoint":
            return
        passed.append(point)
        if mode == "kill" and point == arg:
            trained_during_write.wait(60)  # training went on while this one was written
            os.kill(os.getpid(), signal.SIGKILL)

    _crashpoints.hook = hook
    assert ck.save_async(learner, {"n": 2})
    while ck.in_flight:
        learner.iterate()
        trained_during_write.set()
    ck.wait()
    assert results[-1].ok, results[-1].error
    if mode == "record":
        Path(arg).write_text(json.dumps({"points": passed, "steps": [r.step for r in results]}))
    else:
        sys.exit(f"crash point {arg!r} was never reached")


if __name__ == "__main__":
    main(sys.argv)
