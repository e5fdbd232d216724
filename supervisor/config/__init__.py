"""The configuration: the TOML file (ARCHITECTURE.md section 8) validated into frozen dataclasses.

The package's parts, lowest first: `fields` (the field parsers and `ConfigError`), each wing's
own table (`mirror`, `cluster` with [spare], `metrics`, `hooks`, `preemption`), `model` (games,
modes, the built-in sections, `Config`), `games` and `matrix` (one [[games]] table; the tables
as runs), `recipe` (a built-in game's worker arguments), `parser` (`load_config`), and
`service_checks` (what only `rlsup run`, `check-config`, a reload and `rlsup pull` check).

`from supervisor.config import X` keeps working for every name the single module had. The names
load on first use (PEP 562), as in `checkpoints/__init__.py`: `rlsup status` imports this
package and never pays for the service checks; a test that patches a module global patches it
where it is defined (`supervisor.config.location.SYSTEM_CONFIG`, say).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.config.cluster import ClusterConfig as ClusterConfig
    from supervisor.config.cluster import SpareConfig as SpareConfig
    from supervisor.config.fields import ConfigError as ConfigError
    from supervisor.config.fields import Field as Field
    from supervisor.config.hooks import HOOK_PROGRAM_PATH as HOOK_PROGRAM_PATH
    from supervisor.config.hooks import HookSpec as HookSpec
    from supervisor.config.location import CONFIG_ENV as CONFIG_ENV
    from supervisor.config.location import DEFAULT_CONFIG as DEFAULT_CONFIG
    from supervisor.config.location import SYSTEM_CONFIG as SYSTEM_CONFIG
    from supervisor.config.location import resolve_config_path as resolve_config_path
    from supervisor.config.metrics import DEFAULT_METRICS_PORT as DEFAULT_METRICS_PORT
    from supervisor.config.metrics import MetricsConfig as MetricsConfig
    from supervisor.config.mirror import MIRROR_LOCATION_KEYS as MIRROR_LOCATION_KEYS
    from supervisor.config.mirror import MirrorConfig as MirrorConfig
    from supervisor.config.model import GAME_NAME_RE as GAME_NAME_RE
    from supervisor.config.model import KNOBS as KNOBS
    from supervisor.config.model import RUN_NAME_RE as RUN_NAME_RE
    from supervisor.config.model import Config as Config
    from supervisor.config.model import GameSpec as GameSpec
    from supervisor.config.model import GpuConfig as GpuConfig
    from supervisor.config.model import ModeSpec as ModeSpec
    from supervisor.config.model import RestartConfig as RestartConfig
    from supervisor.config.model import StabilityConfig as StabilityConfig
    from supervisor.config.model import WatchdogConfig as WatchdogConfig
    from supervisor.config.model import split_run_name as split_run_name
    from supervisor.config.parser import load_config as load_config
    from supervisor.config.parser import parse_config as parse_config
    from supervisor.config.preemption import METADATA_ENDPOINT as METADATA_ENDPOINT
    from supervisor.config.preemption import PREEMPTION_GRACE_S as PREEMPTION_GRACE_S
    from supervisor.config.preemption import PREEMPTION_PROVIDERS as PREEMPTION_PROVIDERS
    from supervisor.config.preemption import PreemptionConfig as PreemptionConfig
    from supervisor.config.recipe import worker_config as worker_config
    from supervisor.config.service_checks import check_for_service as check_for_service
    from supervisor.config.service_checks import check_runs_match as check_runs_match
    from supervisor.config.service_checks import mirror_reload_refusal as mirror_reload_refusal
    from supervisor.config.service_checks import resolve_hook_programs as resolve_hook_programs
    from supervisor.config.tracking import MlflowConfig as MlflowConfig
    from supervisor.config.tracking import TrackingConfig as TrackingConfig

_WHERE = {
    "CONFIG_ENV": "location",
    "DEFAULT_CONFIG": "location",
    "SYSTEM_CONFIG": "location",
    "resolve_config_path": "location",
    "ConfigError": "fields",
    "Field": "fields",
    "GAME_NAME_RE": "model",
    "KNOBS": "model",
    "RUN_NAME_RE": "model",
    "Config": "model",
    "GameSpec": "model",
    "GpuConfig": "model",
    "ModeSpec": "model",
    "RestartConfig": "model",
    "StabilityConfig": "model",
    "WatchdogConfig": "model",
    "split_run_name": "model",
    "MIRROR_LOCATION_KEYS": "mirror",
    "MirrorConfig": "mirror",
    "ClusterConfig": "cluster",
    "SpareConfig": "cluster",
    "METADATA_ENDPOINT": "preemption",
    "PREEMPTION_GRACE_S": "preemption",
    "PREEMPTION_PROVIDERS": "preemption",
    "PreemptionConfig": "preemption",
    "DEFAULT_METRICS_PORT": "metrics",
    "MetricsConfig": "metrics",
    "HOOK_PROGRAM_PATH": "hooks",
    "HookSpec": "hooks",
    "load_config": "parser",
    "parse_config": "parser",
    "worker_config": "recipe",
    "MlflowConfig": "tracking",
    "TrackingConfig": "tracking",
    "check_for_service": "service_checks",
    "check_runs_match": "service_checks",
    "mirror_reload_refusal": "service_checks",
    "resolve_hook_programs": "service_checks",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'supervisor.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"supervisor.config.{module}"), name)
    globals()[name] = value
    return value
