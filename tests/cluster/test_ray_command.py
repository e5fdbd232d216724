"""Command games (a user's own program on the SDK) on several hosts, on the real loopback Ray
cluster and a real mirror (SeaweedFS): `rlsup run` places a small CartPole script on a host
through that host's actor; the host is killed (every process of its node SIGKILLed) and the
game moves to the other host, where the host restores the mirror's newest checkpoint before
the script starts: it resumes from it, never from step 0, and finishes. A command whose path
does not exist on the chosen host ends FATAL, naming the path and the host."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness import cartpole_command
from harness.ray_cluster import (
    LoopbackCluster,
    MostAtOnce,
    command_processes,
)
from harness.runs import events, heartbeat, start_supervisor, stop_supervisor, wait_for
from harness.seaweed import Weed
from tests.cluster.conftest import mirror_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("ray", reason="the ray extra (make test installs it)")

SCRIPT = Path(cartpole_command.__file__)


def write_config(tmp: Path, lc: LoopbackCluster, weed: Weed, url: str, game: str) -> Path:
    text = (
        'state_dir = "state"\ncheckpoint_every_s = 1\nstop_grace_s = 30\ntick_s = 0.5\n'
        "[modes.light]\nnum_envs = 4\nbatch_size = 64\nn_steps = 64\nmax_concurrent = 4\n"
        + game
        + "[restart]\nbackoff_base_s = 0.3\nbackoff_max_s = 1\nbudget = 5\n"
        "budget_window_s = 600\nstable_after_s = 30\n"
        "[watchdog]\nstartup_grace_s = 60\nhang_timeout_s = 60\nkill_grace_s = 10\n"
        f'[mirror]\nurl = "{url}"\nendpoint_url = "{weed.endpoint}"\nkeep = 3\n'
        f'[cluster]\nbackend = "ray"\naddress = "{lc.address}"\nhost_lost_after_s = 15\n'
    )
    path = tmp / "rlsup.toml"
    path.write_text(text)
    return path


def command_game(name: str, command: list[str], cwd: Path, total_steps: int) -> str:
    return (
        f'[[games]]\nname = "{name}"\ncommand = {json.dumps(command)}\n'
        f"cwd = {json.dumps(str(cwd))}\nheartbeat = true\ntotal_steps = {total_steps}\n"
        'seed = 1\ndevice = "cpu"\nenv = { PYTHONUNBUFFERED = "1" }\n'
    )


def alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def placements(state: Path, game: str) -> list[dict[str, Any]]:
    return [
        e["detail"]
        for e in events(state, None, game)
        if e["detail"].get("to") == "starting" and "host" in e["detail"]
    ]


def test_a_command_game_moves_with_its_dead_host_and_resumes_from_the_mirror(
    two_hosts: LoopbackCluster,
    weed: Weed,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    ray_env: dict[str, str],
) -> None:
    lc = two_hosts
    url, remote = mirror_for(weed, request)
    total = 12_000
    command = [sys.executable, SCRIPT.name, "--pace-s", "0.05"]
    game = command_game("cp", command, SCRIPT.parent, total)
    config = write_config(tmp_path, lc, weed, url, game)
    state = tmp_path / "state"
    sup = start_supervisor(config, ray_env, "--exit-when-done")
    watch = MostAtOnce(lambda: len(command_processes(lc.root, "cp")), 0.2)
    try:
        [first] = wait_for(lambda: placements(state, "cp"), 120, "cp placed on a host")
        # The script's checkpoints are mirrored from its host (by its actor, fenced at its
        # placement's epoch); the relayed heartbeat is the script's own.
        wait_for(lambda: remote.manifest_steps("cp"), 120, "a mirrored checkpoint of cp")
        hb = heartbeat(state, "cp")
        assert hb is not None and hb["host"] == first["host"] and hb["pid"] == first["pid"]
        assert hb["writer"] == "sdk" and hb["resumed_from_step"] is None
        host_run = lc.node_dir(first["host"]) / "runs" / "cp"
        newest = sorted((host_run / "checkpoints").glob("ckpt-*"))[-1]
        assert json.loads((newest / "MANIFEST.json").read_text())["meta"]["epoch"] == first["epoch"]

        lc.kill_host(first["host"])
        mirrored = remote.manifest_steps("cp")[-1]  # nothing uploads from a dead host
        assert 0 < mirrored < total

        survivor = "h2" if first["host"] == "h1" else "h1"
        moved = wait_for(lambda: placements(state, "cp")[1:], 120, "cp placed again")[0]
        assert moved["host"] == survivor and moved["epoch"] > first["epoch"], moved
        assert remote.get_fence("cp") >= moved["epoch"]

        def resumed() -> dict[str, Any] | None:
            h = heartbeat(state, "cp")
            ok = h and h["pid"] == moved["pid"] and h["resumed_from_step"] is not None
            return h if ok else None

        after = wait_for(resumed, 120, "cp resumed on the surviving host")
        assert after["resumed_from_step"] >= mirrored, (after, mirrored)
        assert after["mirror_restore"]["step"] == after["resumed_from_step"], after
        assert sup.wait(150) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        stop_supervisor(sup)
        most = watch.stop()
    assert most == 1, f"{most} processes of cp ran at once"
    [restored] = events(state, "mirror_restored", "cp")
    assert restored["detail"]["step"] == after["resumed_from_step"]
    [exit_] = [e for e in events(state, None, "cp") if e["detail"].get("exit") == "host_lost"]
    assert exit_["detail"]["to"] == "exited"
    assert events(state, "game_done", "cp")
    final = json.loads((state / "runs" / "cp" / "heartbeat.json").read_text())
    assert final["global_step"] >= total and final["host"] == survivor
    evaluated = json.loads((state / "runs" / "cp" / "eval.json").read_text())  # relayed
    assert evaluated["step"] == total and evaluated["mean"] > 0, evaluated
    log = (lc.node_dir(survivor) / "logs" / "cp.log").read_text()
    assert f"resumed from step {after['resumed_from_step']}" in log, log[-2000:]
    assert "resumed from step 0 " not in log
    assert not command_processes(lc.root, "cp")


def test_a_command_missing_on_its_host_ends_fatal_naming_the_path_and_the_host(
    one_host: LoopbackCluster,
    weed: Weed,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    ray_env: dict[str, str],
) -> None:
    """...and a crash on a host is told by its own last words (its log's tail, relayed)."""
    lc = one_host
    url, _ = mirror_for(weed, request)
    nowhere = tmp_path / "not-mounted" / "project"
    game = command_game("gone", [sys.executable, "train.py"], nowhere, 1000)
    crashy = [sys.executable, "-c", "raise ValueError('loss is nan')"]
    game += command_game("crashy", crashy, tmp_path, 1000).replace("heartbeat = true", "")
    config = write_config(tmp_path, lc, weed, url, game)
    state = tmp_path / "state"
    sup = start_supervisor(config, ray_env)
    try:
        fatal = wait_for(lambda: events(state, "fatal", "gone"), 90, "gone FATAL")[0]["detail"]
        assert str(nowhere) in fatal["reason"] and "on host h1" in fatal["reason"], fatal
        assert "same absolute path on every host" in fatal["reason"], fatal
        assert len(placements(state, "gone")) == 1, "a restart cannot help: no second start"
        crash = wait_for(lambda: events(state, "worker_crash", "crashy"), 90, "crashy crashed")
        assert "ValueError: loss is nan" in crash[0]["detail"]["message"], crash[0]
    finally:
        stop_supervisor(sup)
    assert sup.returncode == 0


def test_a_frozen_command_game_on_a_host_is_hung_restarted_and_stops_75_mirrored(
    one_host: LoopbackCluster,
    weed: Weed,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    ray_env: dict[str, str],
) -> None:
    """Hang detection reads the heartbeat relayed from the host: a frozen program (SIGSTOP) is
    stopped as hung and started again, from its checkpoint; a supervisor's stop ends it with
    exit 75 after a final checkpoint, which its actor mirrors before it is let go."""
    lc = one_host
    url, remote = mirror_for(weed, request)
    command = [sys.executable, SCRIPT.name, "--pace-s", "0.05"]
    game = command_game("hz", command, SCRIPT.parent, 10_000_000)
    config = write_config(tmp_path, lc, weed, url, game)
    text = config.read_text().replace(
        "hang_timeout_s = 60\nkill_grace_s = 10", "hang_timeout_s = 4\nkill_grace_s = 5"
    )
    config.write_text(text)
    state = tmp_path / "state"
    sup = start_supervisor(config, ray_env)
    try:
        [first] = wait_for(lambda: placements(state, "hz"), 120, "hz placed")
        wait_for(lambda: remote.manifest_steps("hz"), 120, "a mirrored checkpoint of hz")
        [proc] = command_processes(lc.root, "hz")
        assert proc.pid == first["pid"]
        proc.send_signal(signal.SIGSTOP)
        [hang] = wait_for(lambda: events(state, "worker_hang", "hz"), 30, "hz hung")
        assert "seq unchanged" in hang["detail"]["reason"], hang
        again = wait_for(lambda: placements(state, "hz")[1:], 30, "hz started again")[0]
        assert again["host"] == "h1" and again["epoch"] == first["epoch"] + 1

        def resumed() -> dict[str, Any] | None:
            h = heartbeat(state, "hz")
            ok = h and h["pid"] == again["pid"] and h["resumed_from_step"] and h["global_step"]
            return h if ok else None

        wait_for(resumed, 120, "hz resumed from its checkpoint")
    finally:
        stop_supervisor(sup)
    assert sup.returncode == 0
    hung, last = [e["detail"] for e in events(state, "worker_exit", "hz")]
    assert hung["pid"] == first["pid"] and hung["returncode"] == 75, "SIGCONT: it checkpoints"
    assert last["pid"] == again["pid"] and last["exit"] == "stopped", last
    assert [e["detail"]["reason"] for e in events(state, "backoff", "hz")] == [
        "hang: exit status 75 (stopped)"
    ]
    final = json.loads((state / "runs" / "hz" / "heartbeat.json").read_text())
    assert remote.manifest_steps("hz")[-1] == final["last_checkpoint_step"], "mirrored at exit"
    assert not command_processes(lc.root, "hz")


def test_a_program_left_running_on_a_lost_host_is_fenced_and_exits_77(
    two_hosts: LoopbackCluster,
    weed: Weed,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    ray_env: dict[str, str],
) -> None:
    """A host cut off from the cluster (its raylet frozen: Ray declares it dead) while the
    actor and the program on it run on, as behind a network partition that spares the mirror:
    the game is placed on the other host, and the program left behind commits nothing more
    once the fence moved: its next checkpoint is refused and it exits 77 (fenced)."""
    lc = two_hosts
    url, remote = mirror_for(weed, request)
    command = [sys.executable, SCRIPT.name, "--pace-s", "0.05"]
    config = write_config(
        tmp_path, lc, weed, url, command_game("fz", command, SCRIPT.parent, 10**7)
    )
    state = tmp_path / "state"
    sup = start_supervisor(config, ray_env)
    frozen: list[psutil.Process] = []
    try:
        [first] = wait_for(lambda: placements(state, "fz"), 120, "fz placed")
        wait_for(lambda: remote.manifest_steps("fz"), 120, "a mirrored checkpoint of fz")
        [program] = command_processes(lc.root, "fz")
        # Its raylet frozen: Ray declares the host dead (and its actors), while the actor and
        # the program on it run on, cut off from the cluster but not from the mirror.
        for info in lc.nodes[first["host"]].all_processes["raylet"]:
            frozen.append(psutil.Process(info.process.pid))
            frozen[-1].send_signal(signal.SIGSTOP)

        moved = wait_for(lambda: placements(state, "fz")[1:], 120, "fz placed again")[0]
        assert moved["host"] != first["host"] and moved["epoch"] > first["epoch"]
        wait_for(lambda: not alive(program), 60, "the program left behind exits")
        run_dir = lc.node_dir(first["host"]) / "runs" / "fz"
        error = json.loads((run_dir / "error.json").read_text())
        assert (
            error["kind"] == "fenced" and error["pid"] == program.pid and error["exit_code"] == 77
        )
        assert f"placement epoch {first['epoch']} is fenced off" in error["message"], error
        assert not (run_dir / "checkpoints" / f"ckpt-{error['step']:012d}").exists()
        epochs = {
            json.loads((c / "MANIFEST.json").read_text())["meta"]["epoch"]
            for c in (run_dir / "checkpoints").glob("ckpt-*")
        }
        assert epochs == {first["epoch"]}, "it committed nothing under the new placement's epoch"
    finally:
        stop_supervisor(sup)
        for p in frozen:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
    assert sup.returncode == 0
