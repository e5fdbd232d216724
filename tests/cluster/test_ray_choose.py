"""Where the Ray launcher places a game, with Ray's node list at the seam (no cluster): a
crash restarts on the host it ran on; an actor that died (its host may be dying, while Ray's
health check still lists the node alive for seconds) sends the game to another host."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from harness.runs import write_config
from supervisor.config import load_config
from supervisor.launch.process import HOST_LOST_RC
from supervisor.launch.ray import HOST_LABEL, RayLauncher, RayWorkerProcess
from supervisor.launch.spawn import NoRoom

pytestmark = pytest.mark.e2e


def _node(host: str, cpus: float = 4.0, alive: bool = True) -> dict[str, Any]:
    return {"NodeID": f"node-{host}", "Alive": alive, "Labels": {HOST_LABEL: host},
            "Resources": {"CPU": cpus}}  # fmt: skip


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RayLauncher:
    path = write_config(tmp_path, [("g", 1000)])
    path.write_text(
        path.read_text()
        + '[mirror]\nurl = "s3://rlsup-test/choose"\n'
        + '[cluster]\nbackend = "ray"\nhost_lost_after_s = 30\n'
    )
    launcher = RayLauncher(load_config(path))
    nodes = [_node("h1"), _node("h2")]
    monkeypatch.setattr(launcher, "_nodes", lambda: nodes)
    killed: list[Any] = []
    monkeypatch.setattr(launcher._spare_api, "kill", killed.append)  # no Ray to kill in
    return launcher


def _ended_on(
    launcher: RayLauncher, host: str, rc: int, draining: bool = False
) -> RayWorkerProcess:
    proc = RayWorkerProcess(
        popen=None,  # type: ignore[arg-type]
        pidfd=-1, create_time=time.time(), started_mono=time.monotonic(),
        game="g", host=host, node_id=f"node-{host}", returncode=rc, draining=draining,
    )  # fmt: skip
    launcher.placed["g"] = proc
    launcher.forget(proc)
    return proc


def test_a_crash_restarts_on_the_host_it_ran_on(launcher: RayLauncher) -> None:
    assert launcher._choose("g")[0] == "h1"  # equal hosts: the first by name
    _ended_on(launcher, "h2", 1)
    assert launcher._choose("g")[:2] == ("h2", "node-h2")


def test_a_dead_actor_sends_the_game_to_another_host_while_its_node_still_looks_alive(
    launcher: RayLauncher,
) -> None:
    _ended_on(launcher, "h1", HOST_LOST_RC)
    assert launcher._choose("g")[0] == "h2"  # h1 sorts first and is still listed alive


def test_a_doubted_host_is_used_when_nothing_else_has_room_and_the_doubt_expires(
    launcher: RayLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ended_on(launcher, "h1", HOST_LOST_RC)
    monkeypatch.setattr(launcher, "_nodes", lambda: [_node("h1")])
    assert launcher._choose("g")[0] == "h1"  # the only host: better than no placement
    monkeypatch.setattr(launcher, "_nodes", lambda: [_node("h1"), _node("h2")])
    launcher.hosts.doubted["h1"] -= 31  # host_lost_after_s later, still alive: a healthy host
    assert launcher._choose("g")[0] == "h1"


def test_a_game_leaves_a_host_only_once_its_last_checkpoint_there_is_mirrored(
    launcher: RayLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that exited by itself is restarted at once while its actor mirrors the
    checkpoint it committed last (`draining`). In place nothing waits for that upload (the
    checkpoint is on that host); a move to another host does, or it would resume from an
    older one. `_drained` (the actor's answer) is the seam."""
    proc = _ended_on(launcher, "h1", 1, draining=True)
    assert launcher.draining["g"].proc is proc
    assert launcher._choose("g")[0] == "h1"
    monkeypatch.setattr(launcher, "_drained", lambda d, wait_s: False)
    launcher._settle("g", "h1", cold=False)  # in place: at once
    with pytest.raises(NoRoom, match="moves from h1 to h2 once the checkpoint"):
        launcher._settle("g", "h2", cold=False)
    monkeypatch.setattr(launcher, "_drained", lambda d, wait_s: True)
    launcher._settle("g", "h2", cold=False)


def test_a_final_upload_given_up_is_an_event_and_one_in_place_is_not(
    launcher: RayLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "_nodes", lambda: [])
    first = _ended_on(launcher, "h1", 1, draining=True)
    first.report = {"mirror_step": 4096}
    launcher._end_draining(launcher.draining["g"], "not mirrored within 45 s")
    [(kind, game, detail)] = launcher.observe(time.monotonic())
    assert (kind, game) == ("final_upload_missed", "g")
    assert detail == {"host": "h1", "epoch": 0, "reason": "not mirrored within 45 s",
                      "mirror_step": 4096}  # fmt: skip
    monkeypatch.setattr(launcher, "_drained", lambda d, wait_s: False)  # still uploading
    _ended_on(launcher, "h1", 1, draining=True)
    _ended_on(launcher, "h1", 1, draining=True)  # the newer one replaces it, in place
    assert launcher.observe(time.monotonic() + 10) == [] and "g" in launcher.draining
