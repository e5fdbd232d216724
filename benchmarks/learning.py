"""Equal learning: the fast path (--precision auto) against the fp32 path on Breakout-v5 PPO;
with `--algos`, the learning table of the algorithms at their own settings.

    python benchmarks/learning.py [--steps 500000] [--seeds 1,2] [--game Breakout-v5]
                                  [--parallel 2] [--threads 1] [--out DIR] [--paths fp32,fast]
    python benchmarks/learning.py --algos ppo,dqn,pqn --seeds 1,2,3 [--steps 500000]

`--algos`: each algorithm on the fast path at the field's settings (ALGO_ARGS: PPO as CleanRL's
ppo_atari_envpool, DQN as dqn_atari with 1 env, PQN as pqn_atari_envpool scaled to 8 envs),
per seed; prints per algorithm the mean over seeds of the last-100 mean and its seed spread.
Each finished run goes into a ledger (benchmarks/results/learning-GAME-STEPS.jsonl, kept in
the repository); runs already there are not run again, so the table can be completed over
several sessions; `--report` prints the table from the ledger alone.

`--peer` runs CleanRL's script for each algorithm instead, at the same settings as rlsup's
row (below: PEER_ARGS), into the same ledger (`"side": "cleanrl"`), and the table gains the
verdict "equal learning": rlsup's mean over seeds lies within the peer's seed spread (the range
of its seeds' last-100 means) of the peer's mean, or above it. The peers run from the scratch
venv of benchmarks/peers.py (or `--peer-python`); PQN needs a CleanRL checkout (`--peer-dir`),
whose commit goes into the ledger.

    python benchmarks/learning.py --algos pqn --seeds 1,2,3 --peer --peer-dir /path/to/cleanrl

Trains `--steps` agent steps per run with real worker processes (`python -m training.worker`,
8 envs, 128 steps, minibatch 256, 4 epochs: the throughput benchmark's settings), for each
precision and each seed, and prints per run the mean of the last 100 real-episode returns
(game over, unclipped score: the heartbeat's mean_return), the evaluation (10 episodes, the
evaluation protocol of training/evaluate.py, 60 s budget), the wall time and agent steps/s.

Runs go `--parallel` at a time with `--threads` each (default: two at a time, one core each,
the fp32 runs first). The verdict: the fast path's mean over seeds must lie within the fp32
path's seed-to-seed spread (the range of its seeds' means) of the fp32 mean, or above it.
`--paths fast` (or fp32) runs more seeds of one path only, with no verdict. It takes about an
hour on a 2-core machine; it is not in `make test`. Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import peers
from hostinfo import host_facts, host_line

REPO = Path(__file__).resolve().parents[1]
PATHS = {"fp32": "fp32", "fast": "auto"}
PPO_ARGS = ["--num-envs", "8", "--n-steps", "128", "--batch-size", "256", "--epochs", "4"]
ALGO_ARGS = {
    "ppo": PPO_ARGS,
    "dqn": ["--num-envs", "1", "--end-e", "0.01", "--exploration-fraction", "0.1"],
    "pqn": ["--num-envs", "8", "--n-steps", "32", "--batch-size", "64", "--epochs", "2"],
}  # fmt: skip
# CleanRL's scripts at the settings of ALGO_ARGS (each script's defaults where they agree):
# ppo_atari_envpool already runs 8 envs x 128 steps, 4 minibatches, 4 epochs; it anneals the
# learning rate by default and rlsup's PPO keeps it constant (unless `--lr-scheduler linear`),
# so the peer runs with `--anneal-lr False`, the table's rlsup rows' schedule;
# pqn_atari_envpool scaled as rlsup's row: 8 envs x 32 steps, minibatch 64 (4 of 256), 2
# epochs, lambda 0.65, lr annealed, epsilon 1 -> 0.01 over 10 %, grad norm 10 (its defaults);
# dqn_atari at rlsup's DQN defaults (1 env, buffer 100,000, learning from 10,000, target every
# 1,000, train every 4, batch 32, lr 1e-4, epsilon to 0.01 over 10 %; dqn_atari's target is
# the target network's max, rlsup's the Double DQN one unless --no-double-q).
PEER_SCRIPT = {"ppo": "ppo_atari_envpool.py", "pqn": "pqn_atari_envpool.py", "dqn": "dqn_atari.py"}
PEER_ARGS = {
    "ppo": ["--num-envs", "8", "--num-steps", "128", "--num-minibatches", "4",
            "--update-epochs", "4", "--anneal-lr", "False", "--track", "False",
            "--capture-video", "False", "--cuda", "False"],
    "pqn": ["--num-envs", "8", "--num-steps", "32", "--num-minibatches", "4",
            "--update-epochs", "2", "--q-lambda", "0.65", "--no-track", "--no-capture-video",
            "--no-cuda"],
    "dqn": ["--num-envs", "1", "--buffer-size", "100000", "--learning-starts", "10000",
            "--target-network-frequency", "1000", "--train-frequency", "4",
            "--batch-size", "32", "--learning-rate", "1e-4", "--end-e", "0.01",
            "--exploration-fraction", "0.1", "--track", "False", "--capture-video", "False",
            "--cuda", "False"],
}  # fmt: skip


def peer_train(args: argparse.Namespace, algo: str, seed: int, python: Path) -> dict[str, Any]:
    """One CleanRL run at the learning table's settings: its last-100 mean of game-over
    returns (the script's `episodic_return=` lines, as rlsup's heartbeat counts them)."""
    if algo == "pqn":
        if args.peer_dir is None:
            raise SystemExit("--peer --algos pqn: give a CleanRL checkout with --peer-dir")
        script = Path(args.peer_dir).resolve() / "cleanrl" / PEER_SCRIPT[algo]
    else:
        script = peers.cleanrl_script(python, PEER_SCRIPT[algo])
    game = peers.DQN_PEER_GAME if algo == "dqn" else args.game
    row = peers.Row(
        algo=algo, steps=args.steps, warmup=0, peer_script=script,
        peer_argv=["--env-id", game, "--total-timesteps", str(args.steps), *PEER_ARGS[algo]],
        peer_step_of=peers.iteration_steps(256 if algo == "pqn" else 1024), rlsup_argv=None,
        settings="",
    )  # fmt: skip
    r = peers.run_peer(row, seed, python, args.threads, timeout_s=6 * 3600.0)
    if "error" in r:
        raise SystemExit(f"cleanrl {algo} seed {seed}: {r['error']}\n{r['tail']}")
    steps = args.steps if algo == "dqn" else r["steps"]
    return {
        "side": "cleanrl", "algo": algo, "seed": seed, "steps": steps,
        "episodes": r["episodes"], "mean_last_100": r["mean_last_100"], "eval_mean": None,
        "wall_s": r["wall_s"], "sps": round(steps / r["wall_s"], 1) if steps else None,
        "script": script.name, "peer_game": game,
        "peer_commit": peers.git_commit(Path(args.peer_dir)) if algo == "pqn" else None,
        "peer_from": str(python), "peer_args": PEER_ARGS[algo],
    }  # fmt: skip


def train(
    game: str,
    precision: str,
    seed: int,
    steps: int,
    threads: int,
    out: Path,
    algo: str = "ppo",
    device: str = "cpu",
) -> dict:
    run_dir = out / f"{game}-{algo}-{precision}-seed{seed}"
    cmd = [
        sys.executable, "-m", "training.worker", "--game", game, "--algo", algo,
        "--run-dir", str(run_dir), *ALGO_ARGS[algo], "--total-steps", str(steps),
        "--seed", str(seed), "--threads", str(threads), "--precision", PATHS[precision],
        "--checkpoint-every-s", "600", "--eval-episodes", "10", "--eval-budget-s", "60",
        "--no-tensorboard", "--device", device,
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{run_dir.name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    hb = json.loads((run_dir / "heartbeat.json").read_text())
    ev = json.loads((run_dir / "eval.json").read_text())
    train_s = wall - float(ev.get("seconds") or 0.0)
    return {
        "algo": algo,
        "device": hb.get("device") or device,
        "path": precision,
        "precision": hb.get("precision"),
        "seed": seed,
        "steps": hb["global_step"],
        "episodes": hb["episodes"],
        "mean_last_100": hb["mean_return"],
        "eval_mean": ev.get("mean"),
        "eval_episodes": ev.get("episodes"),
        "eval_capped": ev.get("capped"),
        "eval_unfinished": ev.get("unfinished"),
        "eval_s": ev.get("seconds"),
        "wall_s": round(wall, 1),
        "sps": round(hb["global_step"] / train_s, 1) if train_s > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="Breakout-v5")
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="keep the run dirs here")
    parser.add_argument("--paths", default="fp32,fast", help="paths to run: fp32, fast or both")
    parser.add_argument("--algos", default="", help="the learning table: e.g. ppo,dqn,pqn")
    parser.add_argument("--ledger", default=None, help="the learning table's JSONL ledger")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu",
        help="rlsup's runs of the learning table (--algos) on this device; its own ledger",
    )  # fmt: skip
    parser.add_argument("--report", action="store_true", help="print the table; run nothing")
    parser.add_argument("--peer", action="store_true", help="run CleanRL's side of the table")
    parser.add_argument("--peer-dir", default=None, help="a CleanRL checkout (for pqn)")
    parser.add_argument("--venv", type=Path, default=peers.DEFAULT_VENV, help="the peers' venv")
    parser.add_argument("--peer-python", type=Path, default=None, help="the peers' interpreter")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.algos:
        table(args, [a for a in args.algos.split(",") if a], seeds)
        return
    # The slower path's runs first (the longest jobs first: the shortest makespan); with one
    # thread per run on its own core, a run's wall time is its own.
    paths = [p for p in ("fp32", "fast") if p in args.paths.split(",")]
    jobs = [(p, seed) for p in paths for seed in seeds]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with ThreadPoolExecutor(max(1, args.parallel)) as pool:
            futures = [
                pool.submit(train, args.game, p, s, args.steps, args.threads, out) for p, s in jobs
            ]
            runs = [f.result() for f in futures]
        total = time.monotonic() - t0
    by: dict[str, list[dict[str, Any]]] = {p: [r for r in runs if r["path"] == p] for p in PATHS}
    print(
        f"{host_line()}\n{args.game} PPO, "
        f"{args.steps} agent steps per run, {args.parallel} runs at a time x {args.threads} "
        f"thread(s); {total / 60:.0f} min in all"
    )
    head = f"{'path':<6}{'prec':>6}{'seed':>6}{'last-100 mean':>15}{'eval mean':>11}"
    print(head + f"{'eval eps':>9}{'wall s':>9}{'steps/s':>9}")
    for r in runs:
        ev = "-" if r["eval_mean"] is None else f"{r['eval_mean']:.2f}"
        print(
            f"{r['path']:<6}{r['precision'] or '?':>6}{r['seed']:>6}"
            f"{r['mean_last_100']:>15.2f}{ev:>11}{r['eval_episodes']:>9}"
            f"{r['wall_s']:>9.0f}{r['sps']:>9.0f}"
        )
    means = {p: [r["mean_last_100"] for r in rs] for p, rs in by.items()}
    if not all(means.values()):
        print(json.dumps({"benchmark": "learning", "host": host_facts(), "game": args.game,
                          "steps": args.steps, "runs": runs,
                          "minutes": round(total / 60, 1)}))  # fmt: skip
        return
    fp32_mean = statistics.mean(means["fp32"])
    spread = max(means["fp32"]) - min(means["fp32"])
    fast_mean = statistics.mean(means["fast"])
    within = abs(fast_mean - fp32_mean) <= spread or fast_mean >= fp32_mean
    sps = {p: statistics.mean(r["sps"] for r in rs) for p, rs in by.items()}
    print(
        f"fp32 mean {fp32_mean:.2f} (seed spread {spread:.2f}); fast mean {fast_mean:.2f}: "
        f"{'within' if within else 'OUTSIDE'} the fp32 spread; "
        f"steps/s fast / fp32 = {sps['fast'] / sps['fp32']:.2f}"
    )
    print(
        json.dumps(
            {
                "benchmark": "learning",
                "host": host_facts(),
                "game": args.game,
                "steps": args.steps,
                "runs": runs,
                "fp32_mean": round(fp32_mean, 3),
                "fp32_spread": round(spread, 3),
                "fast_mean": round(fast_mean, 3),
                "within_spread": within,
                "sps_ratio": round(sps["fast"] / sps["fp32"], 3),
                "minutes": round(total / 60, 1),
            }
        )
    )


def ledger_path(args: argparse.Namespace) -> Path:
    """The learning table's ledger: one JSON line per finished run, kept in the repository so
    the table can be completed across sessions (a 2-core machine cannot run 9 runs in one)."""
    if args.ledger is not None:
        return Path(args.ledger)
    where = "" if args.device == "cpu" else f"-{args.device}"  # a GPU's table is its own
    return REPO / "benchmarks" / "results" / f"learning-{args.game}-{args.steps}{where}.jsonl"


def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    runs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}:{n}: not a JSON line ({e.msg})") from None
    return runs


def table(args: argparse.Namespace, algos: list[str], seeds: list[int]) -> None:
    """Each algorithm on the fast path at its own settings, per seed: the learning table.

    Every finished run is appended to the ledger at once (a run cut off costs only itself);
    runs already in the ledger for this game, step budget, algorithm and seed are not run
    again. The table is printed from the ledger (`--report`: print it without running)."""
    path = ledger_path(args)
    side = "cleanrl" if args.peer else "rlsup"
    done = {(r["algo"], r["seed"]) for r in read_ledger(path) if r.get("side", "rlsup") == side}
    jobs = [] if args.report else [(a, s) for a in algos for s in seeds if (a, s) not in done]
    python = None
    if jobs and args.peer:
        python = args.peer_python
        if python is None:
            peers.ensure_venv(args.venv.expanduser())
            python = peers.venv_python(args.venv.expanduser())
    # The slowest algorithm's runs first: the shortest makespan.
    jobs.sort(key=lambda j: {"dqn": 0, "ppo": 1, "pqn": 2}.get(j[0], 3))
    t0 = time.monotonic()
    if jobs:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = args.out or Path(tmp)
            out.mkdir(parents=True, exist_ok=True)

            def one(algo: str, seed: int) -> dict[str, Any]:
                if python is not None:
                    r = peer_train(args, algo, seed, python)
                else:
                    r = train(
                        args.game, "fast", seed, args.steps, args.threads, out, algo, args.device
                    )
                r.update(game=args.game, host=host_facts(), finished=time.strftime("%Y-%m-%d"))
                with path.open("a") as f:
                    f.write(json.dumps(r) + "\n")
                print(f"{side} {algo} seed {seed}: last-100 {r['mean_last_100']:.2f}, "
                      f"{r['sps']} steps/s, {r['wall_s'] / 60:.0f} min", flush=True)  # fmt: skip
                return r

            with ThreadPoolExecutor(max(1, args.parallel)) as pool:
                for f in [pool.submit(one, a, s) for a, s in jobs]:
                    f.result()
    total = time.monotonic() - t0
    runs = [r for r in read_ledger(path) if r["algo"] in algos]
    print(
        f"{host_line()}\n{args.game}, {args.steps} agent steps per run; ledger {path.name} "
        f"({len(runs)} runs); {total / 60:.0f} min run now"
    )
    print("| algo | side | seeds | last-100 mean | seed spread (min-max) | eval mean | steps/s "
          "| CPUs |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for algo in algos:
        for side in ("rlsup", "cleanrl"):
            rs = [r for r in runs if r["algo"] == algo and r.get("side", "rlsup") == side]
            if not rs:
                if side == "rlsup":
                    print(f"| {algo} | {side} | 0 | - | - | - | - | - |")
                continue
            means = [r["mean_last_100"] for r in rs if r["mean_last_100"] is not None]
            evals = [r["eval_mean"] for r in rs if r.get("eval_mean") is not None]
            mean = statistics.mean(means) if means else None
            lo, hi = (min(means), max(means)) if means else (None, None)
            ev = statistics.mean(evals) if evals else None
            sps = statistics.mean(r["sps"] for r in rs if r["sps"])
            cpus = sorted({str(r.get("host", {}).get("cpu_model", "?")) for r in rs})
            key = algo if side == "rlsup" else f"{algo}_cleanrl"
            summary[key] = {"n": len(rs), "mean": mean, "min": lo, "max": hi, "eval_mean": ev,
                            "sps": sps, "seeds": sorted(r["seed"] for r in rs)}  # fmt: skip
            print(f"| {algo} | {side} | {len(rs)} | {fmt(mean)} | {fmt(lo)}-{fmt(hi)} "
                  f"| {fmt(ev)} | {sps:.0f} | {'; '.join(cpus)} |")  # fmt: skip
        verdict = equal_learning(summary.get(algo), summary.get(f"{algo}_cleanrl"))
        if verdict is not None:
            summary[f"{algo}_equal_learning"] = verdict
            print(f"{algo}: {verdict}")
    print(json.dumps({"benchmark": "learning_table", "game": args.game, "steps": args.steps,
                      "ledger": str(path), "summary": summary,
                      "minutes": round(total / 60, 1)}))  # fmt: skip


def equal_learning(ours: dict[str, Any] | None, peer: dict[str, Any] | None) -> str | None:
    """The issue's criterion: rlsup's mean over >= 3 seeds within the peer's seed spread (its
    seeds' max - min) of the peer's mean, or above it. None until both sides have a mean."""
    if not ours or not peer or ours["mean"] is None or peer["mean"] is None:
        return None
    spread = peer["max"] - peer["min"]
    ok = ours["mean"] >= peer["mean"] or abs(ours["mean"] - peer["mean"]) <= spread
    seeds = min(ours["n"], peer["n"])
    return (
        f"rlsup {ours['mean']:.2f} vs CleanRL {peer['mean']:.2f} (spread {spread:.2f}): "
        f"{'equal learning' if ok else 'BELOW the peer spread'}"
        + (
            ""
            if seeds >= 3
            else f" (seeds: rlsup {ours['n']}, CleanRL {peer['n']}; the criterion "
            "needs >= 3 a side)"
        )
    )


if __name__ == "__main__":
    main()
