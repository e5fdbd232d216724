"""Several hosts on a real Ray cluster (loopback: a head and two or three hosts, each its own
raylet and run dir) with a real mirror (SeaweedFS): `rlsup run` places real CartPole workers
on the hosts; a host is killed (every process of its node SIGKILLed) and its game must resume on
a surviving host from the mirror, never below the last mirrored step and never with two
workers at once; a killed supervisor's successor stops the actors it left before placing any
game again."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.ray_cluster import (
    LoopbackCluster,
    MostAtOnce,
    worker_processes,
)
from harness.runs import (
    events,
    heartbeat,
    rlsup,
    spare_ready_now,
    start_supervisor,
    stop_supervisor,
    wait_for,
)
from harness.seaweed import Weed
from tests.cluster.conftest import mirror_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]
pytest.importorskip("ray", reason="the ray extra (make test installs it)")

DQN_ARGS = (
    "args = { eval_episodes = 0, buffer_size = 5000, learning_starts = 500,"
    " replay_chunk_kib = 64 }\n"
)


def write_cluster_config(
    tmp: Path, lc: LoopbackCluster, weed: Weed, url: str, games: list[str], extra: str = ""
) -> Path:
    text = (
        'state_dir = "state"\ncheckpoint_every_s = 1\nstop_grace_s = 30\ntick_s = 0.5\n'
        "[modes.light]\nnum_envs = 4\nbatch_size = 64\nn_steps = 64\nmax_concurrent = 4\n"
        + "".join(
            f'[[games]]\nname = "{g}"\nenv_id = "CartPole-v1"\nalgo = "dqn"\n'
            f'total_steps = 50000000\nseed = {i + 1}\ndevice = "cpu"\n{DQN_ARGS}'
            for i, g in enumerate(games)
        )
        + "[restart]\nbackoff_base_s = 0.3\nbackoff_max_s = 1\nbudget = 5\n"
        "budget_window_s = 600\nstable_after_s = 30\n"
        "[watchdog]\nstartup_grace_s = 120\nhang_timeout_s = 60\nkill_grace_s = 10\n"
        f'[mirror]\nurl = "{url}"\nendpoint_url = "{weed.endpoint}"\nkeep = 3\n'
        f'[cluster]\nbackend = "ray"\naddress = "{lc.address}"\nhost_lost_after_s = 15\n' + extra
    )
    path = tmp / "rlsup.toml"
    path.write_text(text)
    return path


def placements(state: Path, game: str) -> list[dict[str, Any]]:
    """Every start of the game's worker, oldest first: its host and placement epoch."""
    return [
        e["detail"]
        for e in events(state, None, game)
        if e["detail"].get("to") == "starting" and "host" in e["detail"]
    ]


def resumed_hb(state: Path, pid: int) -> dict[str, Any] | None:
    """The game's heartbeat once the worker `pid` has resumed from a checkpoint."""
    hb = heartbeat(state, "g1")
    return hb if hb and hb["pid"] == pid and hb["resumed_from_step"] is not None else None


