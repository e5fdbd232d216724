"""Kill -> first training step of a real worker, eager against `--cuda-graphs on` and
`--compile`: what a graphed or compiled learner's warm-up adds to a recovery, and what the
compile cache kept in the run directory saves on a restart. Made for a GPU lease
(`gpu_session.sh restart`); runs anywhere (`--device cpu`: the graphs are uncaptured there).

    python benchmarks/gpu_restart.py [--device cuda] [--game Breakout-v5] [--algo ppo]
        [--variant ""] [--variant "--cuda-graphs on"] [--variant "--compile default"] ...

Per variant, one run directory and two starts of `python -m training.worker`:
1. cold: nothing compiled, no checkpoint; it trains until its first checkpoint commits, then
   is SIGKILLed;
2. the restart: it loads that checkpoint (and, compiled, the compile cache in the run
   directory, `compile-cache/`).
For each start, seconds from the spawn to its heartbeat's marks (the system's monotonic clock):
`loaded` (checkpoint loaded, learner built) and `first_step` (its first iteration done: what a
graph's capture or a compile adds lands here). The eager variant is the baseline of the same
run: each row says its restart's first step as a ratio of the eager restart's. Ends with one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hostinfo import host_facts, host_line

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VARIANTS = ["", "--cuda-graphs on", "--compile default", "--compile reduce-overhead"]


def _heartbeat(run_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run_dir / "heartbeat.json").read_text()))
    except (OSError, ValueError):
        return {}


def _start(argv: list[str], run_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    (run_dir / "heartbeat.json").unlink(missing_ok=True)
    with open(log, "ab") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    return proc, t0


def _wait(
    proc: subprocess.Popen[bytes], run_dir: Path, until: str, timeout_s: float
) -> dict[str, Any]:
    """The heartbeat once `until` holds ("first_step", or "checkpoint": one committed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        hb = _heartbeat(run_dir)
        start = hb.get("start") or {}
        if until == "first_step" and "first_step" in start:
            return hb
        if until == "checkpoint" and hb.get("last_checkpoint_step") is not None:
            return hb
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited {proc.returncode} before {until}")
        time.sleep(0.05)
    raise RuntimeError(f"no {until} within {timeout_s:.0f} s")


def measure(args: argparse.Namespace, variant: str, root: Path) -> dict[str, Any]:
    run_dir = root / (variant.replace("-", "").replace(" ", "_") or "eager")
    run_dir.mkdir(parents=True)
    log = run_dir.with_suffix(".log")
    argv = [
        sys.executable, "-m", "training.worker", "--run-dir", str(run_dir),
        "--game", args.game, "--algo", args.algo, "--device", args.device,
        "--threads", str(args.threads), "--total-steps", str(10**8), "--eval-episodes", "0",
        "--checkpoint-every-s", "1", *shlex.split(variant),
    ]  # fmt: skip
    row: dict[str, Any] = {"variant": variant or "eager"}
    for start in ("cold", "restart"):
        proc, t0 = _start(argv, run_dir, log)
        try:
            hb = _wait(proc, run_dir, "first_step", args.timeout_s)
            marks = hb["start"]
            row[start] = {
                "loaded_s": round(marks["loaded"] - t0, 3),
                "first_step_s": round(marks["first_step"] - t0, 3),
            }
            if start == "cold":
                _wait(proc, run_dir, "checkpoint", args.timeout_s)
            else:
                row[start]["resumed_from_step"] = hb.get("resumed_from_step")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    print(
        f"{row['variant']:>28}: cold first step {row['cold']['first_step_s']:.2f} s, "
        f"restart {row['restart']['first_step_s']:.2f} s "
        f"(loaded at {row['restart']['loaded_s']:.2f} s)",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--game", default="Breakout-v5")
    parser.add_argument("--algo", default="ppo", choices=("ppo", "pqn", "dqn"))
    parser.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument(
        "--variant", action="append", default=None,
        help='worker flags of one variant ("" = eager, the baseline); repeat; default: eager, '
        "--cuda-graphs on, --compile default, --compile reduce-overhead",
    )  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per start")
    args = parser.parse_args()
    variants = DEFAULT_VARIANTS if args.variant is None else args.variant
    if "" not in variants:
        variants = ["", *variants]  # the baseline, always
    print(host_line(), flush=True)
    print(f"{args.algo} on {args.game}, --device {args.device}, {args.threads} threads")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlsup-restart-") as tmp:
        for variant in variants:
            try:
                rows.append(measure(args, variant, Path(tmp)))
            except RuntimeError as exc:
                print(f"{variant or 'eager'}: {exc}", flush=True)
                rows.append({"variant": variant or "eager", "error": str(exc)})
    base = next((r for r in rows if r["variant"] == "eager" and "restart" in r), None)
    for row in rows:
        if base is not None and "restart" in row:
            row["restart_vs_eager"] = round(
                row["restart"]["first_step_s"] / base["restart"]["first_step_s"], 3
            )
    print(json.dumps({"benchmark": "gpu_restart", "host": host_facts(), "algo": args.algo,
                      "game": args.game, "device": args.device, "rows": rows}))  # fmt: skip


if __name__ == "__main__":
    main()
