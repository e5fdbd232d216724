"""[tracking]: what the supervisor's tracking bridge (supervisor/tracking/) sends each run's
progress and evaluations to, beside the run dir's own files.

    [tracking]
    tensorboard = true          # command games: event files in <run_dir>/tb/ (default true)
    mlflow = { tracking_uri = "sqlite:///...", experiment = "rlsup" }   # optional

`mlflow` needs the optional extra (`pip install rlsup[mlflow]`); the default tracking_uri is
an SQLite store under the state dir (`sqlite:///<state_dir>/mlflow.db`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config.fields import ConfigSource, Field, read_table

MLFLOW_DB = "mlflow.db"
# A tracking URI as MLflow takes one: a scheme (sqlite, http, https, postgresql+psycopg2,
# file, databricks...) then anything without whitespace.
_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S*")


@dataclass(frozen=True)
class MlflowConfig:
    tracking_uri: str  # resolved: the default is filled in
    experiment: str = "rlsup"


@dataclass(frozen=True)
class TrackingConfig:
    tensorboard: bool = True
    mlflow: MlflowConfig | None = None

    @property
    def enabled(self) -> bool:
        return self.tensorboard or self.mlflow is not None


TRACKING_FIELDS: dict[str, Field] = {
    "tensorboard": ((bool,), True, None, "true or false"),
    "mlflow": ((dict,), {}, None, 'a table such as { tracking_uri = "sqlite:///mlflow.db" }'),
}
MLFLOW_FIELDS: dict[str, Field] = {
    "tracking_uri": (
        (str,),
        "",
        lambda v: v == "" or _URI_RE.fullmatch(v) is not None,
        'a tracking URI such as "sqlite:////path/mlflow.db" or "http://host:5000" '
        '("" or left out: sqlite:///<state_dir>/mlflow.db)',
    ),
    "experiment": (
        (str,),
        "rlsup",
        lambda v: 0 < len(v) <= 500 and v.strip() == v,
        "an experiment name (1..500 characters, no leading or trailing space)",
    ),
}


def parse_tracking(ctx: ConfigSource, data: Any, state_dir: Path) -> TrackingConfig:
    v = read_table(ctx, ["tracking"], data, TRACKING_FIELDS)
    mlflow: MlflowConfig | None = None
    if isinstance(data, dict) and "mlflow" in data:
        m = read_table(ctx, ["tracking", "mlflow"], data["mlflow"], MLFLOW_FIELDS)
        uri = m["tracking_uri"] or f"sqlite:///{state_dir / MLFLOW_DB}"
        if uri.startswith("sqlite:") and not uri.startswith("sqlite:///"):
            raise ctx.fail(
                ["tracking", "mlflow", "tracking_uri"],
                f"got {uri!r}; expected sqlite:///relative/path.db or sqlite:////absolute/path.db",
            )
        rest = uri[len("sqlite:///") :]
        if uri.startswith("sqlite:///") and rest and not rest.startswith("/"):
            # Relative to the configuration file, as state_dir is (not to the cwd).
            uri = f"sqlite:///{ctx.path.parent / rest}"
        mlflow = MlflowConfig(tracking_uri=uri, experiment=m["experiment"])
    return TrackingConfig(tensorboard=v["tensorboard"], mlflow=mlflow)
