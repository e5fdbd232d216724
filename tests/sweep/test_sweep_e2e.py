"""A 12-trial CartPole sweep (two parameters, 2 seeds a trial, TPE, median pruner) under a real
`rlsup run` while the test SIGKILLs the supervisor and every worker three times at random
moments and once fakes a host reboot (a new boot id): every trial ends complete or pruned, none
ran twice or from zero after its first checkpoint, the study's trials and best value match a
ledger the test keeps from the runs' own files, and `rlsup results --sweep` ranks them."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.runs import (
    env_for,
    events,
    heartbeat,
    kill_quietly,
    query,
    rlsup,
    start_supervisor,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

TRIALS, SEEDS, TOTAL = 12, (1, 2), 12288

CONFIG = f"""\
state_dir = "state"
checkpoint_every_s = 1
stop_grace_s = 10
initial_mode = "light"
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
sampler = "tpe"
pruner = "median"
min_trials = 3
seed = 7
params = {{ learning_rate = {{ low = 3e-4, high = 3e-3, log = true }}, epochs = [2, 4] }}
[restart]
backoff_base_s = 0.2
backoff_max_s = 1
budget = 20
budget_window_s = 600
[watchdog]
startup_grace_s = 90
hang_timeout_s = 30
"""

RUNS = [f"cart/t{t:03d}/s{s}" for t in range(TRIALS) for s in SEEDS]


class Watch:
    """Samples every run's heartbeat: each life's (pid) resumed step, and the newest
    committed checkpoint seen before that life started."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.lives: dict[str, dict[int, dict[str, Any]]] = {r: {} for r in RUNS}
        self.committed: dict[str, int] = dict.fromkeys(RUNS, 0)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for run in RUNS:
                hb = heartbeat(self.state, run)
                if not hb or hb.get("phase") != "training":
                    continue
                life = self.lives[run].setdefault(
                    int(hb["pid"]),
                    {
                        "resumed": hb.get("resumed_from_step") or 0,
                        "floor": self.committed[run],
                    },
                )
                life["step"] = hb.get("global_step")
                ckpt = hb.get("last_checkpoint_step") or 0
                self.committed[run] = max(self.committed[run], ckpt)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


def _kill_everything(sup: Any) -> None:
    """SIGKILL the supervisor and every process under it (its workers, its spare)."""
    import psutil

    try:
        children = psutil.Process(sup.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    kill_quietly(sup.pid)
    for child in children:
        kill_quietly(child.pid)
    sup.wait(10)


def _study(state: Path) -> Any:
    import optuna

    return optuna.load_study(study_name="cart", storage=f"sqlite:///{state}/sweeps/cart.db")


def test_a_sweep_survives_kills_and_a_reboot_and_ranks_its_trials(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("RLSUP_SWEEP_SEED", "43")))
    (tmp_path / "rlsup.toml").write_text(CONFIG)
    config, state = tmp_path / "rlsup.toml", tmp_path / "state"
    env = env_for(tmp_path)
    sup = start_supervisor(config, env, "--exit-when-done")
    watch = Watch(state)
    faults, injected = ["kill", "kill", "reboot", "kill"], []
    try:
        for fault in faults:
            # A random moment while a trial run trains past its first checkpoint.
            current = sup
            wait_for(
                lambda p=current: p.poll() is not None or any(
                    (hb := heartbeat(state, r)) and hb.get("phase") == "training"
                    and (hb.get("last_checkpoint_step") or 0) > 0
                    and hb["global_step"] < TOTAL - 2048
                    for r in RUNS
                ),
                180,
                "a trial run training past its first checkpoint",
            )  # fmt: skip
            if sup.poll() is not None:
                break  # the sweep ended before this fault: the rest cannot happen
            time.sleep(rng.uniform(0.0, 1.0))
            _kill_everything(sup)
            injected.append(fault)
            if fault == "reboot":
                (tmp_path / "boot_id").write_text(f"boot-{rng.randrange(10**6)}\n")
            sup = start_supervisor(config, env, "--exit-when-done")
        assert sup.wait(300) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        watch.stop()
        if sup.poll() is None:
            sup.send_signal(signal.SIGTERM)
            sup.wait(30)
    assert injected == faults, f"the sweep ended after {injected}: lengthen it"
    reboots = events(state, "host_reboot")
    assert len(reboots) == 1, reboots

    # Every run ended (DONE), and the study holds exactly the 12 trials, each ended.
    rows = {r["game"]: r for r in query(state, "SELECT game, state, reason FROM workers")}
    assert {r: rows[r]["state"] for r in RUNS} == dict.fromkeys(RUNS, "done"), rows
    study = _study(state)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == TRIALS
    states = {t.number: t.state.name for t in trials}
    assert set(states.values()) <= {"COMPLETE", "PRUNED"}, states

    # Never re-sampled: each run's trial.json holds its trial's values, as the study does.
    for t in trials:
        for s in SEEDS:
            doc = json.loads(
                (state / "runs" / f"cart/t{t.number:03d}/s{s}" / "trial.json").read_text()
            )
            assert doc["params"] == t.params and doc["trial"] == t.number

    # Never twice: no start of a run after its game_done; never from zero after a checkpoint.
    for run in RUNS:
        evs = [e for e in events(state) if e["game"] == run]
        done_at = [i for i, e in enumerate(evs) if e["kind"] == "game_done"]
        assert len(done_at) == 1, (run, [e["kind"] for e in evs])
        assert not [e for e in evs[done_at[0] :] if e["kind"] in ("worker_start", "restart")], run
        for pid, life in watch.lives[run].items():
            assert life["resumed"] >= life["floor"], (run, pid, life, watch.lives[run])

    # The test's ledger, from the runs' own files: a complete trial's value is the mean of its
    # seeds' final evaluations (eval.json); the study's value and best agree.
    ledger: dict[int, float] = {}
    for t in trials:
        if t.state.name != "COMPLETE":
            continue
        finals = [
            json.loads((state / "runs" / f"cart/t{t.number:03d}/s{s}" / "eval.json").read_text())
            for s in SEEDS
        ]
        ledger[t.number] = statistics.fmean(f["mean"] for f in finals)
        assert t.value == pytest.approx(ledger[t.number])
    assert ledger, states
    assert study.best_value == pytest.approx(max(ledger.values()))
    ended = [e["detail"] for e in events(state, "sweep_trial")]
    assert sorted(d["trial"] for d in ended) == list(range(TRIALS))  # each told once
    resumed = sum(1 for r in RUNS for life in watch.lives[r].values() if life["resumed"] > 0)
    print(f"sweep: {states}; {resumed} lives resumed from a checkpoint; faults {injected}")
    assert resumed > 0  # the kills landed on trials with checkpoints

    # `rlsup results --sweep` ranks them: the best complete trial first.
    out = rlsup("results", "--sweep", "cart", "--json", "--config", str(config), env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["best"] == study.best_trial.number
    assert doc["trials"][0]["trial"] == study.best_trial.number
    complete = [t for t in doc["trials"] if t["state"] == "complete"]
    assert [t["rank"] for t in complete] == list(range(1, len(complete) + 1))
    values = [t["value"] for t in complete]
    assert values == sorted(values, reverse=True)
    text = rlsup("results", "--sweep", "cart", "--config", str(config), env=env)
    assert text.returncode == 0 and "cart/t" in text.stdout and "best: trial" in text.stdout
