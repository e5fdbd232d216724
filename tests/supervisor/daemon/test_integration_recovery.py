"""Real supervisor + real workers: supervisor crash, host reboot, scaling, a crash loop."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
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
    worker_pids,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
GAMES = ("alpha", "beta")
TOTAL = 150_000


class DuplicateWatch:
    """Samples the process table: the most live workers ever seen for one game."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.most = dict.fromkeys(GAMES, 0)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for g in GAMES:
                self.most[g] = max(self.most[g], len(worker_pids(self.state, g)))

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self.thread.join(5)
        return self.most


def test_supervisor_crash_and_host_reboot_lose_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path, [("alpha", TOTAL), ("beta", TOTAL)])
    state = tmp_path / "state"
    env = env_for(tmp_path)
    sup = start_supervisor(config, env)
    watch = DuplicateWatch(state)
    procs = [sup]
    try:
        for g in GAMES:
            wait_for(
                lambda g=g: training_pid(state, g) and committed_step(state, g) > 0,
                90,
                f"{g} training with a checkpoint",
            )

        # `rlsup scale` reaches the running supervisor: alpha restarts with 8 envs.
        old_alpha = training_pid(state, "alpha")
        done = rlsup(
            "scale", "--mode", "medium", "--game", "alpha", "--config", str(config), env=env
        )
        assert done.returncode == 0, done.stderr
        wait_for(
            lambda: (
                (hb := heartbeat(state, "alpha"))
                and hb["num_envs"] == 8
                and hb["phase"] == "training"
                and hb["pid"] != old_alpha
            ),
            60,
            "alpha at 8 envs",
        )
        assert not events(state, "worker_crash"), "a mode change is not a crash"
        assert events(state, "mode_pinned", "alpha")

        # SIGKILL the supervisor alone, start it again at once (same boot id): the leftover
        # workers are stopped before new ones start, never two per game.
        old = {g: heartbeat(state, g)["pid"] for g in GAMES}  # type: ignore[index]
        os.kill(sup.pid, signal.SIGKILL)
        sup.wait()
        committed = {g: committed_step(state, g) for g in GAMES}
        sup = start_supervisor(config, env)
        procs.append(sup)
        for g in GAMES:
            wait_for(lambda g=g: training_pid(state, g, not_pid=old[g]), 90, f"{g} restarted")
            assert heartbeat(state, g)["resumed_from_step"] >= committed[g]  # type: ignore[index]
        starts = events(state, "supervisor_start")
        assert starts[-1]["detail"]["after"] == "supervisor_crash"
        assert heartbeat(state, "alpha")["num_envs"] == 8, "the pinned mode survives a restart"  # type: ignore[index]

        # Power loss: the supervisor, its group and every worker die at once; new boot id.
        wait_for(
            lambda: all(committed_step(state, g) > committed[g] for g in GAMES),
            60,
            "a checkpoint after the restart",
        )
        victims = [heartbeat(state, g)["pid"] for g in GAMES]  # type: ignore[index]
        os.killpg(sup.pid, signal.SIGKILL)
        for pid in victims:
            kill_quietly(pid)
        sup.wait()
        committed = {g: committed_step(state, g) for g in GAMES}
        # The power went between a worker's report and the supervisor's event for it: alpha's
        # last heartbeat says it dropped a damaged replay chunk; no event records that yet.
        hb_file = state / "runs" / "alpha" / "heartbeat.json"
        last = json.loads(hb_file.read_text())
        damage = {"checkpoint": "ckpt-x", "when": "load", "files": ["replay/frames-000001.bin"]}
        hb_file.write_text(json.dumps(last | {"replay_damage": [damage]}))
        assert not events(state, "replay_damaged")
        (tmp_path / "boot_id").write_text("boot-2\n")
        done = rlsup("run", "--config", str(config), "--exit-when-done", env=env, timeout=200)
        assert done.returncode == 0, done.stderr[-3000:]

        caught = events(state, "replay_damaged", "alpha")
        assert [e["detail"] for e in caught] == [damage | {"pid": last["pid"], "caught_up": True}]
        reboot = events(state, "host_reboot")
        assert len(reboot) == 1 and reboot[0]["detail"]["downtime_s"] >= 0
        assert reboot[0]["detail"]["previous_boot_id"] == "boot-1"
        for g in GAMES:
            hb = heartbeat(state, g)
            assert hb is not None and hb["resumed_from_step"] >= committed[g]
            assert committed_step(state, g) >= TOTAL
            assert events(state, "game_done", g)
        assert {r["state"] for r in query(state, "SELECT state FROM workers")} == {"done"}
        assert query(state, "PRAGMA integrity_check")[0][0] == "ok"
    finally:
        most = watch.stop()
        for p in procs:
            kill_quietly(p.pid)
        for g in GAMES:
            for pid in worker_pids(state, g):
                kill_quietly(pid)
    assert max(most.values()) == 1, f"two live workers for one game: {most}"


def test_crash_loop_goes_fatal_while_the_other_game_finishes(tmp_path: Path) -> None:
    # A real, persistent fault: a foreign process holds the bad game's run-dir lock, so its
    # worker gives up (exit 1) every time. The budget is 2 failures per window.
    config = write_config(tmp_path, [("good", 20_000), ("bad", 20_000)], restart="", extra="")
    text = config.read_text().replace("budget = 5", "budget = 2")
    config.write_text(text)
    state = tmp_path / "state"
    run_dir = state / "runs" / "bad"
    run_dir.mkdir(parents=True)
    lock = os.open(run_dir / "worker.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        env = env_for(tmp_path, RLSUP_WORKER_LOCK_WAIT_S="0.2")
        done = rlsup("run", "--config", str(config), "--exit-when-done", env=env, timeout=200)
    finally:
        os.close(lock)
    # --exit-when-done: a game ended FATAL, so the run failed (1), naming it.
    assert done.returncode == 1, done.stderr[-3000:]
    assert "ended FATAL: bad" in done.stderr
    rows = {r["game"]: r for r in query(state, "SELECT * FROM workers")}
    assert rows["good"]["state"] == "done"
    assert rows["bad"]["state"] == "fatal"
    assert "restart budget" in rows["bad"]["reason"]
    assert len(events(state, "worker_crash", "bad")) == 3
    assert len(events(state, "backoff", "bad")) == 2
    assert events(state, "fatal", "bad")
    assert not events(state, "worker_crash", "good")
    assert committed_step(state, "good") >= 20_000
