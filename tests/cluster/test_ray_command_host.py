"""A command game on a host, below Ray: `WorkerHost.start_command` (a plain class) starts a real
program through command.py in a real session, with a real mirror (SeaweedFS) where one is
needed. The program gets the host's run dir, the placement's epoch and the mirror; a heartbeat
written by a child of its session is relayed as the program's; its exit status and last words
are published; a path that is not on the host ends it 78 naming the path and the host; a host
with no checkpoint (or only a superseded placement's) gets the mirror's newest before the
program starts, and one whose checkpoints are the previous placement's keeps them."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from checkpoints import CheckpointStore
from checkpoints.mirror import upload_checkpoint
from harness.seaweed import Weed
from supervisor.launch import sessions
from supervisor.launch.ray.host import NODE_DIR_ENV, WorkerHost
from tests.mirror.conftest import remote_for, weed
from training import protocol as P

__all__ = ["weed"]

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, rlsup
    run = rlsup.attach(handle_signals=False, heartbeat=True)
    latest = run.latest()
    seen = {k: v for k, v in os.environ.items() if k.startswith(("RLSUP_", "MINE", "CUDA_"))}
    seen["cwd"] = os.getcwd()
    seen["latest"] = latest.name if latest else None
    seen["pid"] = os.getpid()
    print(json.dumps(seen), flush=True)
    run.heartbeat(7)
    run.close()
    print("the last words", flush=True)
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    """
)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(NODE_DIR_ENV, str(tmp_path / "node"))
    monkeypatch.setenv("RLSUP_HOST", "h9")
    (tmp_path / "node").mkdir(mode=0o700)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "train.py").write_text(SCRIPT)
    return tmp_path / "node"


def env_of(game: str, supervisor_run_dir: Path) -> dict[str, str]:
    """What the supervisor hands the actor: the RLSUP_* contract with its own run dir."""
    return {P.GAME_ENV: game, P.RUN_DIR_ENV: str(supervisor_run_dir), P.HEARTBEAT_ENV: "1",
            P.THREADS_ENV: "8", "MINE": "yes", "CUDA_VISIBLE_DEVICES": "3"}  # fmt: skip


def finish(host: WorkerHost) -> dict[str, Any]:
    assert host.wait_exit(60) is not None, host.log_path.read_text()
    return host.status()


def seen_by(host: WorkerHost) -> dict[str, Any]:
    *_, line = (x for x in host.log_path.read_text().splitlines() if x.startswith("{"))
    return dict(json.loads(line))


def test_the_program_runs_in_the_host_s_run_dir_with_its_epoch_and_its_session(
    node: Path, tmp_path: Path
) -> None:
    host = WorkerHost("g", 4, None)
    project = tmp_path / "project"
    # A wrapper: the SDK's heartbeat comes from a child of the program's session, and a job
    # it left behind must not outlive it.
    argv = ["sh", "-c", f'sleep 1000 & "{sys.executable}" train.py 3; exit $?']
    info = host.start_command(argv, str(project), env_of("g", tmp_path / "sup" / "g"), 2)
    st = finish(host)
    assert st["rc"] == 3 and st["exited"] == 3 and info["pid"] == st["pid"]
    seen = seen_by(host)
    assert seen["RLSUP_RUN_DIR"] == str(node / "runs" / "g"), "the host's run dir"
    assert seen["RLSUP_EPOCH"] == "4" and seen["RLSUP_THREADS"] == "2"
    assert seen["cwd"] == str(project) and seen["pid"] != info["pid"]
    assert "RLSUP_MIRROR_URL" not in seen and seen["latest"] is None
    hb = json.loads(st["heartbeat"])
    assert hb["pid"] == info["pid"] and hb["global_step"] == 7, "relayed as the program's"
    assert "the last words" in st["log_tail"]
    assert not sessions.members(info["pid"]), "nothing of its session outlives it"
    assert seen["MINE"] == "yes", "the game's own env"
    assert seen.get("CUDA_VISIBLE_DEVICES") != "3", "Ray places a GPU: the actor's own is kept"
    assert (node / "runs" / "g").stat().st_mode & 0o077 == 0, "the host's run dir is private"


@pytest.mark.parametrize(
    ("argv", "cwd", "needle"),
    [
        (["python3", "train.py"], "nowhere", "working directory {tmp}/nowhere does not exist"),
        ([sys.executable, "missing.py"], "project", "script {tmp}/project/missing.py does not"),
        (["no-such-program-rlsup"], "project", "program 'no-such-program-rlsup' is not on"),
        (["./bin/train"], "project", "program {tmp}/project/bin/train is not there"),
    ],
)
def test_a_command_not_on_the_host_ends_78_naming_the_path_and_the_host(
    node: Path, tmp_path: Path, argv: list[str], cwd: str, needle: str
) -> None:
    host = WorkerHost("g", 1, None)
    host.start_command(argv, str(tmp_path / cwd), env_of("g", tmp_path / "sup" / "g"))
    st = finish(host)
    assert st["rc"] == P.ExitCode.CONFIG
    error = json.loads(st["error"])
    assert error["pid"] == st["pid"] and error["kind"] == "command_missing"
    assert needle.format(tmp=tmp_path) in error["message"], error["message"]
    assert "on host h9" in error["message"] and "same absolute path" in error["message"]


