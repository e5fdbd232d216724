"""File modes of everything rlsup writes: owner, and the owner's group to read where the umask
lets it; never anyone else. Stdlib only and cheap to import (the CLI uses it)."""

from __future__ import annotations

# The most a state file or directory is ever opened to: its owner, and its group to read.
# The process umask takes away the rest: `rlsup run` sets 077 (owner only) unless systemd runs
# it, where the unit's UMask=0027 lets the service's group (its operators) read. Never world.
FILE_MODE = 0o640
DIR_MODE = 0o750


def current_umask() -> int:
    """The process umask, read without changing it (os.umask would, racing other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o077


def masked(mode: int) -> int:
    """`mode` as the umask leaves it, and never anything for others."""
    return mode & ~current_umask() & ~0o007
