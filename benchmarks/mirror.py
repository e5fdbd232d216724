"""The checkpoint mirror's cost to training, and what an incremental checkpoint uploads.

    python benchmarks/mirror.py [--seconds 60] [--rounds 2]

One DQN worker (CartPole, a replay buffer, a checkpoint every 5 s) under `rlsup run`, with
[mirror] off and on (a real SeaweedFS on loopback), rounds alternating to spread drift in the
machine's load; steps/s are read from progress.csv after the first row. From the `mirror_ok`
events: bytes uploaded per checkpoint after the first against the checkpoint's full size.
Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from hostinfo import host_facts, host_line  # noqa: E402

from benchmarks.supervision_overhead import rate  # noqa: E402
from harness.seaweed import TEST_AWS_ENV, running_weed  # noqa: E402

CONFIG = """
state_dir = "{state_dir}"
initial_mode = "light"
checkpoint_every_s = 5
stop_grace_s = 30
[modes.light]
num_envs = 8
batch_size = 128
n_steps = 128
max_concurrent = 1
[[games]]
name = "bench"
env_id = "CartPole-v1"
algo = "dqn"
total_steps = 1_000_000_000
seed = 1
[games.args]
eval_episodes = 0
buffer_size = 400_000
learning_starts = 2000
replay_chunk_kib = 512
[stability]
ceiling = "light"
"""


def run(tmp: Path, seconds: float, mirror: str) -> tuple[float, list[dict[str, float]]]:
    state_dir = tmp / "state"
    config = tmp / "rlsup.toml"
    config.write_text(CONFIG.format(state_dir=state_dir) + mirror)
    env = {**os.environ, **TEST_AWS_ENV, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "supervisor.cli", "run", "--config", str(config)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(seconds)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    conn = sqlite3.connect(state_dir / "rlsup.db")
    uploads = [
        json.loads(d) for (d,) in conn.execute("SELECT detail FROM events WHERE kind='mirror_ok'")
    ]
    conn.close()
    return rate(state_dir / "runs" / "bench" / "progress.csv"), uploads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    off, on, uploads = [], [], []
    os.environ.update(TEST_AWS_ENV)  # SeaweedFS on loopback takes any credentials
    with tempfile.TemporaryDirectory() as weed_dir, running_weed(Path(weed_dir)) as weed:
        for r in range(args.rounds):
            mirror = f'[mirror]\nurl = "s3://rlsup-bench/r{r}"\nendpoint_url = "{weed.endpoint}"\n'
            for which in ("off", "on") if r % 2 == 0 else ("on", "off"):  # order alternates
                with tempfile.TemporaryDirectory() as tmp:
                    sps, ups = run(Path(tmp), args.seconds, mirror if which == "on" else "")
                if which == "off":
                    off.append(sps)
                else:
                    on.append(sps)
                    uploads += ups[1:]  # the first upload of a run is a full one
            print(f"round {r + 1}: mirror off {off[-1]:.0f} steps/s, on {on[-1]:.0f} steps/s")
    b, m = statistics.median(off), statistics.median(on)
    sent = [u["bytes_uploaded"] for u in uploads]
    full = [u["bytes_uploaded"] + u["bytes_present"] for u in uploads]
    frac = sum(sent) / sum(full) if full and sum(full) else float("nan")
    print(f"{'what':<44}{'figure':>14}{'ratio':>8}")
    print(f"{'agent steps/s, mirror off':<44}{b:>14.0f}{1.0:>8.2f}")
    print(f"{'agent steps/s, mirror on':<44}{m:>14.0f}{m / b:>8.3f}")
    if full:
        print(f"{'bytes sent per incremental checkpoint':<44}"
              f"{statistics.median(sent):>14,.0f}{frac:>8.3f}")  # fmt: skip
        print(
            f"{'full checkpoint size (baseline)':<44}{statistics.median(full):>14,.0f}{1.0:>8.2f}"
        )
    print(host_line())
    print(json.dumps({
        "benchmark": "mirror",
        "host": host_facts(),
        "cores": os.cpu_count(),
        "off_sps": round(b, 1),
        "on_sps": round(m, 1),
        "ratio": round(m / b, 4),
        "incremental_uploads": len(uploads),
        "incremental_bytes_median": statistics.median(sent) if sent else None,
        "full_bytes_median": statistics.median(full) if full else None,
        "uploaded_fraction": round(frac, 4) if full else None,
        "rounds": args.rounds,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
