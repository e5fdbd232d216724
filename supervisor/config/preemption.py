"""[preemption]: the cloud's preemption notice and what the supervisor does on one (the
preemption watcher's section)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from supervisor.config.fields import NUMBER, ConfigSource, Field, non_negative, read_table

# Each provider's metadata service and the warning it gives before it takes a spot machine
# (AWS: the spot instance-action, 2 min; GCE: `preempted`, then an ACPI soft off ~30 s later;
# Azure: a `Preempt` scheduled event, >= 30 s). All three answer on the link-local address
# (GCE also as metadata.google.internal; the address needs no DNS).
PREEMPTION_PROVIDERS = ("aws", "gcp", "azure")
PREEMPTION_GRACE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
METADATA_ENDPOINT = "http://169.254.169.254"


@dataclass(frozen=True)
class PreemptionConfig:
    """[preemption]: watch the cloud's metadata service for a preemption notice; on one, every
    game checkpoints now, nothing new starts, and the machine's loss is no crash."""

    provider: str = "auto"  # "auto" | "aws" | "gcp" | "azure" | "none"
    poll_s: float = 5.0  # AWS recommends every 5 s
    endpoint: str = METADATA_ENDPOINT  # the metadata service's base URL
    timeout_s: float = 1.0  # per request: a hung metadata service costs the watcher this
    max_preemptions: int = 10  # per 24 h: beyond, deaths under a notice count as crashes
    flush: str = "upload"  # "upload": the mirror takes preemption checkpoints first; "local"
    # Seconds before the deadline that every game is asked for one last checkpoint (the work
    # since the notice's checkpoint is kept too); 0 = the notice's checkpoint is the last.
    final_checkpoint_s: float = 15.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PREEMPTION_FIELDS: dict[str, Field] = {
    "provider": (
        (str,),
        "auto",
        lambda v: v in ("auto", "none", *PREEMPTION_PROVIDERS),
        '"auto", "aws", "gcp", "azure" or "none"',
    ),
    "poll_s": (NUMBER, 5.0, lambda v: 0.05 <= v <= 600, "seconds in 0.05..600"),
    "endpoint": (
        (str,),
        METADATA_ENDPOINT,
        lambda v: re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", v) is not None,
        'an http(s) base URL, e.g. "http://169.254.169.254"',
    ),
    "timeout_s": (NUMBER, 1.0, lambda v: 0 < v <= 30, "seconds in (0, 30]"),
    "max_preemptions": ((int,), 10, non_negative, "an integer >= 0 (per 24 hours)"),
    "flush": ((str,), "upload", lambda v: v in ("upload", "local"), '"upload" or "local"'),
    "final_checkpoint_s": (NUMBER, 15.0, lambda v: 0 <= v <= 3600, "seconds in 0..3600 (0: off)"),
}


def parse_preemption(ctx: ConfigSource, data: Any) -> PreemptionConfig:
    v = read_table(ctx, ["preemption"], data, PREEMPTION_FIELDS)
    return PreemptionConfig(**{**v, "endpoint": v["endpoint"].rstrip("/")})
