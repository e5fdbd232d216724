"""Several hosts: how long from a host's death until its game trains again on another host,
against the single-host recovery (a SIGKILLed worker restarted in place) measured in the same
run on the same machine.

    python benchmarks/ray_recovery.py [--rounds 5]

Ray: a loopback cluster (a head that places nothing and two hosts, each its own raylet and run
dir; short health checks), a real SeaweedFS mirror, one CartPole DQN game under `rlsup run
--backend ray`. Each round waits until the game trains and has mirrored a checkpoint of its
current placement, kills its host (every process of that node SIGKILLed), and times until the
heartbeat of the moved worker says `training` (it has restored the mirrored checkpoint, built
its learner, and is about to take its first step); then a fresh host joins for the next round.
Single host: the same game under `rlsup run` on this host; each round SIGKILLs the worker and
times until its replacement's heartbeat says `training`. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hostinfo import host_facts, host_line  # noqa: E402

from tests.cluster.ray_cluster import LoopbackCluster, loopback_cluster, python_env  # noqa: E402
from tests.mirror.conftest import TEST_AWS_ENV  # noqa: E402
from tests.mirror.seaweed import running_weed  # noqa: E402
from tests.supervisor.helpers import (  # noqa: E402
    env_for,
    events,
    heartbeat,
    start_supervisor,
    stop_supervisor,
    wait_for,
)

GAME = (
    '[[games]]\nname = "g1"\nenv_id = "CartPole-v1"\nalgo = "dqn"\ntotal_steps = 50000000\n'
    'seed = 1\ndevice = "cpu"\nargs = { eval_episodes = 0, buffer_size = 5000, '
    "learning_starts = 500, replay_chunk_kib = 64 }\n"
)
COMMON = (
    'state_dir = "state"\ncheckpoint_every_s = 1\nstop_grace_s = 30\ntick_s = 0.5\n'
    "[modes.light]\nnum_envs = 4\nbatch_size = 64\nn_steps = 64\nmax_concurrent = 4\n"
    + GAME
    + "[restart]\nbackoff_base_s = 0.3\nbackoff_max_s = 1\nbudget = 100\n"
    "budget_window_s = 3600\nstable_after_s = 5\n"
    "[watchdog]\nstartup_grace_s = 120\nhang_timeout_s = 60\nkill_grace_s = 10\n"
)


def _placements(state: Path) -> list[dict[str, Any]]:
    return [
        e["detail"]
        for e in events(state, None, "g1")
        if e["detail"].get("to") == "starting" and "pid" in e["detail"]
    ]


def _training(state: Path, pid: int) -> dict[str, Any] | None:
    hb = heartbeat(state, "g1")
    return hb if hb and hb["pid"] == pid and hb["phase"] == "training" else None


def ray_rounds(tmp: Path, rounds: int) -> list[float]:
    from checkpoints.remote import RemoteLocation, RemoteStore, make_client

    tmp.mkdir(parents=True)
    env = env_for(tmp, **TEST_AWS_ENV, RAY_USAGE_STATS_ENABLED="0")
    os.environ.update(TEST_AWS_ENV)
    times: list[float] = []
    with (
        running_weed(tmp / "weed") as weed,
        loopback_cluster(tmp / "hosts", ["h1", "h2"], python_env(env)) as lc,
    ):
        url = "s3://rlsup-bench/ray-recovery"
        remote = RemoteStore(make_client(weed.endpoint, "us-east-1"), RemoteLocation.parse(url))
        remote.ensure_bucket()
        config = tmp / "ray.toml"
        config.write_text(
            COMMON
            + f'[mirror]\nurl = "{url}"\nendpoint_url = "{weed.endpoint}"\nkeep = 3\n'
            + f'[cluster]\nbackend = "ray"\naddress = "{lc.address}"\nhost_lost_after_s = 15\n'
        )
        state = tmp / "state"
        sup = start_supervisor(config, env)
        try:
            for i in range(rounds):
                times.append(_one_ray_round(lc, state, remote, i))
                print(f"ray round {i + 1}: {times[-1]:.2f} s", flush=True)
                lc.add_host(f"h{i + 3}")  # a spare for the next round
        finally:
            stop_supervisor(sup)
    return times


def _one_ray_round(lc: LoopbackCluster, state: Path, remote: Any, i: int) -> float:
    placed = wait_for(lambda: _placements(state)[i:], 180, f"placement {i + 1}")[0]
    wait_for(lambda: _training(state, placed["pid"]), 180, "training")
    start_step = heartbeat(state, "g1")["global_step"]  # type: ignore[index]
    wait_for(
        lambda: (s := remote.manifest_steps("g1")) and s[-1] > start_step, 180, "a mirrored ckpt"
    )
    t0 = time.monotonic()
    lc.kill_host(placed["host"])
    moved = wait_for(lambda: _placements(state)[i + 1 :], 180, "placed again")[0]
    wait_for(lambda: _training(state, moved["pid"]), 180, "training again", poll=0.05)
    return time.monotonic() - t0


def _one_local_round(state: Path, i: int) -> float:
    placed = wait_for(lambda: _placements(state)[i:], 180, f"start {i + 1}")[0]
    wait_for(lambda: _training(state, placed["pid"]), 180, "training")
    time.sleep(3)  # a checkpoint or two, as in the Ray rounds
    t0 = time.monotonic()
    os.kill(placed["pid"], signal.SIGKILL)
    again = wait_for(lambda: _placements(state)[i + 1 :], 180, "restarted")[0]
    wait_for(lambda: _training(state, again["pid"]), 180, "training again", poll=0.05)
    return time.monotonic() - t0


def local_rounds(tmp: Path, rounds: int) -> list[float]:
    tmp.mkdir(parents=True)
    env = env_for(tmp)
    config = tmp / "local.toml"
    config.write_text(COMMON)
    state = tmp / "state"
    sup = start_supervisor(config, env)
    times: list[float] = []
    try:
        for i in range(rounds):
            times.append(_one_local_round(state, i))
            print(f"single-host round {i + 1}: {times[-1]:.2f} s", flush=True)
    finally:
        stop_supervisor(sup)
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlsup-bench-ray-") as d:
        local = local_rounds(Path(d) / "local", args.rounds)
        ray = ray_rounds(Path(d) / "ray", args.rounds)
    out = {
        "rounds": args.rounds,
        "single_host_median_s": round(statistics.median(local), 2),
        "single_host_worst_s": round(max(local), 2),
        "host_death_median_s": round(statistics.median(ray), 2),
        "host_death_worst_s": round(max(ray), 2),
        "ratio_median": round(statistics.median(ray) / statistics.median(local), 2),
    }
    print(
        f"single host (worker SIGKILL -> training again): median {out['single_host_median_s']} "
        f"s, worst {out['single_host_worst_s']} s\n"
        f"several hosts (host death -> training on another host): median "
        f"{out['host_death_median_s']} s, worst {out['host_death_worst_s']} s "
        f"({out['ratio_median']}x the single-host median)"
    )
    print(host_line())
    print(json.dumps({**out, "host": host_facts()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
