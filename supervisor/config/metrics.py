"""[metrics]: operator metrics in Prometheus' text format (the observe wing's exporter)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config.fields import NUMBER, ConfigSource, Field, read_table

DEFAULT_METRICS_PORT = 9469


@dataclass(frozen=True)
class MetricsConfig:
    """[metrics]: operator metrics in Prometheus' text format (names prefixed `rlsup_`)."""

    textfile: Path | None = None  # node_exporter's textfile collector; rewritten atomically
    listen_host: str = ""  # "" = no HTTP endpoint (no listener unless asked for)
    listen_port: int = 0
    interval_s: float = 5.0  # how often the supervisor recomputes them (a background thread)

    @property
    def enabled(self) -> bool:
        return self.textfile is not None or bool(self.listen_host)


def _listen_address(v: str) -> tuple[str, int] | None:
    """("127.0.0.1", 9469) from "127.0.0.1:9469", "[::1]:9469" or ":9469"; None if malformed."""
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]*):([0-9]{1,5})", v)
    if m is None or not 0 < int(m.group(2)) < 65536:
        return None
    return (m.group(1).strip("[]") or "127.0.0.1", int(m.group(2)))


METRICS_FIELDS: dict[str, Field] = {
    "textfile": (
        (str,),
        "",
        lambda v: v == "" or v.endswith(".prom"),
        "a path ending in .prom (node_exporter's textfile collector reads *.prom)",
    ),
    "listen": (
        (str, int),
        "",
        lambda v: (
            (isinstance(v, int) and 0 < v < 65536)
            or (isinstance(v, str) and (v == "" or _listen_address(v) is not None))
        ),
        'a port (bound to 127.0.0.1) or "HOST:PORT", e.g. "127.0.0.1:9469"',
    ),
    "interval_s": (NUMBER, 5.0, lambda v: 0.2 <= v <= 3600, "seconds in 0.2..3600"),
}


def parse_metrics(ctx: ConfigSource, data: Any, path: Path) -> MetricsConfig:
    """The table; a relative textfile is relative to the configuration file at `path`."""
    v = read_table(ctx, ["metrics"], data, METRICS_FIELDS)
    textfile: Path | None = None
    if v["textfile"]:
        textfile = Path(os.path.expanduser(v["textfile"]))
        textfile = textfile if textfile.is_absolute() else path.parent / textfile
    host, port = "", 0
    if isinstance(v["listen"], int):
        host, port = "127.0.0.1", v["listen"]
    elif v["listen"]:
        host, port = _listen_address(v["listen"]) or ("", 0)
    return MetricsConfig(textfile, host, port, v["interval_s"])
