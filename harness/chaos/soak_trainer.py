"""The soak's command game: a training script of a user's own, run by `rlsup run` as
`[[games]] command = [python, soak_trainer.py, --name, NAME]`, on the SDK (`import rlsup`).

It learns nothing, cheaply (sleep-dominated: four games share two cores), but keeps what a real
trainer keeps, so that every fault the soak injects is judged on it too: a state file
(`learner.pt`, the name the corruption faults damage), a replay-like array that grows each
iteration and is saved incrementally (`run.save_arrays`), and an RNG. On resume it checks that
the array is exactly what its step says it must be: a checkpoint that lost or mixed data makes
it exit with a crash naming the mismatch, which the soak would see as a game that never
finishes. Honours the mode's `num_envs` (it lists the knob in its config).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import numpy as np

import rlsup

STEPS_PER_ENV = 16  # agent steps per env per iteration (the soak's redone-work bound)
ROW = 256  # bytes of "replay" per iteration


def rows(first: int, last: int) -> np.ndarray:
    """Rows first..last-1 of the replay: row i holds i's signature, so any lost, stale or
    foreign row shows."""
    i = np.arange(first, last, dtype=np.uint64)[:, None]
    return ((i * 2654435761 + np.arange(ROW, dtype=np.uint64)) % 251).astype(np.uint8)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    run = rlsup.attach(algo="soak-command")
    envs = int(run.knobs.get("num_envs", 4))
    step, iterations = 0, 0
    capacity = max(1, run.total_steps // (STEPS_PER_ENV * 2) + 64)  # rows, never full
    replay = np.zeros((capacity, ROW), dtype=np.uint8)
    if (ckpt := run.latest()) is not None:
        state = json.loads((ckpt / "learner.pt").read_text())
        step, iterations = int(state["step"]), int(state["iterations"])
        saved = run.load_arrays("replay")
        want = rows(0, iterations)
        if saved.shape != (iterations, ROW) or not np.array_equal(saved, want):
            print(
                f"{args.name}: replay of {ckpt.name} does not match its step {step} "
                f"({saved.shape} rows)",
                file=sys.stderr,
            )
            return 1
        replay[:iterations] = saved
    while step < run.total_steps:
        time.sleep(0.1)  # an iteration's work
        replay[iterations] = rows(iterations, iterations + 1)[0]
        iterations += 1
        step += STEPS_PER_ENV * envs
        run.heartbeat(step, episodes=iterations, mean_return=float(iterations % 100))
        stop = run.should_stop()  # read once: a SIGTERM may land between two questions
        if stop or run.should_checkpoint(step) or step >= run.total_steps:
            try:
                with run.checkpoint(step) as d:
                    state = {"step": step, "iterations": iterations, "pad": "x" * 4096}
                    (d / "learner.pt").write_text(json.dumps(state))
                    run.save_arrays("replay", replay[:iterations], chunk_bytes=16 << 10)
            except rlsup.CheckpointFailed as exc:  # a full disk: train on, retried later
                with contextlib.suppress(OSError):  # its log is on that disk too
                    print(f"{args.name}: {exc}", file=sys.stderr, flush=True)
        if stop:
            run.exit_stopped()
    return 0


if __name__ == "__main__":
    sys.exit(main())
