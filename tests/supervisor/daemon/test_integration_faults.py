"""Real supervisor + real workers (CartPole PPO, tiny budgets): worker faults and a clean stop.

One supervisor run covers: SIGKILL of a worker (restarted, resumed from its checkpoint),
SIGSTOP of a worker (worker_hang, killed, restarted), systemd notifications (READY=1,
WATCHDOG=1, STATUS=, STOPPING=1), and SIGTERM (every worker checkpoints and exits 75; the stop
is recorded clean).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from harness.runs import (
    committed_step,
    env_for,
    events,
    heartbeat,
    kill_quietly,
    query,
    rlsup,
    start_supervisor,
    training_pid,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


class NotifyListener:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def lines(self) -> list[str]:
        return [line for m in list(self.messages) for line in m.split("\n")]

    def close(self) -> None:
        self._stop = True
        self.thread.join(2)
        self.sock.close()


def test_worker_faults_are_recovered_and_sigterm_stops_cleanly(tmp_path: Path) -> None:
    config = write_config(tmp_path, [("alpha", 400_000), ("beta", 400_000)])
    state = tmp_path / "state"
    listener = NotifyListener(tmp_path / "notify.sock")
    env = env_for(tmp_path, NOTIFY_SOCKET=str(tmp_path / "notify.sock"), WATCHDOG_USEC="1000000")
    sup = start_supervisor(config, env)
    try:
        # Both games train and commit a checkpoint.
        for game in ("alpha", "beta"):
            wait_for(
                lambda g=game: training_pid(state, g) and committed_step(state, g) > 0,
                90,
                f"{game} training with a checkpoint",
            )
        assert "READY=1" in listener.lines()
        wait_for(lambda: "WATCHDOG=1" in listener.lines(), 10, "WATCHDOG=1")
        assert any(line.startswith("STATUS=rlsup:") for line in listener.lines())

        # One supervisor per state dir: a second one is refused, naming the holder.
        second = rlsup("run", "--config", str(config), env=env)
        assert second.returncode == 73 and f"pid {sup.pid}" in second.stderr  # EX_CANTCREAT

        # SIGKILL a worker: restarted within seconds, resumed from its checkpoint.
        pid_a = training_pid(state, "alpha")
        before_a = committed_step(state, "alpha")
        t_kill = time.monotonic()
        os.kill(pid_a, signal.SIGKILL)
        new_a = wait_for(lambda: training_pid(state, "alpha", not_pid=pid_a), 60, "alpha restarted")
        hb = heartbeat(state, "alpha")
        assert hb is not None and hb["resumed_from_step"] is not None
        assert hb["resumed_from_step"] >= before_a, "restarted from an older checkpoint"
        assert time.monotonic() - t_kill < 30
        crash = events(state, "worker_crash", "alpha")
        assert crash and "SIGKILL" in crash[-1]["detail"]["description"]
        assert events(state, "restart", "alpha")

        # SIGSTOP a worker: its heartbeat stalls → worker_hang → killed → restarted, resumed.
        pid_b = training_pid(state, "beta")
        before_b = committed_step(state, "beta")
        os.kill(pid_b, signal.SIGSTOP)
        wait_for(lambda: events(state, "worker_hang", "beta"), 30, "worker_hang for beta")
        wait_for(lambda: training_pid(state, "beta", not_pid=pid_b), 60, "beta restarted")
        hb = heartbeat(state, "beta")
        assert hb is not None and hb["resumed_from_step"] >= before_b
        assert not _alive(pid_b)

        # `rlsup stop` (SIGTERM): every worker checkpoints and exits 75; the stop is recorded clean.
        pids = {g: training_pid(state, g) for g in ("alpha", "beta")}
        steps = {g: heartbeat(state, g)["global_step"] for g in pids}  # type: ignore[index]
        stop = rlsup("stop", "--config", str(config), "--timeout", "60", env=env, timeout=90)
        assert stop.returncode == 0, stop.stderr
        assert f"pid {sup.pid}" in stop.stdout and "stopped" in stop.stdout
        assert sup.wait(10) == 0
        assert pids["alpha"] == new_a
        for game, pid in pids.items():
            exits = [e for e in events(state, "worker_exit", game) if e["detail"]["pid"] == pid]
            assert exits and exits[-1]["detail"]["returncode"] == 75, exits
            assert committed_step(state, game) >= steps[game], "the final checkpoint is missing"
        assert query(state, "SELECT clean_stop FROM boots")[0]["clean_stop"] == 1
        assert events(state, "supervisor_stop")
        assert "STOPPING=1" in listener.lines()
        assert {r["state"] for r in query(state, "SELECT state FROM workers")} == {"stopped"}
        # One canonical log line per state change, with the fields operators grep for.
        lines = [
            json.loads(x)
            for x in (tmp_path / "supervisor.log").read_text().splitlines()
            if x.startswith("{")
        ]
        changes = [x for x in lines if x.get("event") == "worker_state"]
        assert changes and all(
            {"game", "from", "to", "reason", "pid", "restarts"} <= set(c) for c in changes
        )
    finally:
        kill_quietly(sup.pid)
        listener.close()
        for game in ("alpha", "beta"):
            hb = heartbeat(state, game)
            if hb:
                kill_quietly(hb["pid"])


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
