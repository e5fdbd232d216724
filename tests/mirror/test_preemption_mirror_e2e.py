"""A GCE Spot VM taken with a mirror on: two PPO games in long iterations (no periodic
checkpoint for 10 minutes) under a real `rlsup run`, a real SeaweedFS as the mirror, a
loopback GCE metadata server as the seam. The notice's 30 s window: every game commits a
checkpoint and the mirror holds it well inside the window; just before the deadline every game
checkpoints once more and that one is mirrored too; then everything is SIGKILLed and a new
boot resumes every game from that last checkpoint, `preempted`, with no crash counted."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.fake_metadata import FakeMetadata
from harness.runs import (
    committed_step,
    env_for,
    events,
    heartbeat,
    kill_quietly,
    query,
    start_supervisor,
    stop_supervisor,
    training_pid,
    wait_for,
    worker_pids,
)
from harness.seaweed import TEST_AWS_ENV, Weed
from tests.mirror.conftest import remote_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
GAMES = ("left", "right")
WINDOW_S = 30.0  # GCE's


@pytest.fixture
def gce() -> Iterator[FakeMetadata]:
    server = FakeMetadata("gcp")
    yield server
    server.close()


def config(tmp: Path, weed: Weed, url: str, endpoint: str) -> Path:
    games = "".join(
        f'[[games]]\nname = "{g}"\nenv_id = "CartPole-v1"\nalgo = "ppo"\n'
        f'total_steps = 100000000\nseed = {i + 1}\ndevice = "cpu"\n'
        "args = { eval_episodes = 0 }\n"
        for i, g in enumerate(GAMES)
    )
    text = (
        'state_dir = "state"\ncheckpoint_every_s = 600\nstop_grace_s = 20\n'
        # A long iteration: 2 x 8192 CartPole steps, then 4 epochs of 256 minibatches.
        "[modes.light]\nnum_envs = 2\nbatch_size = 64\nn_steps = 8192\nmax_concurrent = 2\n"
        + games
        + "[restart]\nbackoff_base_s = 0.3\nbackoff_max_s = 1\nbudget = 5\n"
        "budget_window_s = 600\nstable_after_s = 30\n"
        "[watchdog]\nstartup_grace_s = 90\nhang_timeout_s = 60\nkill_grace_s = 10\n"
        "[spare]\nenabled = false\n"
        f'[mirror]\nurl = "{url}"\nendpoint_url = "{weed.endpoint}"\nkeep = 3\n'
        f'[preemption]\nprovider = "gcp"\nendpoint = "{endpoint}"\npoll_s = 0.2\n'
        "final_checkpoint_s = 8\n"
    )
    path = tmp / "rlsup.toml"
    path.write_text(text)
    return path


def served(state: Path, game: str, after: float) -> dict | None:
    """The heartbeat's served checkpoint request made after `after` (Unix s), if any."""
    req = (heartbeat(state, game) or {}).get("checkpoint_request") or {}
    if req.get("committed") and req.get("requested", 0) > after:
        return req
    return None


def test_a_gce_notice_is_a_mirrored_checkpoint_inside_its_window_then_a_final_one(
    weed: Weed, request: pytest.FixtureRequest, tmp_path: Path, gce: FakeMetadata
) -> None:
    url, remote = remote_for(weed, request)
    path = config(tmp_path, weed, url, gce.url)
    env = env_for(tmp_path, **TEST_AWS_ENV)
    state = tmp_path / "state"
    sup = start_supervisor(path, env)
    try:
        for g in GAMES:
            wait_for(lambda g=g: training_pid(state, g), 120, f"{g} trains")
        assert all(committed_step(state, g) < 0 for g in GAMES)  # nothing saved yet
        gce.mode = "notice"
        [notice] = wait_for(lambda: events(state, "preemption_notice"), 30, "the notice")
        deadline = notice["detail"]["deadline"]
        assert deadline - notice["ts"] == pytest.approx(WINDOW_S, abs=1)
        assert sorted(notice["detail"]["checkpoint_requested"]) == sorted(GAMES)

        # Every game commits within about a minibatch, and the mirror holds it.
        first = {}
        for g in GAMES:
            first[g] = wait_for(lambda g=g: served(state, g, 0), WINDOW_S, f"{g}'s checkpoint")
            step = first[g]["committed_step"]
            wait_for(lambda g=g, s=step: s in remote.manifest_steps(g), WINDOW_S, f"{g} mirrored")
        mirrored_in = time.time() - notice["ts"]
        print(f"notice -> every game committed and mirrored: {mirrored_in:.2f} s of {WINDOW_S}")
        assert mirrored_in < WINDOW_S - 8  # before the final request is due
        assert not events(state, "preemption_final_checkpoint")

        # 8 s before the deadline: one more checkpoint each, mirrored too.
        [final] = wait_for(
            lambda: events(state, "preemption_final_checkpoint"), WINDOW_S, "the final request"
        )
        assert final["detail"]["in_s"] == pytest.approx(8, abs=1)
        last = {}
        for g in GAMES:
            last[g] = wait_for(
                lambda g=g: served(state, g, first[g]["requested"]), 8, f"{g}'s final checkpoint"
            )
            assert last[g]["committed_step"] > first[g]["committed_step"]
            step = last[g]["committed_step"]
            wait_for(lambda g=g, s=step: s in remote.manifest_steps(g), 8, f"{g}'s final mirrored")
        ahead = deadline - time.time()
        print(f"final checkpoints committed and mirrored {ahead:.2f} s before the deadline")
        assert ahead > 0

        # The machine is taken: everything dies at once.
        old_pids = {g: (heartbeat(state, g) or {}).get("pid") for g in GAMES}
        workers = [p for g in GAMES for p in worker_pids(state, g)]
        kill_quietly(sup.pid)
        sup.wait(10)
        for pid in workers:
            kill_quietly(pid)
    finally:
        stop_supervisor(sup)
    restarts = {g: query(state, "SELECT restarts FROM workers WHERE game = ?", g)[0][0]
                for g in GAMES}  # fmt: skip

    (tmp_path / "boot_id").write_text("boot-2\n")  # the new boot, the same persistent disk
    gce.mode = "calm"
    sup = start_supervisor(path, env)
    try:
        wait_for(lambda: events(state, "preempted"), 60, "the preempted verdict")
        for g in GAMES:
            # The new worker's heartbeat, not the one the killed worker left behind.
            wait_for(
                lambda g=g: training_pid(state, g, not_pid=old_pids[g]), 120, f"{g} trains again"
            )
            hb = heartbeat(state, g)
            assert hb is not None and hb["resumed_from_step"] == last[g]["committed_step"]
        assert events(state, "supervisor_start")[-1]["detail"]["after"] == "preempted"
        for kind in ("host_reboot", "worker_crash", "backoff", "scale_down", "fatal"):
            assert events(state, kind) == [], kind
        for g in GAMES:
            now = query(state, "SELECT restarts FROM workers WHERE game = ?", g)[0][0]
            assert now == restarts[g]
    finally:
        stop_supervisor(sup)
        for g in GAMES:
            for p in worker_pids(state, g):
                kill_quietly(p, signal.SIGKILL)
