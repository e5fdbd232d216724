"""Issue 16 end to end: a real `rlsup run` with two games, and what an operator watches.

One supervisor run, faults injected from outside: alpha's worker SIGKILLed once (restarted,
resumed), beta's twice (its restart budget of 1 spent: FATAL), then the whole host "loses
power" (supervisor and workers SIGKILLed, a new boot id) and comes back. Checked against the
real artefacts: TensorBoard event files read by TensorBoard's own loader (expected tags,
steps strictly increasing across the SIGKILL and resume), the Prometheus endpoint and
textfile parsed by prometheus_client's parser, the alert hook fired exactly once for the
FATAL game and once for the reboot, `rlsup logs -f` following alpha across its restart, and
`rlsup status` exiting 4 (a FATAL game) while the supervisor runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from harness.runs import (
    REPO,
    committed_step,
    env_for,
    events,
    heartbeat,
    kill_quietly,
    rlsup,
    start_supervisor,
    stop_supervisor,
    training_pid,
    wait_for,
    worker_pids,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOOK = """\
import json, os, sys
event = json.load(sys.stdin)
event["env"] = {k: os.environ.get(k) for k in ("RLSUP_EVENT_KIND", "RLSUP_GAME")}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(event) + "\\n")
print("hook saw", event["kind"])
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def hook_calls(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tb_scalars(run_dir: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_metrics_tensorboard_hooks_and_logs_through_kills_a_fatal_game_and_a_reboot(
    tmp_path: Path,
) -> None:
    port = free_port()
    (tmp_path / "hook.py").write_text(HOOK)
    calls = tmp_path / "hook-calls.jsonl"
    extra = textwrap.dedent(
        f"""\
        tick_s = 0.5
        [metrics]
        textfile = "metrics/rlsup.prom"
        listen = "127.0.0.1:{port}"
        interval_s = 0.5
        [[hooks]]
        on = ["fatal", "host_reboot"]
        command = [{json.dumps(sys.executable)}, {json.dumps(str(tmp_path / "hook.py"))},
                   {json.dumps(str(calls))}]
        timeout_s = 30
        """
    )
    (tmp_path / "metrics").mkdir()
    config = write_config(
        tmp_path,
        [("alpha", 400_000), ("beta", 400_000)],
        extra=extra,
        restart="",
    )
    text = config.read_text().replace("budget = 5", "budget = 1")
    config.write_text(text)
    state = tmp_path / "state"
    env = env_for(tmp_path)
    sup = start_supervisor(config, env)
    follower = None
    procs: list[subprocess.Popen[bytes]] = [sup]
    try:
        first = wait_for(lambda: training_pid(state, "alpha"), 120, "alpha training")
        wait_for(lambda: training_pid(state, "beta"), 120, "beta training")
        follow_out = open(tmp_path / "follow.txt", "wb")  # noqa: SIM115
        follower = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "logs", "alpha", "-f", "--json",
             "--config", str(config)],
            env=env, cwd=REPO, stdout=follow_out, stderr=subprocess.STDOUT,
        )  # fmt: skip

        # alpha: a checkpoint, metrics written past it, then SIGKILL; it resumes.
        base = committed_step(state, "alpha")
        wait_for(lambda: committed_step(state, "alpha") > base, 60, "a newer alpha checkpoint")
        wait_for(
            lambda: (
                (heartbeat(state, "alpha") or {}).get("global_step", 0)
                > committed_step(state, "alpha") + 2_000
            ),
            60,
            "alpha training past its checkpoint",
        )
        time.sleep(1.5)  # progress rows and TensorBoard points past the checkpoint
        kill_quietly(first)
        second = wait_for(
            lambda: training_pid(state, "alpha", not_pid=first, min_step=base + 1),
            120,
            "alpha resumed",
        )
        resumed_from = heartbeat(state, "alpha")["resumed_from_step"]  # type: ignore[index]
        assert resumed_from > 0

        # beta: two crashes in the window, budget 1: FATAL, and one `fatal` hook run.
        beta_pid: int | None = None
        for n in range(2):
            beta_pid = wait_for(
                lambda prev=beta_pid: training_pid(state, "beta", not_pid=prev),
                120,
                f"beta training (life {n + 1})",
            )
            kill_quietly(beta_pid)
            wait_for(lambda p=beta_pid: p not in worker_pids(state, "beta"), 60, "beta killed")
        wait_for(lambda: events(state, "fatal", "beta"), 60, "beta FATAL")
        wait_for(lambda: hook_calls(calls), 30, "the fatal hook")

        # `rlsup status`: exit 4 (supervisor running, a game FATAL); device and eval fields.
        st = rlsup("status", "--json", "--config", str(config), env=env)
        assert st.returncode == 4, st.stdout[-2000:] + st.stderr
        games = {g["name"]: g for g in json.loads(st.stdout)["games"]}
        assert games["beta"]["state"] == "fatal" and games["alpha"]["device"] == "cpu"

        # Prometheus: the endpoint and the textfile, parsed by the client's own parser.
        def scraped() -> dict:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return parse(r.read().decode())

        def fatal_seen() -> dict | None:
            s = scraped()
            return s if sample(s, "rlsup_game_state", game="beta", state="fatal") == 1 else None

        live = wait_for(fatal_seen, 30, "beta fatal in /metrics")
        assert sample(live, "rlsup_supervisor_up") == 1.0
        assert sample(live, "rlsup_game_state", game="alpha", state="running") == 1.0
        assert sample(live, "rlsup_game_restarts_total", game="alpha") >= 1
        assert sample(live, "rlsup_game_steps", game="alpha") > 0
        assert sample(live, "rlsup_game_steps_per_second", game="alpha") > 0
        assert sample(live, "rlsup_game_last_checkpoint_age_seconds", game="alpha") is not None
        assert sample(live, "rlsup_host_ram_available_percent") is not None
        assert sample(live, "rlsup_policy_decisions_total", kind="scale_down") is not None
        filed = wait_for(
            lambda: (
                (s := parse((tmp_path / "metrics" / "rlsup.prom").read_text()))
                and sample(s, "rlsup_game_state", game="beta", state="fatal") == 1
                and s
            ),
            30,
            "beta fatal in the textfile",
        )
        assert sample(filed, "rlsup_game_info", game="alpha", env_id="CartPole-v1",
                      algo="ppo", device="cpu", mode="light") == 1.0  # fmt: skip
        assert (tmp_path / "metrics" / "rlsup.prom").stat().st_mode & 0o777 == 0o644
        assert not [p for p in (tmp_path / "metrics").iterdir() if p.suffix != ".prom"]

        # Power loss: the supervisor and every worker SIGKILLed at once; a new boot id.
        victims = worker_pids(state, "alpha")
        os.killpg(sup.pid, signal.SIGKILL)
        for pid in victims:
            kill_quietly(pid)
        sup.wait()
        (tmp_path / "boot_id").write_text("boot-2\n")
        sup = start_supervisor(config, env)
        procs.append(sup)
        wait_for(lambda: events(state, "host_reboot"), 60, "host_reboot recorded")
        wait_for(lambda: len(hook_calls(calls)) >= 2, 30, "the reboot hook")
        third = wait_for(
            lambda: training_pid(state, "alpha", not_pid=second), 120, "alpha after the reboot"
        )
        assert third not in (first, second)
        time.sleep(2.0)  # a late or repeated hook run would show by now
    finally:
        if follower is not None:
            follower.send_signal(signal.SIGINT)
            try:
                follower.wait(10)
            except subprocess.TimeoutExpired:
                follower.kill()
        for p in procs:
            stop_supervisor(p)

    # The hook: exactly once per event (beta FATAL, the reboot), the event on stdin.
    got = hook_calls(calls)
    assert sorted(c["kind"] for c in got) == ["fatal", "host_reboot"], got
    fatal = next(c for c in got if c["kind"] == "fatal")
    assert fatal["game"] == "beta" and fatal["env"] == {
        "RLSUP_EVENT_KIND": "fatal",
        "RLSUP_GAME": "beta",
    }
    assert "restart budget spent" in fatal["detail"]["reason"]
    reboot = next(c for c in got if c["kind"] == "host_reboot")
    assert reboot["game"] is None and reboot["detail"]["previous_boot_id"] == "boot-1"
    assert not events(state, "hook_failed")
    assert "hook saw fatal" in (tmp_path / "supervisor.log").read_text()
    # Its whole output also in hooks.log, each line marked with the hook and the event.
    hooks_log = (state / "logs" / "hooks.log").read_text().splitlines()
    assert any(line.endswith("hook 0 fatal: hook saw fatal") for line in hooks_log), hooks_log

    # After the clean stop, node_exporter still serves the textfile: it says the supervisor
    # is down and no game runs, and when it was written.
    stopped = parse((tmp_path / "metrics" / "rlsup.prom").read_text())
    assert sample(stopped, "rlsup_supervisor_up") == 0.0
    assert sample(stopped, "rlsup_game_state", game="alpha", state="running") == 0.0
    assert sample(stopped, "rlsup_metrics_updated_timestamp_seconds") is not None

    # TensorBoard: its own loader, the expected tags, every tag's steps strictly increasing
    # across the SIGKILL (purged past the checkpoint) and the power loss.
    scalars = tb_scalars(state / "runs" / "alpha")
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
                "charts/learning_rate", "charts/steps_per_second"):  # fmt: skip
        assert scalars.get(tag), (tag, sorted(scalars))
    for tag, steps in scalars.items():
        assert steps == sorted(set(steps)), (tag, steps)
    assert max(scalars["losses/policy_loss"]) > resumed_from

    # `rlsup logs -f` followed alpha across its restarts: lines of all three workers.
    followed = (tmp_path / "follow.txt").read_text()
    pids = set()
    for line in followed.splitlines():
        try:
            pids.add(json.loads(line).get("pid"))
        except ValueError:
            continue
    assert {first, second} <= pids, (first, second, followed[-2000:])
