"""The sweep of tests/sweep/test_sweep_e2e.py (12 CartPole trials, 2 seeds each, TPE, median
pruner) on a real loopback Ray cluster of two hosts with a real mirror: its trials spread over
both hosts like games, one host is killed while trials train there, and its trial runs resume
on the other host from the mirror with their own values; every trial ends complete or pruned,
each told once, and `rlsup results --sweep` ranks them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.ray_cluster import LoopbackCluster
from harness.runs import events, heartbeat, query, rlsup, start_supervisor, wait_for
from harness.seaweed import Weed
from tests.mirror.conftest import BUCKET, prefix_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]
pytest.importorskip("ray", reason="the ray extra (make test installs it)")

TRIALS, SEEDS, TOTAL = 12, (1, 2), 8192
RUNS = [f"cart/t{t:03d}/s{s}" for t in range(TRIALS) for s in SEEDS]


def config_text(lc: LoopbackCluster, weed: Weed, url: str) -> str:
    return f"""\
state_dir = "state"
checkpoint_every_s = 1
stop_grace_s = 20
tick_s = 0.5
[modes.light]
num_envs = 4
batch_size = 64
n_steps = 64
max_concurrent = 2
[[games]]
name = "cart"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = {TOTAL}
seeds = {list(SEEDS)}
device = "cpu"
args = {{ eval_every_steps = 2048, eval_episodes = 3, checkpoint_every_steps = 1024 }}
[games.sweep]
trials = {TRIALS}
pruner = "median"
min_trials = 3
seed = 7
params = {{ learning_rate = {{ low = 3e-4, high = 3e-3, log = true }}, epochs = [2, 4] }}
[restart]
backoff_base_s = 0.3
backoff_max_s = 1
budget = 10
budget_window_s = 600
[watchdog]
startup_grace_s = 120
hang_timeout_s = 60
[mirror]
url = "{url}"
endpoint_url = "{weed.endpoint}"
keep = 3
[cluster]
backend = "ray"
address = "{lc.address}"
host_lost_after_s = 15
"""


def test_a_sweep_spreads_over_the_hosts_and_survives_one_s_death(
    two_hosts: LoopbackCluster,
    weed: Weed,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    ray_env: dict[str, str],
) -> None:
    lc = two_hosts
    url = f"s3://{BUCKET}/{prefix_for(request)}"
    config = tmp_path / "rlsup.toml"
    config.write_text(config_text(lc, weed, url))
    state = tmp_path / "state"
    sup = start_supervisor(config, ray_env, "--exit-when-done")
    try:
        # A trial run training on some host past a checkpoint: that host dies.
        def victim() -> tuple[str, str] | None:
            for run in RUNS:
                hb = heartbeat(state, run) or {}
                trains = hb.get("phase") == "training" and (hb.get("last_checkpoint_step") or 0)
                if trains and hb["global_step"] < TOTAL - 2048 and hb.get("host"):
                    return run, str(hb["host"])
            return None

        run, host = wait_for(victim, 240, "a trial run training past a checkpoint on a host")
        lc.kill_host(host)
        assert sup.wait(480) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.terminate()
            sup.wait(60)
    hosts = {e["detail"]["host"] for e in events(state) if "host" in e["detail"]
             and e["kind"] == "worker_start"}  # fmt: skip
    assert hosts == {"h1", "h2"}, "the trials spread over both hosts"
    lost = events(state, "node_lost")
    assert [e["detail"]["host"] for e in lost] == [host]
    # The run on the dead host moved (no crash counted) and resumed, never from zero.
    starts = [e["detail"] for e in events(state, None, run) if e["detail"].get("to") == "starting"]
    assert len(starts) >= 2 and starts[-1]["host"] != host, starts
    exits = [e["detail"]["exit"] for e in events(state, "worker_exit", run)]
    assert "host_lost" in exits, exits
    rows = {r["game"]: r["state"] for r in query(state, "SELECT game, state FROM workers")}
    assert {r: rows[r] for r in RUNS} == dict.fromkeys(RUNS, "done")
    import optuna

    study = optuna.load_study(study_name="cart", storage=f"sqlite:///{state}/sweeps/cart.db")
    assert len(study.trials) == TRIALS
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}
    ended = sorted(e["detail"]["trial"] for e in events(state, "sweep_trial"))
    assert ended == list(range(TRIALS))
    out = rlsup("results", "--sweep", "cart", "--json", "--config", str(config), env=ray_env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["best"] == study.best_trial.number and doc["trials"][0]["rank"] == 1
