"""Fault-injection soak, long schedule: `RLSUP_SOAK_MINUTES=60 .venv/bin/python benchmarks/soak.py`.

Shares its engine with the CI test (harness/chaos/soak_*.py): a real `rlsup run` with three
games under a seeded fault schedule (SIGKILL, mid-checkpoint SIGKILL, SIGSTOP, supervisor kill,
host reboot, corrupt checkpoints, full disk, kernel OOM kill, mode pins, a flood of idle
connections to the metrics endpoint, a hook storm, the mirror moved by a reload; the mirror is
SeaweedFS on loopback); prints the figures table and ends with one JSON line. Exit status 1
when an invariant was violated. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from hostinfo import host_facts, host_line

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--minutes", type=float, default=float(os.environ.get("RLSUP_SOAK_MINUTES", 60)))
    p.add_argument("--seed", type=int, default=int(os.environ.get("RLSUP_SOAK_SEED", 1)))
    p.add_argument("--workdir", type=Path, default=None, help="kept after the run (default: temp)")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from harness.chaos import soak_engine as engine

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rlsup-soak-")) / "soak"
    phase_s = max(60.0, args.minutes * 60 - 90)  # start-up and the finish take the rest
    settings = engine.SoakSettings(
        workdir=workdir,
        fault_phase_s=phase_s,
        seed=args.seed,
        # A fault takes ~14 s on this 2-core machine (waits for health, recovery): one per
        # 10 s of schedule kept a 60-minute soak injecting for ~85 min.
        min_faults=max(20, int(phase_s / 16)),
        finish_timeout_s=max(240.0, phase_s * 0.3),
    )
    print(f"soak: {args.minutes} min, seed {args.seed}, workdir {workdir}", flush=True)
    print(host_line(), flush=True)
    soak, violations = engine.run_soak(settings)
    print(json.dumps({"benchmark": "soak", "host": host_facts(), **soak.figures()}))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