def test_two_hosts_a_dead_host_moves_its_game_which_resumes_from_the_mirror(
    two_hosts: LoopbackCluster,
    weed: Weed,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    ray_env: dict[str, str],
) -> None:
    lc = two_hosts
    url, remote = mirror_for(weed, request)
    config = write_cluster_config(tmp_path, lc, weed, url, ["g1"])
    state = tmp_path / "state"
    sup = start_supervisor(config, ray_env)
    watch = MostAtOnce(lambda: len(worker_processes(lc.root, "g1")), 0.1)
    try:
        [first] = wait_for(lambda: placements(state, "g1"), 120, "g1 placed on a host")
        wait_for(lambda: len(remote.manifest_steps("g1")) >= 2, 180, "2 mirrored checkpoints")
        hb = heartbeat(state, "g1")  # relayed from the host into the supervisor's run dir
        assert hb is not None and hb["host"] == first["host"] and hb["pid"] == first["pid"]
        wait_for(lambda: events(state, "mirror_ok", "g1"), 30, "mirror_ok from the host")
        out = rlsup("status", "--json", "--config", str(config), env=ray_env)
        [g] = json.loads(out.stdout)["games"]
        assert g["host"] == first["host"] and g["mirror_step"] is not None, g
        assert g["pid_alive"] is None and g["sps"], "a remote worker: its heartbeat tells"

        lc.kill_host(first["host"])
        mirrored = remote.manifest_steps("g1")[-1]  # nothing uploads from a dead host
        assert remote.get_fence("g1") == first["epoch"]

        moved = wait_for(lambda: placements(state, "g1")[1:], 120, "g1 placed again")[0]
        survivor = "h2" if first["host"] == "h1" else "h1"
        assert moved["host"] == survivor
        assert moved["epoch"] > first["epoch"] and remote.get_fence("g1") == moved["epoch"]
        resumed = wait_for(lambda: resumed_hb(state, moved["pid"]), 180, "the moved worker resumed")
        assert resumed["resumed_from_step"] >= mirrored, (resumed, mirrored)
        assert resumed["mirror_restore"]["step"] == resumed["resumed_from_step"]

        # The ledger's node_lost comes with the next look at the nodes (every 2 s), which may
        # be after the moved worker resumed (from the host's spare: a second after the kill).
        lost = wait_for(lambda: events(state, "node_lost"), 30, "node_lost")
        assert [e["detail"]["host"] for e in lost] == [first["host"]]
        assert lost[0]["detail"]["games"] == ["g1"]
        [exit_] = [e for e in events(state, None, "g1") if e["detail"].get("to") == "exited"]
        assert exit_["detail"]["exit"] == "host_lost"
        assert not events(state, "worker_crash") and not events(state, "restart")
        # It trains on: its next checkpoint reaches the mirror from the surviving host.
        wait_for(lambda: remote.manifest_steps("g1")[-1] > resumed["resumed_from_step"], 120,
                 "a checkpoint of the moved game mirrored")  # fmt: skip
        # The dead host comes back from a reboot (a new boot id): the ledger says so.
        lc.add_host(first["host"], boot=2)
        [reboot] = wait_for(lambda: events(state, "node_reboot"), 60, "node_reboot")
        assert not events(state, "host_reboot"), "the supervisor's own host did not reboot"
        assert reboot["detail"]["host"] == first["host"]
        assert reboot["detail"]["previous_boot_id"] == f"boot-{first['host']}-1"
        assert reboot["detail"]["boot_id"] == f"boot-{first['host']}-2"
        assert placements(state, "g1")[1:] == [moved], "the game stays where it moved"
    finally:
        stop_supervisor(sup)
        most = watch.stop()
    assert sup.returncode == 0
    assert most == 1, f"{most} workers of g1 ran at once"
    assert not worker_processes(lc.root, "g1"), "the supervisor stopped the worker it placed"


def test_three_hosts_the_game_of_a_dead_host_goes_to_the_free_one(
    three_hosts: LoopbackCluster,
    weed: Weed,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    ray_env: dict[str, str],
) -> None:
    lc = three_hosts
    url, remote = mirror_for(weed, request)
    config = write_cluster_config(tmp_path, lc, weed, url, ["g1", "g2"])
    state = tmp_path / "state"
    sup = start_supervisor(config, ray_env)
    try:
        [p1] = wait_for(lambda: placements(state, "g1"), 120, "g1 placed")
        [p2] = wait_for(lambda: placements(state, "g2"), 120, "g2 placed")
        assert p1["host"] != p2["host"], "spread: one game per host while hosts are free"
        wait_for(lambda: remote.manifest_steps("g1"), 180, "g1 mirrored")
        lc.kill_host(p1["host"])
        mirrored = remote.manifest_steps("g1")[-1]
        moved = wait_for(lambda: placements(state, "g1")[1:], 120, "g1 placed again")[0]
        [free] = {"h1", "h2", "h3"} - {p1["host"], p2["host"]}
        assert moved["host"] == free
        resumed = wait_for(lambda: resumed_hb(state, moved["pid"]), 180, "g1 resumed")
        assert resumed["resumed_from_step"] >= mirrored
        assert placements(state, "g2") == [p2], "the game on a healthy host is left alone"
        lost = wait_for(lambda: events(state, "node_lost"), 30, "node_lost")
        assert [e["detail"]["host"] for e in lost] == [p1["host"]]
        joined = sorted(e["detail"]["host"] for e in events(state, "node_joined"))
        assert joined == ["h1", "h2", "h3"]
        doc = json.loads(rlsup("status", "--json", "--config", str(config), env=ray_env).stdout)
        nodes = {n["host"]: n for n in doc["nodes"]}
        assert nodes[p1["host"]]["lost"] == 1 and not nodes[p1["host"]]["alive"]
        assert nodes[free]["games"] == ["g1"] and nodes[p2["host"]]["games"] == ["g2"]
        human = rlsup("status", "--config", str(config), env=ray_env).stdout
        assert f"{p1['host']} DOWN (no game, lost 1x)" in human, human
    finally:
        stop_supervisor(sup)
    assert sup.returncode == 0


