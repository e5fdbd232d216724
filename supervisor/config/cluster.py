"""[cluster] and [spare]: where workers run and the pre-warmed worker (the launch wing's
sections)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from supervisor.config.fields import NUMBER, ConfigSource, Field, non_negative, positive, read_table


@dataclass(frozen=True)
class ClusterConfig:
    """[cluster]: where workers run. "local" (this host) or "ray" (the hosts of a Ray
    cluster that ran `rlsup join`; needs [mirror]: a game that moves resumes from it)."""

    backend: str = "local"
    address: str = "auto"  # the Ray head (host:port); "auto": the cluster this host joined
    namespace: str = "rlsup"  # Ray namespace of the workers' actors (one per supervisor)
    cpus_per_game: float = 1.0  # Ray resources each game's actor holds on its host
    gpus_per_game: float = 0.0  # a fraction shares a GPU between games
    games_per_host: int = 0  # most games on one host; 0 = as many as its CPUs allow
    host_lost_after_s: float = 30.0  # a worker's host unreachable this long is lost

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SpareConfig:
    """[spare]: a pre-warmed worker process per host, handed the next start (on several
    hosts: one per joined host, inside an actor of its own)."""

    enabled: bool | str = "auto"  # true | false | "auto" (the stability policy decides)
    min_ram_available_pct: float = 20.0  # auto: no spare below this, its own RSS counted

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CLUSTER_FIELDS: dict[str, Field] = {
    "backend": ((str,), "local", lambda v: v in ("local", "ray"), '"local" or "ray"'),
    "address": (
        (str,),
        "auto",
        lambda v: (
            v == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9.\[\]:-]+:[0-9]+", v) is not None
        ),
        '"auto" or the Ray head\'s host:port',
    ),
    "namespace": (
        (str,),
        "rlsup",
        lambda v: re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", v) is not None,
        "a Ray namespace (letters, digits, _ . -)",
    ),
    "cpus_per_game": (NUMBER, 1.0, non_negative, "CPUs >= 0"),
    "gpus_per_game": (NUMBER, 0.0, non_negative, "GPUs >= 0 (a fraction shares one)"),
    "games_per_host": ((int,), 0, non_negative, "an integer >= 0 (0: by CPUs)"),
    "host_lost_after_s": (NUMBER, 30.0, positive, "seconds > 0"),
}
SPARE_FIELDS: dict[str, Field] = {
    "enabled": (
        (bool, str),
        "auto",
        lambda v: isinstance(v, bool) or v == "auto",
        'true, false or "auto"',
    ),
    "min_ram_available_pct": (NUMBER, 20.0, lambda v: 0 <= v < 100, "a percentage in 0..100"),
}


def parse_cluster(ctx: ConfigSource, data: Any) -> ClusterConfig:
    return ClusterConfig(**read_table(ctx, ["cluster"], data, CLUSTER_FIELDS))


def parse_spare(ctx: ConfigSource, data: Any) -> SpareConfig:
    return SpareConfig(**read_table(ctx, ["spare"], data, SPARE_FIELDS))
