"""Several hosts: how long from a host's death until its game trains again on another host,
and from a worker's SIGKILL on a Ray host until it trains again, against the single-host
recovery (a SIGKILLed worker restarted in place, cold and from the spare) measured in the same
run on the same machine.

    python benchmarks/ray_recovery.py [--rounds 5] [--no-spare]

Ray: a loopback cluster (a head that places nothing and two hosts, each its own raylet and run
dir; short health checks), a real SeaweedFS mirror, one CartPole DQN game under `rlsup run
--backend ray` with `[spare] enabled = true` (each host keeps a spare in an actor of its own;
`--no-spare`: every start cold, the figures before the hosts' spares). Worker rounds SIGKILL the
game's worker on its host once every host's spare is ready; host rounds wait until the game
trains and has mirrored a checkpoint of its current placement, kill its host (every process of
that node SIGKILLed), and time until the heartbeat of the moved worker says `training` (it has
restored the mirrored checkpoint, built its learner, and is about to take its first step; read
on its host: the supervisor's relayed copy lags by up to a tick); then a fresh host joins for
the next round. Single host: the same game under `rlsup run` on this
host, each round SIGKILLs the worker and times until its replacement's heartbeat says
`training`, once with `[spare] enabled = false` (cold) and once with it true. Ends with one
JSON line.
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

from harness.ray_cluster import LoopbackCluster, loopback_cluster, python_env  # noqa: E402
from harness.runs import (  # noqa: E402
    env_for,
    events,
    heartbeat,
    spare_ready_now,
    start_supervisor,
    stop_supervisor,
    wait_for,
)
from harness.seaweed import TEST_AWS_ENV, running_weed  # noqa: E402

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


CHECKPOINT_EVERY_S = [1.0]  # --checkpoint-every-s


def _common() -> str:
    every = f"checkpoint_every_s = {CHECKPOINT_EVERY_S[0]:g}\n"
    return COMMON.replace("checkpoint_every_s = 1\n", every)


def _placements(state: Path) -> list[dict[str, Any]]:
    return [
        e["detail"]
        for e in events(state, None, "g1")
        if e["detail"].get("to") == "starting" and "pid" in e["detail"]
    ]


def _training(state: Path, pid: int) -> dict[str, Any] | None:
    hb = heartbeat(state, "g1")
    return hb if hb and hb["pid"] == pid and hb["phase"] == "training" else None


def _training_on(lc: LoopbackCluster, host: str, pid: int) -> dict[str, Any] | None:
    """The worker's own heartbeat on its host (the supervisor's relayed copy lags by up to a
    tick): `training` once it has loaded its checkpoint and built its learner."""
    try:
        hb = json.loads((lc.node_dir(host) / "runs" / "g1" / "heartbeat.json").read_text())
    except (OSError, ValueError):
        return None
    return hb if hb.get("pid") == pid and hb.get("phase") == "training" else None


def ray_rounds(tmp: Path, rounds: int, spare: bool) -> tuple[list[float], list[float]]:
    """(worker SIGKILL rounds, host death rounds) on a loopback cluster."""
    from checkpoints.remote import RemoteLocation, RemoteStore, make_client

    tmp.mkdir(parents=True)
    env = env_for(tmp, **TEST_AWS_ENV, RAY_USAGE_STATS_ENABLED="0")
    os.environ.update(TEST_AWS_ENV)
    kills: list[float] = []
    deaths: list[float] = []
    with (
        running_weed(tmp / "weed") as weed,
        loopback_cluster(tmp / "hosts", ["h1", "h2"], python_env(env)) as lc,
    ):
        url = "s3://rlsup-bench/ray-recovery"
        remote = RemoteStore(make_client(weed.endpoint, "us-east-1"), RemoteLocation.parse(url))
        remote.ensure_bucket()
        config = tmp / "ray.toml"
        config.write_text(
            _common()
            + _spare_table(spare)
            + f'[mirror]\nurl = "{url}"\nendpoint_url = "{weed.endpoint}"\nkeep = 3\n'
            + f'[cluster]\nbackend = "ray"\naddress = "{lc.address}"\nhost_lost_after_s = 15\n'
        )
        state = tmp / "state"
        sup = start_supervisor(config, env)
        n = 0  # placements so far
        try:
            for i in range(rounds):
                kills.append(_one_worker_round(lc, state, n, spare))
                n += 1
                print(f"ray worker round {i + 1}: {kills[-1]:.2f} s", flush=True)
            for i in range(rounds):
                deaths.append(_one_ray_round(lc, state, remote, n, spare))
                n += 1
                print(f"ray host round {i + 1}: {deaths[-1]:.2f} s", flush=True)
                lc.add_host(f"h{i + 3}")  # a host for the next round
        finally:
            stop_supervisor(sup)
    return kills, deaths


def _one_worker_round(lc: LoopbackCluster, state: Path, i: int, spare: bool) -> float:
    from harness.ray_cluster import worker_processes

    placed = wait_for(lambda: _placements(state)[i:], 180, f"placement {i + 1}")[0]
    wait_for(lambda: _training(state, placed["pid"]), 180, "training")
    if spare:
        wait_for(lambda: all(spare_ready_now(state, h) for h in lc.nodes), 180, "every spare")
    time.sleep(3)  # a checkpoint or two, as in the single-host rounds
    [proc] = worker_processes(lc.root, "g1")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGKILL)
    again = wait_for(lambda: _placements(state)[i + 1 :], 180, "restarted", poll=0.05)[0]
    wait_for(lambda: _training_on(lc, again["host"], again["pid"]), 180, "training", poll=0.05)
    return time.monotonic() - t0


def _spare_table(spare: bool) -> str:
    return f"[spare]\nenabled = {'true' if spare else 'false'}\n"


def _one_ray_round(lc: LoopbackCluster, state: Path, remote: Any, i: int, spare: bool) -> float:
    placed = wait_for(lambda: _placements(state)[i:], 180, f"placement {i + 1}")[0]
    wait_for(lambda: _training(state, placed["pid"]), 180, "training")
    start_step = heartbeat(state, "g1")["global_step"]  # type: ignore[index]
    wait_for(
        lambda: (s := remote.manifest_steps("g1")) and s[-1] > start_step, 180, "a mirrored ckpt"
    )
    if spare:
        others = [h for h in lc.nodes if h != placed["host"]]
        wait_for(
            lambda: all(spare_ready_now(state, h) for h in others), 180, "the other hosts' spares"
        )
    t0 = time.monotonic()
    lc.kill_host(placed["host"])
    moved = wait_for(lambda: _placements(state)[i + 1 :], 180, "placed again", poll=0.05)[0]
    wait_for(lambda: _training_on(lc, moved["host"], moved["pid"]), 180, "training", poll=0.05)
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


def local_rounds(tmp: Path, rounds: int, spare: bool) -> list[float]:
    tmp.mkdir(parents=True)
    env = env_for(tmp)
    config = tmp / "local.toml"
    config.write_text(_common() + _spare_table(spare))
    state = tmp / "state"
    sup = start_supervisor(config, env)
    times: list[float] = []
    try:
        for i in range(rounds):
            if spare:
                wait_for(lambda: spare_ready_now(state), 180, "the spare ready")
            times.append(_one_local_round(state, i))
            side = "spare" if spare else "cold"
            print(f"single-host round {i + 1} ({side}): {times[-1]:.2f} s", flush=True)
    finally:
        stop_supervisor(sup)
    return times


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(xs), 2), "worst_s": round(max(xs), 2)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-spare", action="store_true", help="Ray hosts keep no spare")
    parser.add_argument(
        "--checkpoint-every-s",
        type=float,
        default=1.0,
        help="the games' checkpoint interval: at 1 s a kill on a Ray host mostly waits for the "
        "upload of the checkpoint committed just before it (its final mirror pass)",
    )
    args = parser.parse_args()
    CHECKPOINT_EVERY_S[0] = args.checkpoint_every_s
    spare = not args.no_spare
    with tempfile.TemporaryDirectory(prefix="rlsup-bench-ray-") as d:
        cold = local_rounds(Path(d) / "local-cold", args.rounds, spare=False)
        warm = local_rounds(Path(d) / "local-spare", args.rounds, spare=True)
        kills, deaths = ray_rounds(Path(d) / "ray", args.rounds, spare)
    med = statistics.median
    out = {
        "rounds": args.rounds,
        "ray_spare": spare,
        "checkpoint_every_s": args.checkpoint_every_s,
        "single_host_cold": _stats(cold),
        "single_host_spare": _stats(warm),
        "ray_worker_kill": _stats(kills),
        "ray_host_death": _stats(deaths),
        "host_death_vs_single_host_cold": round(med(deaths) / med(cold), 2),
        "ray_worker_kill_vs_single_host_spare": round(med(kills) / med(warm), 2),
        "ray_worker_kill_vs_single_host_cold": round(med(kills) / med(cold), 2),
    }
    side = "with a spare on every host" if spare else "no spare on the hosts"
    print(
        f"single host, worker SIGKILL -> training again: cold median {med(cold):.2f} s "
        f"(worst {max(cold):.2f}), from the spare {med(warm):.2f} s (worst {max(warm):.2f})\n"
        f"several hosts ({side}): worker SIGKILL -> training again: median {med(kills):.2f} s "
        f"(worst {max(kills):.2f}; {out['ray_worker_kill_vs_single_host_spare']}x the single "
        f"host's spare, {out['ray_worker_kill_vs_single_host_cold']}x its cold restart)\n"
        f"several hosts ({side}): host death -> training on another host: median "
        f"{med(deaths):.2f} s (worst {max(deaths):.2f}; "
        f"{out['host_death_vs_single_host_cold']}x the single host's cold restart; target <= 1.2x)"
    )
    print(host_line())
    print(json.dumps({**out, "host": host_facts()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
