"""One training worker: `python -m training.worker --game Pong-v5 --algo ppo --run-dir ...`.

The command the supervisor starts (and the one a spare's process title shows): with
`--standby` a spare worker (training/standby.py), otherwise a worker (training/entry.py).
Rerunning the same command in the same run directory resumes from the newest valid checkpoint;
a finished run exits 0 at once. Exit codes, heartbeat and files: see training/protocol.py.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from training import entry


def main(argv: list[str] | None = None, start: dict[str, Any] | None = None) -> int:
    """`start`: how this process came to be this worker (heartbeat `start`)."""
    argv = sys.argv[1:] if argv is None else argv
    # gymnasium warns about envpool's float64 Box bounds on every env made: noise, not news.
    warnings.filterwarnings("ignore", category=UserWarning, module="gymnasium")
    if "--standby" in argv:
        from training import standby

        return standby.main(argv)
    return entry.main(argv, start)


if __name__ == "__main__":
    sys.exit(main())
