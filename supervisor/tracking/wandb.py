"""W&B for command games that already call `wandb.init()` (CleanRL's `--track`): a run id fixed
for the game's whole life (made once, kept in `<run_dir>/wandb_run_id`), `WANDB_RESUME=allow`,
the group and the name, so every restart continues the same W&B run. Variables the game's
`env` or the supervisor's own environment already set are left as they are.

W&B ignores a logged step lower than the run's current step: after a resume from a checkpoint,
the steps redone up to where the killed process had got are dropped by W&B (with a warning)
until the new process passes it (docs/own-trainer.md).
"""

from __future__ import annotations

import os
import re
import secrets
import string
from collections.abc import Mapping
from pathlib import Path

RUN_ID_FILE = "wandb_run_id"
_ID_RE = re.compile(r"[a-z0-9]{8,64}")
_ALPHABET = string.ascii_lowercase + string.digits


def run_id(run_dir: Path) -> str:
    """The run's W&B id: read from its file, or made and written (O_EXCL) on first use."""
    path = run_dir / RUN_ID_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    if _ID_RE.fullmatch(text):
        return text
    new = "".join(secrets.choice(_ALPHABET) for _ in range(12))
    tmp = path.with_name(f".{RUN_ID_FILE}.{new}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    try:
        os.write(fd, (new + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return new


def wandb_env(
    name: str, group: str, run_dir: Path, given: Mapping[str, str], outer: Mapping[str, str]
) -> dict[str, str]:
    """WANDB_RUN_ID, WANDB_RESUME, WANDB_RUN_GROUP and WANDB_NAME for the game `name`, less
    those set in `given` (the game's env) or `outer` (the supervisor's environment)."""
    wanted = {"WANDB_RESUME": "allow", "WANDB_RUN_GROUP": group, "WANDB_NAME": name}
    out = {k: v for k, v in wanted.items() if k not in given and k not in outer}
    if "WANDB_RUN_ID" not in given and "WANDB_RUN_ID" not in outer:
        out["WANDB_RUN_ID"] = run_id(run_dir)
    return out
