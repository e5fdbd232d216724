"""How long does `rlsup status` take on a busy state directory?

Builds a state dir with N games (heartbeats, progress.csv files a week long) and a week of
events in the state database, then times `python -m supervisor.cli status` (and `--json`) as
subprocesses — the median of N runs — against `python -c pass` measured in the same run,
twice: on the host as it is, then under load (`--load`, default one busy-looping process per
core: the host as it is while workers train on every core). Prints a table, then ONE JSON
line with the figures. Budget: median status <= 150 ms, idle and under load.

    .venv/bin/python benchmarks/status_latency.py [--games 5] [--events 20000] [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hostinfo import host_facts, host_line  # noqa: E402

from harness.state_fixture import build_state  # noqa: E402

BUDGET_MS = 150.0  # median `rlsup status`, idle and under load (issue 16)
OK_CODES = (0, 3, 4)  # status: ok, the supervisor not running, a FATAL game (the fixture's)


def start_load(n: int) -> list[subprocess.Popen[bytes]]:
    """n CPU-bound processes (what n training workers do to the cores), at normal priority."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def time_runs(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True)
        out.append((time.perf_counter() - t0) * 1000.0)
        if r.returncode not in OK_CODES:
            raise SystemExit(f"{argv} failed ({r.returncode}): {r.stderr.decode()[-2000:]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", type=int, default=5)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--progress-rows", type=int, default=20_160, help="per game (30 s for 7 d)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument(
        "--load", type=int, default=os.cpu_count() or 1, help="busy processes (default: cores)"
    )
    args = ap.parse_args()

    # Other work on this host (test suites, training) inflates every figure, `pass` included.
    load_before = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="rlsup-bench-") as tmp:
        t0 = time.perf_counter()
        fx = build_state(
            Path(tmp),
            n_games=args.games,
            n_events=args.events,
            progress_rows=args.progress_rows,
            cost_per_hour=0.9,
        )
        build_s = time.perf_counter() - t0
        env = fx.env()
        # As an installed rlsup runs: with its bytecode cached (a session that exports
        # PYTHONDONTWRITEBYTECODE would compile every module of every command from source).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        py = sys.executable
        cmd = [py, "-m", "supervisor.cli", "status", "--config", str(fx.config)]
        time_runs(cmd, env, 2)  # warm the page cache and .pyc files
        cases = {
            "python -c pass": [py, "-c", "pass"],
            "rlsup status": cmd,
            "rlsup status --json": [*cmd, "--json"],
            "rlsup events --since 7d": [
                py,
                "-m",
                "supervisor.cli",
                "events",
                "--since",
                "7d",
                "--config",
                str(fx.config),
            ],
        }
        results = {name: time_runs(argv, env, args.runs) for name, argv in cases.items()}
        load = start_load(args.load)
        try:
            time.sleep(1.0)  # let the busy loops take the cores
            loaded = {
                name: time_runs(cases[name], env, args.runs)
                for name in ("python -c pass", "rlsup status", "rlsup status --json")
            }
        finally:
            stop_load(load)
        db_mb = fx.db.stat().st_size / 2**20
        progress_mb = sum(p.stat().st_size for p in fx.state_dir.glob("runs/*/progress.csv"))
        progress_mb /= 2**20

    print(
        f"state: {args.games} games, {args.events} events, {args.progress_rows} progress rows"
        f"/game; db {db_mb:.1f} MiB, progress {progress_mb:.1f} MiB; built in {build_s:.1f} s; "
        f"{os.cpu_count()} CPUs; {args.runs} runs each; load: {args.load} busy processes"
    )
    print(f"{'command':<34} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    rows = [*results.items(), *((f"{k} (loaded)", v) for k, v in loaded.items())]
    for name, ms in rows:
        print(f"{name:<34} {statistics.median(ms):>10.1f} {min(ms):>8.1f} {max(ms):>8.1f}")
    med = {name: round(statistics.median(ms), 1) for name, ms in results.items()}
    lmed = {name: round(statistics.median(ms), 1) for name, ms in loaded.items()}
    figures = {
        "benchmark": "status_latency",
        "games": args.games,
        "events": args.events,
        "progress_rows_per_game": args.progress_rows,
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "python_pass_median_ms": med["python -c pass"],
        "status_median_ms": med["rlsup status"],
        "status_json_median_ms": med["rlsup status --json"],
        "events_7d_median_ms": med["rlsup events --since 7d"],
        "status_overhead_ms": round(med["rlsup status"] - med["python -c pass"], 1),
        "load_processes": args.load,
        "loaded_python_pass_median_ms": lmed["python -c pass"],
        "loaded_status_median_ms": lmed["rlsup status"],
        "loaded_status_json_median_ms": lmed["rlsup status --json"],
        "loaded_status_vs_pass": round(lmed["rlsup status"] / lmed["python -c pass"], 2),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "budget_ms": BUDGET_MS,
        "within_budget": max(med["rlsup status"], lmed["rlsup status"]) <= BUDGET_MS,
    }
    print(host_line())
    print(json.dumps({**figures, "host": host_facts()}))
    return 0 if figures["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
