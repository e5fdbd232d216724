"""The preemption notice and the one place that answers "does a notice stand?".

Three readers ask it, each from where it stands:
- the tick: `Hold`, one value a tick (the lifecycle holds starts and excuses deaths by it, a
  new worker gets the deadline in its environment, the spare is not warmed);
- the uploader, another process: `asks_to_checkpoint`, the request a notice left in a run dir;
- the next boot: `previous_boot_notice`, the notice the ledger holds for the boot that ended.
The notice itself is `Notice`; its deadline is believed only as far as the provider's longest
notice (`MAX_NOTICE_S`) from when it was first seen: a `time` in 2099 must not hold every
start and excuse every crash until then.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

from checkpoints.atomic import write_json_atomic
from supervisor.config import PREEMPTION_GRACE_S
from supervisor.ledger import db
from supervisor.ledger.db import BootOutcome
from training import protocol

log = structlog.get_logger("rlsup.preemption")

# The longest notice each provider documents (AWS spot: 2 min; GCE: ~30 s before the ACPI soft
# off; Azure Spot eviction: a `Preempt` event's NotBefore, ~30 s): a deadline is clamped to this
# much after the notice's first sighting.
MAX_NOTICE_S = PREEMPTION_GRACE_S


@dataclass(frozen=True)
class Notice:
    """One preemption notice: who, what, and when the machine goes (Unix seconds)."""

    provider: str
    action: str  # "terminate" | "stop" | "hibernate" (AWS); "terminate" (GCE); "preempt"
    deadline: float  # `posted`, never more than the provider's longest notice after notice_at
    notice_at: float  # when this watcher first saw it
    posted: float  # the deadline as the provider posted it (GCE: none, its first sighting's)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_notice(provider: str, action: str, posted: float, now: float) -> Notice:
    """A notice first seen `now`, its deadline clamped to the provider's longest notice."""
    deadline = min(posted, now + MAX_NOTICE_S[provider])
    if deadline < posted:
        log.warning(
            "preemption_deadline_clamped", provider=provider, posted=posted, deadline=deadline,
            reason=f"{provider} gives at most {MAX_NOTICE_S[provider]:g} s of notice",
        )  # fmt: skip
    return Notice(provider, action, deadline, now, posted)


# ---- the tick's hold -------------------------------------------------------------------------


@dataclass(frozen=True)
class Hold:
    """What a standing notice means for one tick: `holding` (the machine goes soon: a start
    now is work lost at the deadline; no spare is warmed) and `excuses_deaths` (a worker that
    dies now died of the machine's end, not of its game, as long as the day's notices stay
    within `max_preemptions`: `counted`)."""

    notice: Notice | None = None
    counted: bool = False

    @property
    def holding(self) -> bool:
        return self.notice is not None

    @property
    def excuses_deaths(self) -> bool:
        return self.notice is not None and self.counted

    def worker_env(self, env: dict[str, str] | None) -> dict[str, str] | None:
        """A new worker's environment, with the deadline while a notice stands."""
        if self.notice is None:
            return env
        return {**(env or {}), protocol.PREEMPTION_DEADLINE_ENV: f"{self.notice.deadline:.3f}"}


NO_HOLD = Hold()


# ---- the request a notice leaves in each run dir ---------------------------------------------

# A request this long past its deadline is history: the uploader no longer hurries for it.
REQUEST_URGENT_AFTER_DEADLINE_S = 600.0


def write_checkpoint_request(run_dir: Path, notice: Notice, *, final: bool = False) -> bool:
    """`<run_dir>/checkpoint.request` replaced atomically by the notice's JSON (a fresh
    mtime: a new request, for readers that look only at that); False when the game has no
    run dir yet. `final`: the last one before the deadline (`"final": true`)."""
    if not run_dir.is_dir():
        return False
    body: dict[str, Any] = {
        "reason": protocol.PREEMPTION_REASON,
        "deadline": notice.deadline,
        "provider": notice.provider,
    }
    if final:
        body["final"] = True
    write_json_atomic(run_dir / protocol.CHECKPOINT_REQUEST_FILE, body, durable=False)
    return True


def asks_to_checkpoint(run_dir: Path, now: float | None = None) -> bool:
    """The run dir holds a preemption's checkpoint request whose deadline is not long past
    (the uploader mirrors that game first). `now`: Unix seconds (default: the wall clock)."""
    try:
        path = run_dir / protocol.CHECKPOINT_REQUEST_FILE
        data = json.loads(protocol.read_regular_file(path))
        deadline = float(data["deadline"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    now = time.time() if now is None else now
    return bool(
        data.get("reason") == protocol.PREEMPTION_REASON
        and now < deadline + REQUEST_URGENT_AFTER_DEADLINE_S
    )


# ---- the next boot -----------------------------------------------------------------------------

# How far past a notice's deadline the boot's last sign of life may lie and the notice still
# explain its end: the last tick's write before the loss, a provider a little late.
PREEMPTED_MARGIN_S = 60.0


def ended_near_deadline(notice: dict[str, Any], last_seen: float) -> bool:
    """The boot's last sign of life came near the notice's deadline: no earlier than the
    provider's longest notice (plus the margin) before it, no later than the margin after.
    A boot that ran on long past the deadline, or died long before it (a `time` in 2099, as
    an older supervisor recorded it unclamped), ended for another reason."""
    deadline = notice.get("deadline")
    if not isinstance(deadline, int | float) or not math.isfinite(deadline):
        return False
    longest = PREEMPTION_GRACE_S.get(str(notice.get("provider")), max(PREEMPTION_GRACE_S.values()))
    return deadline - longest - PREEMPTED_MARGIN_S <= last_seen <= deadline + PREEMPTED_MARGIN_S


def previous_boot_notice(
    conn: sqlite3.Connection, outcome: BootOutcome, now: float
) -> dict[str, Any] | None:
    """The previous boot's standing preemption notice when this start follows that boot's
    end (its detail, with `notice_ts`), else None: no notice, one that lapsed (a later
    `preemption_cleared`), or one whose deadline was not near when the boot ended."""
    prev = outcome.previous_boot_id
    if outcome.same_boot or prev is None:
        return None
    notice = db.boot_event(conn, "preemption_notice", prev)
    if notice is None:
        return None
    cleared = db.boot_event(conn, "preemption_cleared", prev)
    if cleared is not None and cleared.id > notice.id:
        return None
    if not ended_near_deadline(notice.detail, now - (outcome.downtime_s or 0.0)):
        return None
    return {**notice.detail, "notice_ts": notice.ts}