def _commit(run_dir: Path, step: int, epoch: int) -> Any:
    store = CheckpointStore(run_dir / P.CHECKPOINT_DIR)
    with store.begin(step, {"sdk": 1, "name": "g", "epoch": epoch}) as writer:
        writer.write_bytes("state", str(step).encode())
        writer.commit()
    ref = store.latest()
    assert ref is not None and ref.step == step
    return ref


def test_the_host_restores_the_mirror_s_newest_over_a_superseded_placement_s(
    node: Path, tmp_path: Path, weed: Weed, request: pytest.FixtureRequest
) -> None:
    url, remote = remote_for(weed, request)
    mirror = {"url": url, "endpoint_url": weed.endpoint, "region": "us-east-1"}
    # The game ran at epoch 2 elsewhere (mirrored at step 300) after epoch 1 here (step 500).
    upload_checkpoint(remote, "g", _commit(tmp_path / "elsewhere", 300, 2), epoch=None)
    _commit(node / "runs" / "g", 500, 1)
    host = WorkerHost("g", 3, mirror)
    host.start_command([sys.executable, "train.py"], str(tmp_path / "project"),
                       env_of("g", tmp_path / "sup" / "g"))  # fmt: skip
    st = finish(host)
    assert st["rc"] == 0, host.log_path.read_text()
    seen = seen_by(host)
    assert seen["latest"] == "ckpt-000000000300", host.log_path.read_text()
    assert json.loads(seen["RLSUP_MIRROR_RESTORE"])["step"] == 300
    assert seen["RLSUP_MIRROR_URL"] == url and seen["RLSUP_EPOCH"] == "3"
    aside = node / "runs" / "g" / (P.CHECKPOINT_DIR + ".superseded")
    assert [p.name for p in aside.glob("ckpt-*")] == ["ckpt-000000000500"]
    assert json.loads(st["heartbeat"])["mirror_restore"]["step"] == 300

    # The next placement in place (epoch 4, the host's newest of epoch 3): kept, mirror unasked.
    _commit(node / "runs" / "g", 350, 3)
    again = WorkerHost("g", 4, {**mirror, "endpoint_url": "http://127.0.0.1:9"})
    again.start_command([sys.executable, "train.py"], str(tmp_path / "project"),
                        env_of("g", tmp_path / "sup" / "g"))  # fmt: skip
    # Its mirror answers nothing: the exit, not the final upload (given up after 45 s).
    assert again.wait_exit(60, early=True) == 0, again.log_path.read_text()
    seen = seen_by(again)
    assert seen["latest"] == "ckpt-000000000350" and "RLSUP_MIRROR_RESTORE" not in seen


def test_an_unreadable_mirror_is_no_start_from_zero(node: Path, tmp_path: Path) -> None:
    mirror = {"url": "s3://nowhere/p", "endpoint_url": "http://127.0.0.1:9", "region": "x"}
    host = WorkerHost("g", 1, mirror)
    env = {**env_of("g", tmp_path / "sup" / "g"), "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "x"}  # fmt: skip
    host.start_command([sys.executable, "train.py"], str(tmp_path / "project"), env)
    st = finish(host)
    assert st["rc"] == 1, host.log_path.read_text()
    error = json.loads(st["error"])
    assert error["kind"] == "checkpoint_unreadable" and "not starting from zero" in error["message"]
    assert not any(x.startswith("{") for x in host.log_path.read_text().splitlines())


def test_a_stop_lets_the_session_finish_its_checkpoint_then_a_kill_takes_all_of_it(
    node: Path, tmp_path: Path
) -> None:
    """SIGTERM to the program's group: a wrapper that dies of it at once leaves its child to
    write the final checkpoint, and the host waits for it (within the grace) before the final
    upload and the exit status; SIGKILL takes the whole session, what left the group too."""
    script = tmp_path / "project" / "slow_stop.py"
    script.write_text(textwrap.dedent(
        """
        import signal, sys, time, rlsup
        run = rlsup.attach(handle_signals=False)
        signal.signal(signal.SIGTERM, lambda *a: None)  # the child finishes its checkpoint
        print("ready", flush=True)
        time.sleep(1.5)
        with run.checkpoint(9) as d:
            (d / "state").write_text("9")
        print("saved", flush=True)
        """
    ))  # fmt: skip
    host = WorkerHost("g", 1, None)
    argv = ["sh", "-c", f'"{sys.executable}" slow_stop.py']
    info = host.start_command(argv, str(tmp_path / "project"), env_of("g", tmp_path / "s" / "g"))
    deadline = time.monotonic() + 30
    while "ready" not in host.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    host.signal(signal.SIGTERM)  # sh dies of it; its child writes on
    assert finish(host)["rc"] == -signal.SIGTERM
    assert "saved" in host.log_path.read_text(), "the final checkpoint was let finish"
    assert not sessions.members(info["pid"])

    again = WorkerHost("g2", 1, None)
    leaver = ["bash", "-c", "set -m; sleep 1000 & sleep 1000"]  # a job: a group of its own
    pid = again.start_command(leaver, None, env_of("g2", tmp_path / "s" / "g2"))["pid"]
    time.sleep(0.3)
    grouped = [p for p in sessions.members(pid) if os.getpgid(p) != pid]
    again.signal(signal.SIGKILL)
    assert again.wait_exit(30, early=True) == -signal.SIGKILL
    assert grouped and sessions.wait_empty([pid], 10), "the whole session went"
