"""The spare on several hosts, below Ray: the supervisor's bookkeeping of one spare actor per
live host (`RaySpares`, with the Ray calls faked: pure policy), and the host side for real (a
`WorkerHost` that is no game's yet warms a real standby worker process, which becomes a game's
real CartPole worker on `take`, or is stopped, or is replaced by a cold start when it died)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.runs import wait_for
from harness.seaweed import TEST_AWS_ENV
from supervisor.launch.ray.host import ACK_TIMEOUT_S, NODE_DIR_ENV, WARM_TIMEOUT_S, WorkerHost
from supervisor.launch.ray.spare import CHECK_EVERY_S, RaySpares
from supervisor.launch.spare import RESPAWN_BASE_S, STOP_GRACE_S, SpareWant
from supervisor.launch.spawn import process_argv
from training.args import WorkerConfig

pytestmark = pytest.mark.e2e

WANT = SpareWant(True, "enabled ([spare] enabled = true)")
HOSTS = {"h1": "node-1", "h2": "node-2"}


class FakeRef:
    def __init__(self, value: Any = None, error: Exception | None = None) -> None:
        self.value, self.error, self.ready = value, error, False


class FakeActor:
    def __init__(self, host: str, name: str) -> None:
        self.host, self.name = host, name
        self.warm_ref = FakeRef({"pid": 1000 + len(name), "device": "cpu", "warm_s": 2.5})
        self.checks: list[FakeRef] = []
        self.killed = False
        self.device = ""


class FakeRay:
    """The Ray calls RaySpares makes, answered by the test."""

    def __init__(self) -> None:
        self.actors: list[FakeActor] = []

    def create(self, host: str, node_id: str, name: str) -> FakeActor:
        assert HOSTS[host] == node_id
        actor = FakeActor(host, name)
        self.actors.append(actor)
        return actor

    def warm(self, actor: FakeActor, device: str) -> FakeRef:
        actor.device = device
        return actor.warm_ref

    def check(self, actor: FakeActor) -> FakeRef:
        ref = FakeRef("ready")
        ref.ready = True
        actor.checks.append(ref)
        return ref

    def done(self, ref: FakeRef) -> bool:
        return ref.ready

    def get(self, ref: FakeRef) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, actor: FakeActor) -> None:
        actor.killed = True

    def live(self, host: str) -> list[FakeActor]:
        return [a for a in self.actors if a.host == host and not a.killed]


def kinds(events: list[tuple[str, str | None, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(k, d.get("host", "")) for k, _, d in events]


def test_one_spare_per_live_host_ready_then_taken_then_replaced() -> None:
    ray = FakeRay()
    spares = RaySpares(ray, wall=lambda: 100.0)
    ev = spares.tend(WANT, HOSTS, 0.0)
    assert kinds(ev) == [("spare_enabled", ""), ("spare_spawned", "h1"), ("spare_spawned", "h2")]
    assert spares.row()["state"] == "warming" and spares.take("h1") is None, "not ready yet"
    ray.live("h1")[0].warm_ref.ready = True
    ev = spares.tend(WANT, HOSTS, 3.0)
    assert kinds(ev) == [("spare_ready", "h1")]
    assert ev[0][2]["ready_after_s"] == 3.0 and ev[0][2]["warm_s"] == 2.5
    row = spares.row()
    assert row["state"] == "ready" and "ready on h1; warming on h2" in row["reason"], row
    assert row["pid"] is None, "another host's process: no pid of this host"
    taken = spares.take("h1")
    assert taken is not None and taken.host == "h1" and spares.take("h1") is None
    assert not ray.live("h1")[0].killed, "the taken actor is the game's now"
    ev = spares.tend(WANT, HOSTS, 3.5)
    assert kinds(ev) == [("spare_spawned", "h1")], "the host's next spare starts at once"
    assert len(ray.live("h1")) == 2


def test_a_lost_spare_is_replaced_with_a_backoff_only_while_spares_die_before_ready() -> None:
    ray = FakeRay()
    spares = RaySpares(ray)
    spares.tend(WANT, {"h1": "node-1"}, 0.0)
    first = ray.actors[0]
    first.warm_ref.ready, first.warm_ref.error = True, RuntimeError("actor died")
    ev = spares.tend(WANT, {"h1": "node-1"}, 1.0)
    assert kinds(ev) == [("spare_lost", "h1")] and first.killed
    assert ev[0][2]["respawn_in_s"] == RESPAWN_BASE_S
    assert spares.tend(WANT, {"h1": "node-1"}, 1.0 + RESPAWN_BASE_S / 2) == []
    ev = spares.tend(WANT, {"h1": "node-1"}, 1.0 + RESPAWN_BASE_S)
    assert kinds(ev) == [("spare_spawned", "h1")]
    second = ray.actors[1]
    second.warm_ref.ready = True
    spares.tend(WANT, {"h1": "node-1"}, 5.0)
    # Ready: it is checked every CHECK_EVERY_S; a check that says its standby died drops it
    # and the next one starts at once (a ready spare that dies is no crash loop).
    spares.tend(WANT, {"h1": "node-1"}, 5.0 + CHECK_EVERY_S)
    [check] = second.checks
    check.value = "lost"
    ev = spares.tend(WANT, {"h1": "node-1"}, 5.0 + CHECK_EVERY_S + 0.1)
    assert kinds(ev) == [("spare_lost", "h1"), ("spare_spawned", "h1")], ev
    assert ev[0][2]["respawn_in_s"] == 0.0 and second.killed


def test_a_spare_that_never_gets_ready_is_replaced() -> None:
    ray = FakeRay()
    spares = RaySpares(ray)
    spares.tend(WANT, {"h1": "node-1"}, 0.0)
    assert spares.tend(WANT, {"h1": "node-1"}, WARM_TIMEOUT_S) == []
    ev = spares.tend(WANT, {"h1": "node-1"}, WARM_TIMEOUT_S + 11)
    assert kinds(ev) == [("spare_lost", "h1")] and ray.actors[0].killed
    assert "not ready within" in ev[0][2]["reason"]


def test_a_lost_host_takes_its_spare_and_unwanted_spares_are_stopped() -> None:
    ray = FakeRay()
    spares = RaySpares(ray)
    spares.tend(WANT, HOSTS, 0.0)
    ev = spares.tend(WANT, {"h2": "node-2"}, 1.0)
    assert kinds(ev) == [("spare_lost", "h1")] and ev[0][2]["reason"] == "host lost"
    off = SpareWant(False, "a preemption notice stands")
    ev = spares.tend(off, {"h2": "node-2"}, 2.0)
    assert kinds(ev) == [("spare_disabled", ""), ("spare_stopped", "h2")]
    assert all(a.killed for a in ray.actors) and spares.row()["state"] == "off"
    assert spares.tend(off, HOSTS, 3.0) == [], "none started while unwanted"
    spares.tend(WANT, HOSTS, 4.0)
    spares.close()
    assert all(a.killed for a in ray.actors), "no spare actor outlives the supervisor"


def test_no_new_spare_on_a_held_host_where_an_actor_just_died() -> None:
    """A host whose actors die is listed alive by Ray for seconds: a spare started there then
    is lost again at once (a second spare_lost for one death). Held hosts get none; a spare
    already there stays (a single actor's death says little of its host)."""
    ray = FakeRay()
    spares = RaySpares(ray)
    spares.tend(WANT, HOSTS, 0.0)
    h1, h2 = ray.live("h1")[0], ray.live("h2")[0]
    h1.warm_ref.ready, h1.warm_ref.error = True, RuntimeError("actor died")
    h2.warm_ref.ready = True
    ev = spares.tend(WANT, HOSTS, 1.0, hold={"h1", "h2"})
    assert kinds(ev) == [("spare_lost", "h1"), ("spare_ready", "h2")]
    assert spares.tend(WANT, HOSTS, 1.0 + RESPAWN_BASE_S, hold={"h1", "h2"}) == []
    assert not ray.live("h1") and ray.live("h2") == [h2]
    ev = spares.tend(WANT, HOSTS, 2.0 + RESPAWN_BASE_S)  # the doubt is over
    assert kinds(ev) == [("spare_spawned", "h1")]


def test_a_spare_serves_only_its_device_and_follows_the_wanted_one() -> None:
    ray = FakeRay()
    spares = RaySpares(ray)
    spares.tend(WANT, {"h1": "node-1"}, 0.0)
    first = ray.actors[0]
    assert first.device == "cpu"
    first.warm_ref.ready = True
    spares.tend(WANT, {"h1": "node-1"}, 1.0)
    assert spares.take("h1", "cuda") is None, "a CPU spare never becomes a CUDA worker"
    cuda = SpareWant(True, "auto", device="cuda")
    ev = spares.tend(cuda, {"h1": "node-1"}, 2.0)
    assert kinds(ev) == [("spare_stopped", "h1"), ("spare_spawned", "h1")]
    assert ev[0][2]["reason"] == "device now cuda" and first.killed
    second = ray.actors[1]
    assert second.device == "cuda"
    # Asked for cuda on a host without a GPU, it warms the CPU: it serves auto and cpu games.
    second.warm_ref.value = {"pid": 7, "device": "cpu", "warm_s": 1.0}
    second.warm_ref.ready = True
    spares.tend(cuda, {"h1": "node-1"}, 3.0)
    assert spares.take("h1", "cuda") is None
    assert spares.take("h1", "auto") is not None


# ---- the host side, for real (no Ray: WorkerHost is a plain class) -------------------------


def cartpole(total_steps: int = 2048) -> dict[str, Any]:
    cfg = WorkerConfig(
        game="CartPole-v1", algo="ppo", num_envs=2, n_steps=64, batch_size=64, epochs=1,
        total_steps=total_steps, seed=3, device="cpu", threads=1, eval_episodes=0,
        checkpoint_every_s=60, tensorboard=False,
    )  # fmt: skip
    return cfg.to_json()


def standby_pids(node: Path) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        cmd = process_argv(p.info["cmdline"] or [])
        if "--standby" in cmd and p.info["cwd"] == str(node) and p.info["status"] != "zombie":
            out.append(p.pid)
    return out


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(NODE_DIR_ENV, str(tmp_path / "node"))
    monkeypatch.setenv("RLSUP_HOST", "h9")
    # As in a Ray actor: Ray's workers carry SPT_NOENV, which limits a process title to its
    # own command line's length unless the standby is started without it.
    monkeypatch.setenv("SPT_NOENV", "1")
    (tmp_path / "node").mkdir(mode=0o700)
    return tmp_path / "node"


def test_a_warmed_host_becomes_a_game_s_worker_exactly_as_a_cold_one(node: Path) -> None:
    host = WorkerHost("", 0, None)
    info = host.warm()
    assert info["host"] == "h9" and info["device"] == "cpu" and info["warm_s"] > 0
    assert host.spare_state() == "ready" and standby_pids(node) == [info["pid"]]
    assert host.status()["game"] == "" and host.status()["rc"] is None
    t0 = time.monotonic()
    started = host.take("g1", 7, None, cartpole())
    took = time.monotonic() - t0
    assert started["served"] == "spare" and started["pid"] == info["pid"], started
    assert took < 2.0, f"the hand-over took {took:.2f} s"
    # The same process, now the cold worker's command line (set just after its
    # acknowledgement), in the game's run dir.
    cmd = wait_for(
        lambda: (
            (c := process_argv(psutil.Process(started["pid"]).cmdline()))
            and "--standby" not in c
            and c
        ),
        30,
        "the cold worker's command line",
    )
    assert "training.worker" in cmd
    assert cmd[cmd.index("--run-dir") + 1] == str(node / "runs" / "g1")
    assert cmd[cmd.index("--epoch") + 1] == "7"
    wait_for(lambda: host.status()["rc"] is not None, 240, "the worker finished")
    st = host.status()
    assert st["rc"] == 0 and st["game"] == "g1" and st["epoch"] == 7, st
    hb = json.loads(st["heartbeat"])
    assert hb["global_step"] >= 2048 and hb["pid"] == info["pid"]
    assert '"event": "done"' in (node / "logs" / "g1.log").read_text()
    assert not standby_pids(node)


def test_an_exit_is_told_at_once_while_its_final_checkpoint_is_still_being_mirrored(
    node: Path, silent_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor hears a worker's exit as it happens (`wait_exit(early=True)`, `exited`)
    and restarts the game in place, where the checkpoint it committed last lies; `rc`, which
    a stop and a move wait for, comes once that checkpoint is mirrored. Here the mirror never
    answers: the exit is still told at once."""
    for key, value in TEST_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    mirror = {"url": "s3://rlsup-test/early", "endpoint_url": silent_endpoint, "region": None}
    host = WorkerHost("g4", 1, mirror)
    host.start(cartpole(total_steps=256))
    assert host.wait_exit(240, early=True) == 0
    st = host.status()
    assert st["exited"] == 0 and st["rc"] is None, "its final checkpoint is not mirrored yet"
    assert host.wait_exit(0.2) is None
    assert (node / "runs" / "g4" / "checkpoints").is_dir()


def test_an_idle_spare_asked_to_stop_stops_its_standby(node: Path) -> None:
    host = WorkerHost("", 0, None)
    pid = host.warm()["pid"]
    host.signal(int(signal.SIGTERM))
    assert host.status()["rc"] == 0 and host.spare_state() == "lost"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_standby_that_died_is_replaced_by_a_cold_start_on_take(node: Path) -> None:
    host = WorkerHost("", 0, None)
    pid = host.warm()["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: host.spare_state() == "lost", 10, "the dead standby seen")
    t0 = time.monotonic()
    started = host.take("g2", 1, None, cartpole(total_steps=256))
    assert started["served"] == "cold" and started["pid"] != pid
    assert time.monotonic() - t0 < 2.0, "no wait for an acknowledgement that cannot come"
    wait_for(lambda: host.status()["rc"] is not None, 240, "the cold worker finished")
    assert host.status()["rc"] == 0


def test_a_standby_that_cannot_acknowledge_is_stopped_and_the_game_starts_cold(
    node: Path,
) -> None:
    host = WorkerHost("", 0, None)
    pid = host.warm()["pid"]
    os.kill(pid, signal.SIGSTOP)  # wedged: it never reads the assignment
    t0 = time.monotonic()
    started = host.take("g3", 1, None, cartpole(total_steps=256))
    took = time.monotonic() - t0
    assert started["served"] == "cold" and started["pid"] != pid
    assert ACK_TIMEOUT_S <= took < ACK_TIMEOUT_S + STOP_GRACE_S, took
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    wait_for(lambda: host.status()["rc"] is not None, 240, "the cold worker finished")
    assert host.status()["rc"] == 0
