"""Fault-injection seam for read errors (tests and the soak only; inert in production).

No kernel fault injection or device-mapper is available on the machines this project is tested
on, so a read error (EIO, EACCES, ESTALE, ...) is injected here, at the one function through
which the store opens a file to read it. Set `RLSUP_FAULT_READ_ERRORS` to the path of a control
file; each of its lines is `<ERRNO NAME> <absolute path prefix>`, e.g.
`EIO /srv/rlsup/runs/pong/checkpoints/`. The file is re-read on every open, so a test (or the
soak, from outside the worker) can start and end a fault while the process runs. Without the
variable this is one dictionary lookup per open.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

ENV = "RLSUP_FAULT_READ_ERRORS"


def check_read(path: Path) -> None:
    control = os.environ.get(ENV)
    if not control:
        return
    try:
        lines = Path(control).read_text(encoding="utf-8").splitlines()
    except OSError:
        return
    target = os.path.abspath(path)
    for line in lines:
        name, _, prefix = line.strip().partition(" ")
        code = getattr(errno, name, None)
        if isinstance(code, int) and prefix and target.startswith(prefix):
            raise OSError(code, f"{os.strerror(code)} (injected by {ENV})", str(path))
