"""rlsup's SDK: what a training script of your own needs to get rlsup's guarantees.

    import rlsup

    run = rlsup.attach()                       # under `rlsup run`, or standalone in a directory
    start = 0
    if (ckpt := run.latest()) is not None:     # the newest checkpoint that verifies, or None
        state = load_my_state(ckpt / "state.pt")
        buffer = run.load_arrays("replay")     # a large numpy array, read back chunk by chunk
        start = state["step"]
    for step in range(start, total):
        ...                                    # your loop
        run.heartbeat(step, mean_return=r)     # hang detection, status, plot, metrics
        stop = run.should_stop()               # read once: SIGTERM may land any time
        if stop or run.should_checkpoint(step):  # a stop, the interval, a request
            with run.checkpoint(step) as d:    # committed atomically when the block exits
                save_my_state(d / "state.pt")
                run.save_arrays("replay", buffer)   # only changed chunks are written
        if stop:                               # SIGTERM: a stop, a reboot, a preemption
            run.exit_stopped()                 # exit 75 (after the final checkpoint above)

Needs only the standard library (numpy for the array functions): a script's own interpreter
runs it, behind any wrapper (`sh -c`, `uv run`, `torchrun`). The contract, level by level, is
docs/own-trainer.md; `rlsup.sb3` adapts Stable-Baselines3.
"""

from __future__ import annotations

from rlsup._run import (
    ArrayDamaged,
    CheckpointFailed,
    NoValidCheckpoint,
    Run,
    RunDirLocked,
    SdkError,
    attach,
)
from training.protocol import ExitCode

__all__ = [
    "ArrayDamaged",
    "CheckpointFailed",
    "ExitCode",
    "NoValidCheckpoint",
    "Run",
    "RunDirLocked",
    "SdkError",
    "attach",
]
