"""Where the configuration file is: --config, $RLSUP_CONFIG, ./rlsup.toml, the service's."""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_ENV = "RLSUP_CONFIG"
DEFAULT_CONFIG = "rlsup.toml"
# Where `rlsup install-service` puts the service's configuration: found without any flag.
SYSTEM_CONFIG = Path("/etc/rlsup/rlsup.toml")


def resolve_config_path(arg: str | os.PathLike[str] | None) -> Path:
    """--config PATH, else $RLSUP_CONFIG, else ./rlsup.toml, else /etc/rlsup/rlsup.toml (the
    installed service's); ./rlsup.toml is named in the message when none exists."""
    if arg:
        return Path(arg)
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    local = Path(DEFAULT_CONFIG)
    if not local.exists() and os.path.lexists(SYSTEM_CONFIG):
        return SYSTEM_CONFIG
    return local
