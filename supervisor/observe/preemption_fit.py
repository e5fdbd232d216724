"""Will a preemption's checkpoint fit in the provider's warning? Each game's slowest recent
checkpoint (the `seconds` of the `checkpoint` lines in its worker log's last 256 KiB: a
replay buffer's full rewrite counts, not only the cheap incremental one that happened last)
plus, unless `[preemption] flush = "local"`, its newest upload time (mirror.json), against the
grace window (aws 120 s, gcp and azure 30 s). `rlsup status` (its `preemption_fit` in --json)
and `rlsup doctor` print the warnings."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from supervisor.config import PREEMPTION_GRACE_S, Config
from training.run_files import finite_number

LOG_TAIL_BYTES = 256 * 1024


def slowest_checkpoint_s(log: Path) -> float | None:
    """The largest `seconds` of the `checkpoint` lines in the tail of a worker's JSON log."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    slowest: float | None = None
    for line in tail:
        if '"checkpoint"' not in line:
            continue
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            entry = json.loads(line)
            # A worker's log is another process's file: only a finite duration counts.
            seconds = finite_number(entry.get("seconds"), 0.0)
            if entry.get("event") == "checkpoint" and seconds is not None:
                slowest = seconds if slowest is None else max(slowest, seconds)
    return slowest


def fit_warnings(cfg: Config, provider: str | None = None) -> list[str]:
    """One warning for the slowest game whose checkpoint (+ upload) outlasts the grace of
    `provider` (default: the configured one; none for "auto" or "none": unknown)."""
    provider = provider or cfg.preemption.provider
    grace = PREEMPTION_GRACE_S.get(provider)
    if grace is None:
        return []
    mirror = None
    if cfg.mirror is not None:  # the mirror's state only where one is configured
        from supervisor.mirror.state import MirrorState

        mirror = MirrorState.read(cfg.state_dir)
    upload = cfg.preemption.flush == "upload"
    worst: tuple[float, str, float, float | None] | None = None
    for g in cfg.games:
        ckpt = slowest_checkpoint_s(cfg.logs_dir / f"{g.name}.log")
        if ckpt is None:
            continue
        gm = mirror.games.get(g.name) if mirror is not None else None
        up = gm.seconds if upload and gm is not None and gm.seconds else None
        total = ckpt + (up or 0.0)
        if worst is None or total > worst[0]:
            worst = (total, g.name, ckpt, up)
    if worst is None or worst[0] <= grace:
        return []
    total, name, ckpt, up = worst
    parts = f"checkpoint {ckpt:.0f} s" + (f" + upload {up:.0f} s" if up is not None else "")
    return [
        f"preemption: game {name}'s {parts} = {total:.0f} s exceeds {provider}'s "
        f"{grace:.0f} s warning: checkpoint more often (checkpoint_every_s), smaller replay "
        'chunks, or [preemption] flush = "local" (do not wait for the upload)'
    ]
