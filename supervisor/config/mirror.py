"""[mirror]: committed checkpoints copied to S3-compatible object storage (the mirror wing's
section). What only the service checks (the S3 client's own rules, a reload that would move
the mirror) is in service_checks.py."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from supervisor.config.fields import NUMBER, ConfigSource, Field, non_negative, positive, read_table


@dataclass(frozen=True)
class MirrorConfig:
    """[mirror]: committed checkpoints copied to S3-compatible object storage."""

    url: str  # s3://bucket[/prefix]
    endpoint_url: str = ""  # an S3-compatible server; "" = AWS (or AWS_ENDPOINT_URL)
    region: str = ""  # "" = the AWS chain's
    every_s: float = 0.0  # 0 = each committed checkpoint ("each"), else at most one per N s
    bandwidth_mb_s: float = 0.0  # 0 = unlimited
    keep: int = 3  # newest manifests kept per game in the bucket
    concurrency: int = 4  # parallel part uploads (memory ≈ concurrency x chunk_mb)
    chunk_mb: float = 8.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Where the mirror is (the rest of the table is tuning): a reload never moves it
# (service_checks.mirror_reload_refusal), and the fence client on several hosts is built from it.
MIRROR_LOCATION_KEYS = ("url", "endpoint_url", "region")


def _mirror_url_ok(v: Any) -> bool:
    from checkpoints.remote import RemoteLocation  # no boto3: parsing only

    try:
        RemoteLocation.parse(v)
    except ValueError:
        return False
    return True


MIRROR_FIELDS: dict[str, Field] = {
    "url": ((str,), None, _mirror_url_ok, "s3://bucket[/prefix]"),
    "endpoint_url": (
        (str,),
        "",
        lambda v: v == "" or re.fullmatch(r"https?://\S+", v) is not None,
        "an http(s):// URL of an S3-compatible server",
    ),
    "region": ((str,), "", None, "an AWS region name"),
    "every": (
        (str,),
        "each",
        lambda v: v == "each" or re.fullmatch(r"[0-9]+(\.[0-9]+)?s", v) is not None,
        '"each" or seconds such as "600s"',
    ),
    "bandwidth_mb_s": (NUMBER, 0.0, non_negative, "MB/s >= 0 (0: unlimited)"),
    "keep": ((int,), 3, positive, "a positive integer"),
    "concurrency": ((int,), 4, lambda v: 1 <= v <= 64, "an integer in 1..64"),
    "chunk_mb": (NUMBER, 8.0, lambda v: 5 <= v <= 512, "MB in 5..512 (S3's part sizes)"),
}


def parse_mirror(ctx: ConfigSource, data: Any) -> MirrorConfig:
    v = read_table(ctx, ["mirror"], data, MIRROR_FIELDS)
    every = v.pop("every")
    return MirrorConfig(every_s=0.0 if every == "each" else float(every[:-1]), **v)
