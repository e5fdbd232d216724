"""What exists from the supervisor's `start()` on, made there in one piece: the participants
among it, in the order they tick (and close in reverse)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.config import Config
from supervisor.launch.launcher import LauncherSeam
from supervisor.ledger.journal import Journal
from supervisor.ledger.recorder import Recorder
from supervisor.participants.hooks import HookAlerts
from supervisor.participants.metrics import MetricsExport
from supervisor.participants.mirror import MirrorUploads
from supervisor.participants.spare import SpareTending
from supervisor.participants.tick import Participant
from supervisor.participants.time_ledger import TimeLedger
from supervisor.participants.tracking import TrackingBridgeParticipant
from supervisor.preemption.participant import PreemptionWatch
from supervisor.stability import modes
from supervisor.sweep.keeper import SweepError, SweepKeeper


class StartFailed(RuntimeError):
    """The supervisor could not start (its state database, or a sweep's study, unusable)."""


@dataclass
class Started:
    """The state database, its journal and recorder, the modes last read and the
    participants, in their order (and those the daemon also calls by name)."""

    conn: sqlite3.Connection
    journal: Journal
    recorder: Recorder
    mode_view: modes.ModeView
    participants: list[Participant]
    spare: SpareTending
    hooks: HookAlerts
    uploads: MirrorUploads
    preemption: PreemptionWatch
    sweeps: SweepKeeper

    @classmethod
    def make(
        cls,
        cfg: Config,
        conn: sqlite3.Connection,
        journal: Journal,
        recorder: Recorder,
        hooks: HookAlerts,  # made first: the boot's own events have their alerts
        mode_view: modes.ModeView,
        *,
        launcher: LauncherSeam,
        boot_id: str,
        wall: Callable[[], float],
        steady: Callable[[], float],
    ) -> Started:
        pre = PreemptionWatch(cfg, conn, boot_id, wall)
        spare = SpareTending(cfg, recorder, launcher, conn)
        # On several hosts each host mirrors its own games: events from mirror.json only.
        uploads = MirrorUploads(cfg, local=launcher.local)
        parts: list[Participant] = [
            pre, spare, uploads, hooks, MetricsExport(cfg), TimeLedger(cfg, steady),
            TrackingBridgeParticipant(cfg),
        ]  # fmt: skip
        sweeps = SweepKeeper(cfg, conn)
        try:
            sweeps.start()
        except SweepError as exc:  # a corrupt study, or another sweep's: named, never replaced
            raise StartFailed(str(exc)) from None
        return cls(conn, journal, recorder, mode_view, parts, spare, hooks, uploads, pre, sweeps)
