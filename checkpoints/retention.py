"""Which committed checkpoints retention keeps, and the operator's pins.

One policy for the local store (CheckpointStore.apply_retention) and the mirror's garbage
collection (checkpoints/mirror.py): keep the union of

  * the newest `keep`;
  * the `keep_best` whose periodic evaluation scored highest (the manifest's `meta.eval.mean`:
    the evaluation of the policy at that very step, so it survives resumes and mirroring);
  * milestones: the first checkpoint at or past each multiple of `keep_every_steps`;
  * the pinned steps (`rlsup pin GAME STEP`: `pins.json` beside the checkpoints).

The store adds the rot rule on top (nothing is deleted unless a kept checkpoint newer than
everything deleted verifies in full), so the newest valid checkpoint is always kept.

Stdlib only: the CLI (`rlsup pin`) imports this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PINS_FILE = "pins.json"  # in the checkpoint root, beside the ckpt-* directories
EVAL_META = "eval"  # the manifest meta key of a checkpoint's evaluation


@dataclass(frozen=True)
class RetentionPolicy:
    keep: int = 3
    keep_best: int = 0
    keep_every_steps: int | None = None  # None or 0: no milestones

    def __post_init__(self) -> None:
        if type(self.keep) is not int or self.keep < 1:
            raise ValueError(f"keep must be an integer >= 1, got {self.keep!r}")
        if type(self.keep_best) is not int or self.keep_best < 0:
            raise ValueError(f"keep_best must be an integer >= 0, got {self.keep_best!r}")
        every = self.keep_every_steps
        if every is not None and (type(every) is not int or every < 0):
            raise ValueError(f"keep_every_steps must be an integer >= 0, got {every!r}")

    def select(
        self,
        steps: Iterable[int],
        scores: Mapping[int, float] | None = None,
        pinned: Iterable[int] = (),
    ) -> dict[int, list[str]]:
        """The steps to keep, each with why ("newest", "best", "milestone", "pinned").

        `scores`: step -> evaluation mean, for the steps that have one (the others are never
        "best"). Ties go to the newer checkpoint. Pins of steps not in `steps` are ignored.
        """
        ordered = sorted(set(steps))
        why: dict[int, list[str]] = {}

        def add(step: int, reason: str) -> None:
            why.setdefault(step, []).append(reason)

        for step in ordered[-self.keep :]:
            add(step, "newest")
        if self.keep_best and scores:
            present = set(ordered)
            rated = [(s, float(v)) for s, v in scores.items() if s in present]
            rated = [(s, v) for s, v in rated if math.isfinite(v)]
            rated.sort(key=lambda sv: (sv[1], sv[0]), reverse=True)
            for step, _ in rated[: self.keep_best]:
                add(step, "best")
        for step in milestones(ordered, self.keep_every_steps):
            add(step, "milestone")
        present = set(ordered)
        for step in sorted(set(pinned)):
            if step in present:
                add(step, "pinned")
        return dict(sorted(why.items()))


def milestones(steps: Iterable[int], every: int | None) -> list[int]:
    """The first step at or past each positive multiple of `every` (none when it is 0/None)."""
    if not every:
        return []
    out: list[int] = []
    for step in sorted(set(steps)):
        # `step` is the first at or past multiple k when the previous one (if any) is below it.
        if step >= every and (not out or step // every > out[-1] // every):
            out.append(step)
    return out


def eval_score(meta: Any) -> float | None:
    """The evaluation mean a manifest's `meta` records (None: none, or not a number)."""
    if not isinstance(meta, Mapping):
        return None
    ev = meta.get(EVAL_META)
    if not isinstance(ev, Mapping):
        return None
    mean = ev.get("mean")
    if isinstance(mean, bool) or not isinstance(mean, int | float) or not math.isfinite(mean):
        return None
    return float(mean)


# ---- pins ------------------------------------------------------------------------------------


class PinsUnreadable(Exception):
    """pins.json exists but cannot be read or parsed: retention must not guess."""


def read_pins(root: Path) -> set[int]:
    """The pinned steps of the checkpoint store at `root` (empty when there is no pins.json).
    Raises PinsUnreadable when the file exists but is not readable or not a pins file."""
    path = Path(root) / PINS_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise PinsUnreadable(f"{path}: {exc}") from exc
    try:
        data = json.loads(raw)
        steps = data["steps"]
        if not isinstance(steps, list) or not all(type(s) is int and s >= 0 for s in steps):
            raise ValueError("'steps' is not a list of step numbers")
    except (ValueError, KeyError, TypeError) as exc:
        raise PinsUnreadable(f"{path}: not a pins file: {exc}") from exc
    return set(steps)


def write_pins(root: Path, steps: Iterable[int]) -> None:
    """Replace pins.json atomically and durably (owner and group only, like all state)."""
    from checkpoints.atomic import write_json_atomic

    write_json_atomic(Path(root) / PINS_FILE, {"steps": sorted(set(steps))})


@contextlib.contextmanager
def pins_locked(root: Path) -> Iterator[None]:
    """Exclusive flock on the checkpoint root directory: `rlsup pin` holds it while it checks
    the step exists and writes pins.json, retention while it reads the pins and deletes, so a
    pin never lands on a checkpoint that retention is deleting on a stale list."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
