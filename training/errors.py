"""The ways a training session fails that the worker reports by name: each exception's `kind`
is the `kind` of error.json (and the exit code follows from it: training/entry.py). Torch-free;
shared by the session, its resuming and the mirror (training/session.py, training/resuming.py,
training/mirroring.py).
"""

from __future__ import annotations

from training.args import ConfigError


class NoValidCheckpointError(ConfigError):
    """Checkpoints exist but none verifies: refusing to start from zero."""

    kind = "no_valid_checkpoint"


class CheckpointMismatch(ConfigError):
    """The run dir's checkpoints were trained for another env id or algorithm."""

    kind = "checkpoint_mismatch"


class PlacementFencedError(RuntimeError):
    """Several hosts: this game was placed on another host since this worker started (the
    mirror's fence moved past its epoch). It committed nothing after that and exits 77."""

    kind = "fenced"


class CheckpointUnreadableError(RuntimeError):
    """The newest checkpoint could not be read (EIO, EACCES, ...): it is kept, not quarantined,
    and the supervisor retries after a backoff."""

    kind = "checkpoint_unreadable"


class FinalCheckpointFailed(RuntimeError):
    """The last checkpoint before an exit failed: work since the previous one is lost."""

    kind = "checkpoint_failed"


class EvalWriteFailed(RuntimeError):
    """total_steps reached and the final checkpoint committed, but eval.json could not be
    written: exit non-zero so that the supervisor retries (a restart only re-evaluates)."""

    kind = "eval_write_failed"