def test_a_killed_supervisor_s_successor_stops_its_actors_before_placing_again(
    two_hosts: LoopbackCluster,
    weed: Weed,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    ray_env: dict[str, str],
) -> None:
    lc = two_hosts
    url, remote = mirror_for(weed, request)
    config = write_cluster_config(tmp_path, lc, weed, url, ["g1"])
    state = tmp_path / "state"
    sup = start_supervisor(config, ray_env)
    watch = MostAtOnce(lambda: len(worker_processes(lc.root, "g1")), 0.1)
    try:
        [first] = wait_for(lambda: placements(state, "g1"), 120, "g1 placed")
        wait_for(lambda: remote.manifest_steps("g1"), 180, "g1 mirrored")
        sup.send_signal(signal.SIGKILL)
        sup.wait(30)
        time.sleep(2)
        assert len(worker_processes(lc.root, "g1")) == 1, "its detached actor runs on"

        sup = start_supervisor(config, ray_env)
        [stopped] = wait_for(lambda: events(state, "leftovers_stopped"), 120, "leftovers")
        actors = stopped["detail"]["actors"]
        assert [a for a in actors if not a.startswith("spare@")] == [f"g1@{first['epoch']}"]
        # The hosts' idle spares (detached actors) were the predecessor's leftovers too.
        assert all(a.split("#")[0] in ("spare@h1", "spare@h2") for a in actors[1:]), actors
        second = wait_for(lambda: placements(state, "g1")[1:], 120, "g1 placed again")[0]
        assert second["epoch"] == first["epoch"] + 1
        resumed = wait_for(lambda: resumed_hb(state, second["pid"]), 180, "g1 resumed")
        # The leftover stopped with a final checkpoint, mirrored before it was killed.
        assert resumed["resumed_from_step"] >= remote.manifest_steps("g1")[0]
        log = (lc.node_dir(first["host"]) / "logs" / "g1.log").read_text()
        assert '"stop_requested"' in log or "stop_requested" in log
    finally:
        stop_supervisor(sup)
        most = watch.stop()
    assert most == 1, f"{most} workers of g1 ran at once"
    assert json.loads((state / "runs" / "g1" / "heartbeat.json").read_text())["host"]


def ready_spare(state: Path, host: str, after: int = 0) -> dict[str, Any] | None:
    """The newest `spare_ready` of `host` recorded after event id `after`."""
    found = [e for e in events(state, "spare_ready") if e["detail"].get("host") == host]
    found = [e for e in found if e["id"] > after]
    return found[-1] if found else None


