"""The tick's participants: the parts beside the games' lives that start with the supervisor,
act once a tick on one frozen view of it (`tick.TickView`), return the events they have to tell
for the daemon to record, follow a configuration reload and close at its exit. One module each:
the alert hooks (`hooks`), the metrics export (`metrics`), the mirror's uploader (`mirror`),
this host's spare worker (`spare`), the time and money ledger (`time_ledger`) and the tracking
bridge (`tracking`); the
preemption watch is its wing's (`supervisor.preemption.participant`). Their order is set in
one place (`started.Started.make`); the daemon starts and ticks them in it, and closes them in
reverse.
"""

from supervisor.participants.hooks import HookAlerts
from supervisor.participants.metrics import MetricsExport
from supervisor.participants.mirror import MirrorUploads
from supervisor.participants.spare import SpareTending
from supervisor.participants.started import Started, StartFailed
from supervisor.participants.tick import Event, Participant, TickView
from supervisor.participants.time_ledger import TimeLedger
from supervisor.participants.tracking import TrackingBridgeParticipant

__all__ = [
    "Event",
    "HookAlerts",
    "MetricsExport",
    "MirrorUploads",
    "Participant",
    "SpareTending",
    "StartFailed",
    "Started",
    "TickView",
    "TimeLedger",
    "TrackingBridgeParticipant",
]
