"""CleanRL's own scripts as peers: rlsup's training worker against them, same settings, same run.

    python benchmarks/peers.py [--algos ppo,dqn,pqn] [--steps N] [--peer-dir PATH]
        [--seeds 1] [--threads N] [--repeats 1] [--venv DIR] [--buffer-size 100000]
        [--device cpu|cuda] [--peer-python PATH] [--rlsup-args FLAGS] [--peer-from JSON]

Per algorithm, for each seed and `--repeats` times (the order alternated, so that drifting load
hits both alike), back to back on this machine's CPU with `--threads` each:
- the peer, CleanRL's script as it is, never copied into the project: `ppo` runs
  cleanrl/ppo_atari_envpool.py and `dqn` cleanrl/dqn_atari.py of the PyPI package cleanrl==1.2.0,
  `pqn` runs cleanrl/pqn_atari_envpool.py of the CleanRL checkout `--peer-dir` (newer than the
  package; its commit is printed; without `--peer-dir` the row is skipped). They run in a scratch
  venv outside the project (`--venv`, default ~/.cache/rlsup-bench/cleanrl-1.2.0, made on first
  use and reused while its pins hold: PEER_PINS below, and the project's own torch and envpool
  versions), under benchmarks/cleanrl_shim.py, which imports ale_py (ROMs, ids) and gives
  `envpool.make(env_type="gym")` back the gym 0.23 API those scripts expect. Their TensorBoard
  files go to a temporary directory; wandb and video capture stay off; OMP_NUM_THREADS and
  MKL_NUM_THREADS = `--threads` (their envpool keeps its own default thread count, as the
  scripts make it);
- rlsup: `python -m training.worker` with the same settings (`--eval-episodes 0`, checkpoints
  every 600 s, TensorBoard on as the peers have it, the default `--precision auto`), its envs on
  envpool's default threads as the peers' are (`--env-threads 0`, where the worker has it).

Settings (CPU, `--seed`, Breakout):
- ppo: CleanRL's defaults: Breakout-v5, 8 envs x 128 steps, 4 minibatches (256), 4 epochs,
  lr 2.5e-4, gamma 0.99, GAE 0.95, clip 0.1, entropy 0.01, value 0.5, grad norm 0.5. CleanRL
  anneals the learning rate linearly to 0 over the budget; rlsup too where its worker has
  `--lr-scheduler linear`, else it keeps it constant (the row's settings line says which).
- dqn: 1 env, batch 32, train frequency 4, learning starts 1,000, target sync every 1,000, lr
  1e-4, epsilon 1 -> 0.01 over 10 % of the budget, replay `--buffer-size` on both sides.
  CleanRL plays BreakoutNoFrameskip-v4 through gymnasium + SB3's Atari wrappers (the same
  preprocessing as envpool's: noop 30, frame skip 4 with max-pooling, life loss = episode end,
  FIRE on reset, clipped rewards, 84x84 gray, stack 4); rlsup plays envpool's Breakout-v5. CleanRL
  clips no gradient; rlsup's DQN clips at its default norm 10. The DQN batch goes to
  `--dqn-batch-size` where the worker has that flag, else to `--batch-size`.
- pqn: CleanRL's pqn_atari_envpool defaults scaled to a CPU: Breakout-v5, 8 envs x 128 steps,
  minibatch 256, 2 epochs (CleanRL's default is 4), q_lambda 0.65, RAdam lr 2.5e-4, grad norm
  10, epsilon 1 -> 0.01 over 10 % of the budget, lr annealed as for ppo. Where rlsup's build
  has no `pqn` algorithm, its side says so and the peer is still measured.

`--peer-from JSON` takes the peers' runs from an earlier run's JSON line (same host, same
rows' steps, the same seeds and repeats) instead of running them again: a variant of rlsup's
side (`--rlsup-args`) on a short GPU lease costs its own runs only. A row it has no run for
runs its peer as usual.

`--rlsup-dir` runs the worker of another rlsup tree (a branch's `git archive`, say) with this
venv; its algorithms and flags are asked of that tree.

`--device cuda` runs both sides on the GPU (the peers' `--cuda`, rlsup's `--device cuda`); the
host line then names the GPU. `--peer-python` takes an interpreter that already holds the peers'
packages (a machine with no package index, where the scratch venv cannot be made); the versions
it has are printed as the venv's are.

Measured the same way for both: agent steps per second after a warm-up (the first rollout and
update for ppo/pqn, learning_starts for dqn), (last step - first step after the warm-up) / the
wall time between them. The peer's points are its `SPS:` lines (one per iteration for ppo/pqn,
every 100 steps once learning for dqn: their global steps follow from the settings), stamped
as they arrive on its unbuffered stdout; rlsup's are its progress.csv rows (time, global_step;
one per iteration at most every 2 s). Returns at the budget: the mean of the last 100
real-episode returns (game over, unclipped score) of each: the peer's `episodic_return=` lines,
rlsup's final heartbeat.json `mean_return` (with the episodes each finished). Rates are medians
over the runs; returns are means over them; ratio = rlsup / peer. Ends with one JSON line of
the figures. Not in `make test`: each row takes minutes.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from hostinfo import host_facts, host_line

REPO = Path(__file__).resolve().parents[1]
SHIM = Path(__file__).resolve().parent / "cleanrl_shim.py"
DEFAULT_VENV = Path.home() / ".cache" / "rlsup-bench" / "cleanrl-1.2.0"
CLEANRL = "cleanrl==1.2.0"  # holds ppo_atari_envpool.py and dqn_atari.py; requires Python < 3.11
# What the two packaged scripts (and pqn_atari_envpool.py) import, at versions that resolve for
# this project's Python and work together; torch and envpool are added at the project's own
# versions (torch through constraints/cpu-torch.txt, the Makefile's TORCH_PIN).
PEER_PINS = (
    "gym==0.23.1",  # ppo/pqn_atari_envpool: gym.Wrapper, gym.spaces (the 0.23 API)
    "gymnasium==0.29.1",  # dqn_atari: FrameStack, GrayScaleObservation, final_info (gone in 1.0)
    "stable-baselines3==2.4.1",  # dqn_atari: atari_wrappers, ReplayBuffer (gymnasium-based 2.x)
    "ale-py==0.9.1",  # ROMs bundled; registers BreakoutNoFrameskip-v4 with gymnasium on import
    "numpy<2",  # stable-baselines3 2.4
    "opencv-python-headless==4.11.0.86",  # gymnasium 0.29's ResizeObservation, GrayScale
    "tensorboard==2.21.0",  # torch.utils.tensorboard's SummaryWriter
    "tyro==1.0.17",  # pqn_atari_envpool's command line
)
REPORTED = ("cleanrl", "torch", "envpool", "numpy", "gym", "gymnasium", "stable-baselines3",
            "ale-py", "opencv-python-headless", "tensorboard", "tyro")  # fmt: skip
PPO_GAME, DQN_PEER_GAME = "Breakout-v5", "BreakoutNoFrameskip-v4"
DEFAULT_STEPS = {"ppo": 61_440, "dqn": 15_000, "pqn": 61_440}
SPS_LINE = re.compile(r"^SPS:\s*(\d+)")
RETURN_LINE = re.compile(r"episodic_return=\[?\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


# ---- parsing (pure: tests/test_bench_peers.py) ----------------------------------------------


def rate(points: Sequence[tuple[float, int]]) -> float | None:
    """Steps/s between the first and the last (time, global_step) point, or None."""
    if len(points) < 2:
        return None
    (t0, s0), (t1, s1) = points[0], points[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


def peer_points(
    lines: Sequence[tuple[float, str]], step_of: Callable[[int], int]
) -> list[tuple[float, int]]:
    """The peer's `SPS:` lines as (arrival time, global step): the k-th (0-based) is at
    `step_of(k)`."""
    stamped = [t for t, line in lines if SPS_LINE.match(line)]
    return [(t, step_of(k)) for k, t in enumerate(stamped)]


def iteration_steps(rollout: int) -> Callable[[int], int]:
    """ppo/pqn_atari_envpool print `SPS:` once per iteration: the k-th after k+1 rollouts."""
    return lambda k: (k + 1) * rollout


def dqn_steps(learning_starts: int, train_frequency: int) -> Callable[[int], int]:
    """dqn_atari prints `SPS:` where global_step > learning_starts, a multiple of
    train_frequency and of 100."""
    every = math.lcm(100, train_frequency)
    first = (learning_starts // every + 1) * every
    return lambda k: first + k * every


def episode_returns(lines: Sequence[tuple[float, str]]) -> list[float]:
    """The returns of the `global_step=..., episodic_return=...` lines (dqn_atari prints the
    return in brackets)."""
    out = []
    for _, line in lines:
        m = RETURN_LINE.search(line)
        if m:
            out.append(float(m.group(1)))
    return out


def last_100_mean(returns: Sequence[float]) -> float | None:
    tail = list(returns)[-100:]
    return sum(tail) / len(tail) if tail else None


def progress_points(rows: Sequence[dict[str, str]], warmup: int) -> list[tuple[float, int]]:
    """rlsup's progress.csv rows at or past the warm-up step, as (time, global_step), one per
    step (a row written at a stop repeats the step before it)."""
    out: list[tuple[float, int]] = []
    for r in rows:
        step = int(r["global_step"])
        if step >= warmup and (not out or step > out[-1][1]):
            out.append((float(r["time"]), step))
    return out


# ---- the scratch venv -----------------------------------------------------------------------


def project_pins() -> list[str]:
    return [f"envpool=={metadata.version('envpool')}", "torch"]


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def peer_versions(python: Path) -> dict[str, str | None]:
    """The versions of what the peers import, as `python` finds them (None: not there)."""
    probe = (
        "import importlib.metadata as m, json\n"
        "def v(p):\n"
        "    try:\n"
        "        return m.version(p)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        f"print(json.dumps({{p: v(p) for p in {list(REPORTED)!r}}}))"
    )
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    versions: dict[str, str | None] = json.loads(out.stdout)
    return versions


def ensure_venv(venv: Path) -> None:
    """Make (or reuse) the scratch venv."""
    pins = [CLEANRL, *PEER_PINS, *project_pins()]
    marker = venv / "rlsup-bench.json"
    py = venv_python(venv)
    if not (marker.exists() and json.loads(marker.read_text()).get("pins") == pins):
        print(f"making the peers' scratch venv {venv} (once): {' '.join(pins)}", flush=True)
        if marker.exists():
            marker.unlink()
        log = venv.parent / f"{venv.name}.install.log"
        venv.parent.mkdir(parents=True, exist_ok=True)
        # `python -m venv` from the project's venv makes one from the same base interpreter.
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"],
            # cleanrl 1.2.0 says Python < 3.11 and pins gym-era packages: only its scripts are
            # wanted, and what they import comes next.
            [str(py), "-m", "pip", "install", "-q", "--no-deps", "--ignore-requires-python",
             CLEANRL],
            [str(py), "-m", "pip", "install", "-q", "-c", str(REPO / "constraints" /
             "cpu-torch.txt"), *PEER_PINS, *project_pins()],
        ]  # fmt: skip
        with log.open("w") as out:
            for cmd in steps:
                out.write(f"$ {' '.join(cmd)}\n")
                out.flush()
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
                if proc.returncode != 0:
                    tail = log.read_text()[-3000:]
                    raise SystemExit(f"scratch venv: {cmd[2:5]} failed (log {log}):\n{tail}")
        marker.write_text(json.dumps({"pins": pins}))


def cleanrl_script(python: Path, name: str) -> Path:
    where = "import cleanrl; print(list(cleanrl.__path__)[0])"  # a namespace package
    out = subprocess.run([str(python), "-c", where], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / name


def git_commit(path: Path) -> str | None:
    """The commit of the checkout whose top is `path`; None where `path` is no checkout's top
    (a copy of the scripts inside another repository is not that repository's commit)."""
    ask = ["git", "-C", str(path), "rev-parse", "--show-toplevel", "HEAD"]
    proc = subprocess.run(ask, capture_output=True, text=True, check=False)
    lines = proc.stdout.split()
    if proc.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != path.resolve():
        return None
    return lines[1]


# ---- the rows -------------------------------------------------------------------------------


@dataclass
class Row:
    algo: str
    steps: int
    warmup: int  # agent steps left out of the rate (rlsup's side)
    peer_script: Path | None
    peer_argv: list[str]
    peer_step_of: Callable[[int], int]
    rlsup_argv: list[str] | None  # None: not in this build
    settings: str
    skipped: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Worker:
    """What the rlsup tree that runs (`--rlsup-dir`) offers, asked of it in a child process
    (training.args is torch-free): its algorithms, learning-rate schedules and --help."""

    tree: Path
    algos: tuple[str, ...]
    lr_schedulers: tuple[str, ...]
    help: str

    @classmethod
    def ask(cls, tree: Path) -> Worker:
        probe = (
            "import json; from training import args as a\n"
            "print(json.dumps([list(a.ALGOS), list(getattr(a, 'LR_SCHEDULERS', ()))]))"
        )
        run = {"cwd": tree, "capture_output": True, "text": True, "check": True}
        algos, scheds = json.loads(subprocess.run([sys.executable, "-c", probe], **run).stdout)
        help_text = subprocess.run([sys.executable, "-m", "training.worker", "--help"], **run)
        return cls(tree, tuple(algos), tuple(scheds), help_text.stdout)

    def has(self, flag: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", self.help) is not None

    def linear_lr(self) -> list[str]:
        """CleanRL's linear anneal to 0 (ppo, pqn) where this worker has it, else nothing."""
        return (
            ["--lr-scheduler", "linear", "--min-lr", "0"] if "linear" in self.lr_schedulers else []
        )


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def lr_note(worker: Worker) -> str:
    if worker.linear_lr():
        return "annealed linearly to 0 (both)"
    return "(CleanRL anneals it linearly to 0; this rlsup has no linear schedule: constant)"


def ppo_row(args: argparse.Namespace, python: Path, worker: Worker) -> Row:
    envs, n_steps, minibatches, epochs = 8, 128, 4, 4
    rollout = envs * n_steps
    steps = round_up(args.steps or DEFAULT_STEPS["ppo"], rollout)
    return Row(
        algo="ppo",
        steps=steps,
        warmup=rollout,
        peer_script=cleanrl_script(python, "ppo_atari_envpool.py"),
        peer_argv=[
            "--env-id", PPO_GAME, "--total-timesteps", str(steps), "--num-envs", str(envs),
            "--num-steps", str(n_steps), "--num-minibatches", str(minibatches),
            "--update-epochs", str(epochs), "--learning-rate", "2.5e-4",
            "--cuda", str(args.device == "cuda"), "--track", "False", "--capture-video", "False",
        ],
        peer_step_of=iteration_steps(rollout),
        rlsup_argv=[
            "--algo", "ppo", "--game", PPO_GAME, "--num-envs", str(envs),
            "--n-steps", str(n_steps), "--batch-size", str(rollout // minibatches),
            "--epochs", str(epochs), "--learning-rate", "2.5e-4", "--gamma", "0.99",
            "--gae-lambda", "0.95", "--clip-coef", "0.1", "--ent-coef", "0.01",
            "--vf-coef", "0.5", "--max-grad-norm", "0.5", *worker.linear_lr(),
        ],
        settings=f"{PPO_GAME}, {envs} envs x {n_steps} steps, minibatch "
        f"{rollout // minibatches}, {epochs} epochs, lr 2.5e-4 {lr_note(worker)}",
    )  # fmt: skip


def vectorized_ratio(figures: dict[str, Any]) -> float | None:
    """rlsup's PQN steps/s over its DQN's (the vectorized Q-learner against the field's DQN),
    where both ran."""
    rates = [figures.get(a, {}).get("rlsup", {}).get("sps") for a in ("pqn", "dqn")]
    if not all(isinstance(r, int | float) and r > 0 for r in rates):
        return None
    return round(float(rates[0]) / float(rates[1]), 3)


def dqn_row(args: argparse.Namespace, python: Path, worker: Worker) -> Row:
    starts, freq, target, batch = 1_000, 4, 1_000, 32
    steps = args.steps or DEFAULT_STEPS["dqn"]
    eps = ["--start-e", "1", "--end-e", "0.01", "--exploration-fraction", "0.1"]
    batch_flag = "--dqn-batch-size" if worker.has("--dqn-batch-size") else "--batch-size"
    # dqn_atari's target is the target network's max (no Double DQN): the same algorithm
    nature = ["--no-double-q"] if worker.has("--double-q") else []
    return Row(
        algo="dqn",
        steps=steps,
        warmup=starts + 1,
        peer_script=cleanrl_script(python, "dqn_atari.py"),
        peer_argv=[
            "--env-id", DQN_PEER_GAME, "--total-timesteps", str(steps), "--num-envs", "1",
            "--batch-size", str(batch), "--train-frequency", str(freq),
            "--learning-starts", str(starts), "--target-network-frequency", str(target),
            "--buffer-size", str(args.buffer_size), "--learning-rate", "1e-4", *eps,
            "--cuda", str(args.device == "cuda"), "--track", "False", "--capture-video", "False",
        ],
        peer_step_of=dqn_steps(starts, freq),
        rlsup_argv=[
            "--algo", "dqn", "--game", PPO_GAME, "--num-envs", "1", batch_flag, str(batch),
            "--train-frequency", str(freq), "--learning-starts", str(starts),
            "--target-update-interval", str(target), "--buffer-size", str(args.buffer_size),
            "--learning-rate", "1e-4", "--gamma", "0.99", *eps, *nature,
        ],
        settings=f"peer {DQN_PEER_GAME} / rlsup {PPO_GAME}, 1 env, batch {batch} "
        f"(rlsup {batch_flag}), train every {freq}, learning starts {starts}, target every "
        f"{target}, buffer {args.buffer_size}, lr 1e-4, epsilon 1 -> 0.01 over 10 %, "
        f"{'max target (rlsup --no-double-q)' if nature else 'rlsup: Double DQN'}",
    )  # fmt: skip


def pqn_row(args: argparse.Namespace, worker: Worker) -> Row:
    envs, n_steps, minibatch, epochs, lam = 8, 128, 256, 2, 0.65
    rollout = envs * n_steps
    steps = round_up(args.steps or DEFAULT_STEPS["pqn"], rollout)
    settings = (
        f"{PPO_GAME}, {envs} envs x {n_steps} steps, minibatch {minibatch}, {epochs} epochs, "
        f"q_lambda {lam}, lr 2.5e-4 {lr_note(worker)}, epsilon 1 -> 0.01 over 10 %"
    )
    eps = ["--start-e", "1", "--end-e", "0.01", "--exploration-fraction", "0.1"]
    rlsup_argv: list[str] | None = None
    if "pqn" in worker.algos:
        rlsup_argv = [
            "--algo", "pqn", "--game", PPO_GAME, "--num-envs", str(envs),
            "--n-steps", str(n_steps), "--batch-size", str(minibatch), "--epochs", str(epochs),
            "--q-lambda", str(lam), "--learning-rate", "2.5e-4", "--gamma", "0.99",
            "--max-grad-norm", "10", *worker.linear_lr(), *eps,
        ]  # fmt: skip
    row = Row(
        algo="pqn",
        steps=steps,
        warmup=rollout,
        peer_script=None,
        peer_argv=[
            "--env-id", PPO_GAME, "--total-timesteps", str(steps), "--num-envs", str(envs),
            "--num-steps", str(n_steps), "--num-minibatches", str(rollout // minibatch),
            "--update-epochs", str(epochs), "--q-lambda", str(lam),
            "--learning-rate", "2.5e-4", *eps, "--cuda" if args.device == "cuda" else "--no-cuda",
            "--no-track", "--no-capture-video",
        ],
        peer_step_of=iteration_steps(rollout),
        rlsup_argv=rlsup_argv,
        settings=settings,
    )  # fmt: skip
    if args.peer_dir is None:
        row.skipped = "skipped: no --peer-dir"
    else:
        script = Path(args.peer_dir).resolve() / "cleanrl" / "pqn_atari_envpool.py"
        if script.exists():
            row.peer_script = script
        else:
            row.skipped = f"skipped: {script} not found"
    return row


# ---- running --------------------------------------------------------------------------------


def _pump(stream: TextIO, sink: list[tuple[float, str]]) -> None:
    for line in stream:
        sink.append((time.monotonic(), line.rstrip("\n")))


def run_peer(row: Row, seed: int, python: Path, threads: int, timeout_s: float) -> dict[str, Any]:
    assert row.peer_script is not None
    lines: list[tuple[float, str]] = []
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "WANDB_MODE": "disabled",
    }
    cmd = [str(python), "-W", "ignore", str(SHIM), str(row.peer_script),
           *row.peer_argv, "--seed", str(seed)]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rlsup-peer-") as tmp:  # its runs/ (TensorBoard)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
        reader.start()
        try:
            code: int | str = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = f"killed after the {timeout_s:.0f} s timeout"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(timeout=10)
        wall = time.monotonic() - t0
    if code != 0:
        tail = "\n".join(line for _, line in lines[-30:])
        what = f"peer exited {code}" if isinstance(code, int) else f"peer {code}"
        return {"error": what, "tail": tail, "wall_s": round(wall, 1)}
    returns = episode_returns(lines)
    points = peer_points(lines, row.peer_step_of)
    return {
        "sps": rate(points),
        "mean_last_100": last_100_mean(returns),
        "episodes": len(returns),
        "steps": points[-1][1] if points else None,
        "wall_s": round(wall, 1),
    }


def run_rlsup(
    row: Row,
    seed: int,
    tree: Path,
    threads: int,
    timeout_s: float,
    device: str = "cpu",
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    assert row.rlsup_argv is not None
    with tempfile.TemporaryDirectory(prefix="rlsup-peers-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "training.worker", *row.rlsup_argv,
            "--run-dir", str(run_dir), "--total-steps", str(row.steps), "--seed", str(seed),
            "--threads", str(threads), "--device", device, "--checkpoint-every-s", "600",
            "--eval-episodes", "0", *extra,
        ]  # fmt: skip
        t0 = time.monotonic()
        try:  # run() kills the worker on the timeout (and on any exception) before it raises
            proc = subprocess.run(
                cmd, cwd=tree, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
            return {"error": f"rlsup killed after the {timeout_s:.0f} s timeout",
                    "tail": err[-3000:], "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            return {"error": f"rlsup exited {proc.returncode}", "tail": proc.stderr[-3000:],
                    "wall_s": round(wall, 1)}  # fmt: skip
        rows = list(csv.DictReader((run_dir / "progress.csv").open()))
        hb = json.loads((run_dir / "heartbeat.json").read_text())
    points = progress_points(rows, row.warmup)
    return {
        "sps": rate(points),
        "mean_last_100": hb.get("mean_return"),
        "episodes": hb.get("episodes"),
        "steps": hb.get("global_step"),
        "precision": hb.get("precision"),
        "device": hb.get("device"),
        "wall_s": round(wall, 1),
    }


def fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def _rounded(v: Any) -> Any:
    return round(v, 3) if isinstance(v, float) else v


def summarize(row: Row) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": row.settings, "steps": row.steps}
    if row.skipped:
        return {**out, "skipped": row.skipped}
    for side in ("peer", "rlsup"):
        runs = [r[side] for r in row.runs if side in r]
        ok = [r for r in runs if "error" not in r]
        rates = [r["sps"] for r in ok if r["sps"] is not None]
        means = [r["mean_last_100"] for r in ok if r["mean_last_100"] is not None]
        out[side] = {
            "sps": round(statistics.median(rates), 1) if rates else None,
            "mean_last_100": round(statistics.mean(means), 3) if means else None,
            "episodes": [r["episodes"] for r in ok],
            "errors": [r["error"] for r in runs if "error" in r],
            "runs": [
                {
                    "seed": run["seed"],
                    "repeat": run["repeat"],
                    **{k: _rounded(v) for k, v in run[side].items() if k != "tail"},
                }
                for run in row.runs
                if side in run
            ],
        }
        if side == "rlsup":
            out[side]["precision"] = sorted({str(r.get("precision")) for r in ok})
    if row.rlsup_argv is None:
        out["rlsup"] = {"unavailable": "rlsup: pqn not available in this build"}
    p, r = out["peer"].get("sps"), out["rlsup"].get("sps")
    out["ratio"] = round(r / p, 4) if p and r else None
    return out


def read_earlier(path: Path) -> dict[str, Any]:
    """The JSON line an earlier run ended with (the file may hold its whole log)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"--peer-from {path}: no JSON line in it")
    data = json.loads(lines[-1])
    if data.get("benchmark") != "peers":
        raise SystemExit(f"--peer-from {path}: not a peers run's JSON")
    return dict(data)


def earlier_peer_run(
    earlier: dict[str, Any] | None, row: Row, seed: int, repeat: int
) -> dict[str, Any] | None:
    """The earlier run's peer run for this row, seed and repeat, where its row measured the
    same number of steps; None to run it."""
    if earlier is None:
        return None
    old = earlier.get("rows", {}).get(row.algo, {})
    if old.get("steps") != row.steps or "peer" not in old:
        return None
    for run in old["peer"].get("runs", []):
        if run.get("seed") == seed and run.get("repeat") == repeat and "error" not in run:
            found = {k: v for k, v in run.items() if k not in ("seed", "repeat")}
            return {**found, "tail": "", "reused": True}
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="ppo,dqn,pqn")
    parser.add_argument(
        "--steps", type=int, default=None,
        help=f"agent steps per run, every row (default: {DEFAULT_STEPS}; ppo/pqn round up to "
        "whole rollouts)",
    )  # fmt: skip
    parser.add_argument("--peer-dir", default=None, help="a CleanRL checkout (for pqn)")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=1, help="runs per side per seed")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the peers' scratch venv")
    parser.add_argument("--buffer-size", type=int, default=100_000, help="dqn replay, both sides")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="both sides")
    parser.add_argument(
        "--rlsup-args", default="",
        help="more flags for rlsup's worker, e.g. '--compile reduce-overhead' (in the JSON)",
    )  # fmt: skip
    parser.add_argument(
        "--peer-python", type=Path, default=None,
        help="an interpreter that holds the peers' packages (no scratch venv is made)",
    )  # fmt: skip
    parser.add_argument(
        "--peer-from", type=Path, default=None,
        help="an earlier run's JSON line (or a file ending in one): its peer runs are reused",
    )  # fmt: skip
    parser.add_argument(
        "--rlsup-dir", type=Path, default=REPO,
        help="the rlsup tree whose worker runs (default: this one; the same venv runs it)",
    )  # fmt: skip
    args = parser.parse_args()
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = sorted(set(algos) - set(DEFAULT_STEPS))
    if unknown:
        parser.error(f"--algos: unknown {', '.join(unknown)} (ppo, dqn, pqn)")
    seeds = [int(s) for s in args.seeds.split(",")]
    venv = args.venv.expanduser()

    print(host_line(), flush=True)
    if args.peer_python is None:
        ensure_venv(venv)
        python = venv_python(venv)
        peers_from = f"{CLEANRL} from PyPI in {venv}"
    else:
        python = args.peer_python.absolute()  # the peers run from a scratch cwd (not resolve():
        # a venv's python is a link that must stay one)
        peers_from = f"the packages of {python}"
    versions = peer_versions(python)
    worker = Worker.ask(args.rlsup_dir.resolve())
    peer_commit = git_commit(Path(args.peer_dir)) if args.peer_dir else None
    rlsup_commit = git_commit(worker.tree)
    print(f"peers: {peers_from} (" + ", ".join(f"{k} {v}" for k, v in versions.items()) + ")")
    if args.peer_dir:
        print(f"pqn peer: {Path(args.peer_dir).resolve()} at commit {peer_commit}")
    commit = rlsup_commit or "- (not a git checkout)"
    where = "CPU" if args.device == "cpu" else "CUDA"
    print(f"rlsup: {worker.tree} at commit {commit}; {args.threads} thread(s) per run, {where}")

    builders = {
        "ppo": lambda: ppo_row(args, python, worker),
        "dqn": lambda: dqn_row(args, python, worker),
        "pqn": lambda: pqn_row(args, worker),
    }
    rows = [builders[a]() for a in algos]
    earlier = read_earlier(args.peer_from) if args.peer_from else None
    # The peers' envpool steps on its own default threads (one per env, up to the cores);
    # rlsup's envs get the same where its worker has --env-threads (its --threads stays torch's).
    env_threads = ["--env-threads", "0"] if worker.has("--env-threads") else []
    if args.peer_from:
        print(f"peers: runs reused from {args.peer_from} where it has them")
    for row in rows:
        if row.skipped:
            print(f"{row.algo}: {row.skipped}", flush=True)
            continue
        if row.rlsup_argv is None:
            print(f"{row.algo}: rlsup: {row.algo} not available in this build", flush=True)
        for seed in seeds:
            for rep in range(max(1, args.repeats)):
                sides = ["peer", "rlsup"] if rep % 2 == 0 else ["rlsup", "peer"]
                run: dict[str, Any] = {"seed": seed, "repeat": rep}
                for side in sides:
                    reused = earlier_peer_run(earlier, row, seed, rep) if side == "peer" else None
                    if reused is not None:
                        run[side] = reused
                    elif side == "peer":
                        run[side] = run_peer(row, seed, python, args.threads, args.timeout_s)
                    elif row.rlsup_argv is not None:
                        run[side] = run_rlsup(
                            row, seed, worker.tree, args.threads, args.timeout_s, args.device,
                            [*env_threads, *shlex.split(args.rlsup_args)],
                        )  # fmt: skip
                    else:
                        continue
                    r = run[side]
                    what = (
                        r["error"] + ":\n" + r["tail"]
                        if "error" in r
                        else f"{fmt(r['sps'])} steps/s, last-100 mean "
                        f"{fmt(r['mean_last_100'], '.2f')} ({r['episodes']} episodes), "
                        f"{r['steps']} steps"
                    )
                    print(f"{row.algo} seed {seed} #{rep} {side}: {what}, {r['wall_s']} s",
                          flush=True)  # fmt: skip
                row.runs.append(run)

    figures = {row.algo: summarize(row) for row in rows}
    print(f"\n{host_line()}; {args.device}; {args.threads} thread(s); seeds {args.seeds}, "
          f"{max(1, args.repeats)} run(s) per side per seed")  # fmt: skip
    head = f"{'algo':<5}{'steps':>8}{'peer steps/s':>14}{'rlsup steps/s':>15}{'rlsup/peer':>12}"
    print(head + f"{'peer last-100':>15}{'rlsup last-100':>16}")
    for row in rows:
        f = figures[row.algo]
        if "skipped" in f:
            print(f"{row.algo:<5}{row.steps:>8}  {f['skipped']}")
            continue
        p, r = f["peer"], f["rlsup"]
        if "unavailable" in r:
            rl_sps, rl_ret = "n/a", "n/a"
        else:
            rl_sps, rl_ret = fmt(r["sps"]), fmt(r["mean_last_100"], ".2f")
        print(
            f"{row.algo:<5}{row.steps:>8}{fmt(p['sps']):>14}{rl_sps:>15}"
            f"{fmt(f['ratio'], '.2f'):>12}{fmt(p['mean_last_100'], '.2f'):>15}{rl_ret:>16}"
        )
    pqn_over_dqn = vectorized_ratio(figures)
    if pqn_over_dqn is not None:
        print(f"rlsup PQN / rlsup DQN, each at its settings: {pqn_over_dqn:.2f}x agent steps/s")
    for row in rows:
        f = figures[row.algo]
        note = f["rlsup"].get("unavailable") if "rlsup" in f else None
        print(f"  {row.algo}: {row.settings}" + (f"; {note}" if note else ""))
    print(host_line())
    print(
        json.dumps(
            {
                "benchmark": "peers",
                "threads": args.threads,
                "device": args.device,
                "rlsup_args": args.rlsup_args,
                "rlsup_env_threads": " ".join(env_threads) or None,
                "peer_from": str(args.peer_from) if args.peer_from else None,
                "seeds": seeds,
                "repeats": max(1, args.repeats),
                "peer_venv": str(venv) if args.peer_python is None else None,
                "peer_python": str(python),
                "peer_versions": versions,
                "pqn_peer_dir": str(Path(args.peer_dir).resolve()) if args.peer_dir else None,
                "pqn_peer_commit": peer_commit,
                "rlsup_dir": str(worker.tree),
                "rlsup_commit": rlsup_commit,
                "rows": figures,
                "rlsup_pqn_over_dqn": pqn_over_dqn,
                "host": host_facts(),
            }
        )
    )


if __name__ == "__main__":
    main()
