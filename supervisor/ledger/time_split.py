"""A game's time split as `rlsup status` reads it: the categories its seconds fall in, and
the supervisor's snapshot of every split (accounting.json) carried on to now.

The fold that makes the splits is fold.py's (accounting.py runs it over the ledger); this is
what reads its result without it: a status line folds nothing while the snapshot is fresh, and
imports none of the fold. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Every second of a game's life falls in exactly one category (accounting.py says which).
CATEGORIES = ("training", "evaluation", "redone", "setup", "starting", "waiting", "backoff",
              "down", "paused")  # fmt: skip
DOWNTIME = ("starting", "waiting", "backoff", "down", "paused")
LOST = ("redone", "starting", "backoff", "down")
RUNNING_PARTS = ("training", "evaluation", "redone")


# ---- the supervisor's snapshot (accounting.json) ---------------------------------------------
#
# The supervisor folds the new events every SNAPSHOT_EVERY_S (and at its exit) and writes each
# game's split, with the fold's state, to <state_dir>/accounting.json (accounting.snapshot);
# `rlsup status` reads it here and carries each game's current part on to now, or folds the
# events after it (accounting.current_fold).

SNAPSHOT_FILE = "accounting.json"
SNAPSHOT_VERSION = 2  # 2: "paused" and the fold's state; an older file is folded anew, quietly
SNAPSHOT_EVERY_S = 30.0
SNAPSHOT_STALE_S = 4 * SNAPSHOT_EVERY_S  # older while the supervisor runs: fold the tail


# Told what of accounting.json could not be used: (key, value, what it should be).
OnBad = Callable[[str, Any, str], None]


def read_snapshot(state_dir: Path, on_bad: OnBad | None = None) -> dict[str, Any] | None:
    """accounting.json as this rlsup writes it, or None: no file, one written by an older rlsup
    (folded anew, quietly), or one that is not a JSON object with a `games` object (folded
    anew, and `on_bad` told). Its entries are the reader's to check where it uses them
    (status: `observe/status.py`); the fold's state is checked by `resume_fold`."""
    import json

    try:
        text = (state_dir / SNAPSHOT_FILE).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        if on_bad is not None:
            on_bad("(the file)", text[:40], "a JSON object")
        return None
    if data.get("version") != SNAPSHOT_VERSION:
        return None
    if not isinstance(data.get("games"), dict):
        if on_bad is not None:
            on_bad("games", data.get("games"), "an object")
        return None
    return data


def carry_part(part: str | None, running: bool) -> str | None:
    """The part a game's open part goes on in: itself while the supervisor runs; once it is
    not running, "paused" after a clean stop, else "down" (it died)."""
    if running or part is None or part == "paused":
        return part
    return "down"


def carried(entry: Mapping[str, Any], dt: float, part: str | None) -> dict[str, Any]:
    """A snapshot's game split carried `dt` seconds on in `part` (its open part; "down" or
    "paused" when the supervisor is not running; None: ended, nothing added)."""
    t = dict(entry["time"])
    if part is None or dt <= 0:
        return t
    key = "training" if part == "running" else part
    if f"{key}_s" not in t:
        return t
    t[f"{key}_s"] = round(t[f"{key}_s"] + dt, 3)
    t["wall_s"] = round(t["wall_s"] + dt, 3)
    if key in DOWNTIME:
        t["downtime_s"] = round(t["downtime_s"] + dt, 3)
    if key in LOST:
        t["lost_s"] = round(t["lost_s"] + dt, 3)
    if t.get("money") is not None:
        extra = float(entry.get("rate") or 0.0) * dt
        t["money"] = round(t["money"] + extra, 4)
        if key in LOST:
            t["money_lost"] = round(t["money_lost"] + extra, 4)
    return t