def test_each_host_keeps_a_spare_that_serves_a_crash_and_a_dead_host_s_game(
    two_hosts: LoopbackCluster,
    weed: Weed,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    ray_env: dict[str, str],
) -> None:
    lc = two_hosts
    url, remote = mirror_for(weed, request)
    spare_on = "[spare]\nenabled = true\n"
    config = write_cluster_config(tmp_path, lc, weed, url, ["g1"], extra=spare_on)
    state = tmp_path / "state"
    sup = start_supervisor(config, ray_env)
    watch = MostAtOnce(lambda: len(worker_processes(lc.root, "g1")), 0.1)
    try:
        [first] = wait_for(lambda: placements(state, "g1"), 120, "g1 placed")
        assert first["served"] == "cold", "no spare is ready at the very first start"
        for host in ("h1", "h2"):
            wait_for(lambda h=host: ready_spare(state, h), 180, f"a spare ready on {host}")
        wait_for(lambda: resumed_hb(state, first["pid"]) or heartbeat(state, "g1"), 60, "hb")
        doc = json.loads(rlsup("status", "--json", "--config", str(config), env=ray_env).stdout)
        assert {n["host"]: n["spare"] for n in doc["nodes"]} == {"h1": "ready", "h2": "ready"}
        assert doc["spare"]["state"] == "ready" and "ready on h1, h2" in doc["spare"]["reason"]

        # A worker crash on its host: the spare of the host it is placed on next takes it.
        [proc] = worker_processes(lc.root, "g1")
        proc.send_signal(signal.SIGKILL)
        again = wait_for(lambda: placements(state, "g1")[1:], 60, "g1 restarted")[0]
        assert again["served"] == "spare", again
        assert not events(state, "leftovers_stopped")
        started = wait_for(
            lambda: [e for e in events(state, "worker_training", "g1")
                     if e["detail"]["pid"] == again["pid"]],
            120, "the spare-served worker training",
        )[0]["detail"]  # fmt: skip
        assert started["served"] == "spare"
        crash = [e for e in events(state, None, "g1") if e["detail"].get("to") == "exited"]
        assert crash and crash[-1]["detail"]["exit"] != "host_lost"
        # Restarted at once; whatever the old actor still had to mirror it mirrored behind the
        # restart (or the new placement did): nothing given up.
        assert not events(state, "final_upload_missed")

        # Its host dies: the game moves to the other host, whose spare takes it and resumes
        # from the mirror.
        wait_for(lambda: len(remote.manifest_steps("g1")) >= 2, 180, "mirrored checkpoints")
        after = max(e["id"] for e in events(state, None))
        other = "h2" if again["host"] == "h1" else "h1"
        wait_for(lambda: ready_spare(state, other) is not None, 180, f"a spare on {other}")
        lc.kill_host(again["host"])
        mirrored = remote.manifest_steps("g1")[-1]
        moved = wait_for(lambda: placements(state, "g1")[2:], 120, "g1 placed again")[0]
        assert moved["host"] == other and moved["served"] == "spare", moved
        resumed = wait_for(lambda: resumed_hb(state, moved["pid"]), 180, "moved worker resumed")
        assert resumed["resumed_from_step"] >= mirrored
        lost = [e["detail"] for e in events(state, "spare_lost") if e["id"] > after]
        # Its spare went with it (seen as the host lost, or as its actor dead first).
        assert [d["host"] for d in lost] == [again["host"]], lost
        assert not events(state, "worker_crash") or all(
            e["detail"].get("pid") != moved["pid"] for e in events(state, "worker_crash")
        )

        # The dead host comes back; a crash on the host the game moved to restarts it there
        # (its checkpoints and its spare are there), not on the host that sorts first.
        lc.add_host(again["host"], boot=2)
        for host in ("h1", "h2"):
            wait_for(lambda h=host: spare_ready_now(state, h), 180, f"a spare ready on {host}")
        [proc] = worker_processes(lc.root, "g1")
        proc.send_signal(signal.SIGKILL)
        third = wait_for(lambda: placements(state, "g1")[3:], 60, "g1 restarted")[0]
        assert third["host"] == moved["host"] and third["served"] == "spare", third
        resumed = wait_for(lambda: resumed_hb(state, third["pid"]), 120, "resumed in place")
        assert resumed["resumed_from_step"] >= remote.manifest_steps("g1")[0]
    finally:
        stop_supervisor(sup)
        most = watch.stop()
    assert sup.returncode == 0
    assert most == 1, f"{most} workers of g1 ran at once"
    assert not worker_processes(lc.root, "g1")

    def standbys() -> list[int]:
        out = []
        for p in psutil.process_iter(["cmdline", "cwd", "status"]):
            cmd = " ".join(p.info["cmdline"] or [])
            here = str(p.info["cwd"] or "").startswith(str(lc.root))
            if "--standby" in cmd and here and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        return out

    wait_for(lambda: not standbys(), 30, "no spare outliving the supervisor")
