"""The supervisor on a host that misbehaves: a locked state database, a failed pidfd, a game
removed and re-added while its worker stops, wall-clock steps, a missing boot id, a FIFO or a
symlink where a state file should be. Real (torch-free) stand-in workers, the in-process
supervisor's tick loop, fakes only at the clocks."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.runs import REPO, FakeNvml, close_supervisors, spin
from supervisor.config import load_config
from supervisor.daemon import Supervisor, acquire_lock
from supervisor.launch.launcher import Launcher
from supervisor.launch.process import same_process, start_ticks
from supervisor.launch.spawn import find_leftover
from supervisor.ledger import db
from supervisor.lifecycle.states import WorkerState as S
from training import protocol

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

CONFIG = """\
state_dir = "state"
stop_grace_s = 10
tick_s = 0.05
initial_mode = "heavy"
[modes.light]
num_envs = 2
batch_size = 2
n_steps = 4
max_concurrent = 4
[modes.heavy]
num_envs = 4
batch_size = 4
n_steps = 4
max_concurrent = 4
{games}
[restart]
backoff_base_s = 0.05
backoff_max_s = 0.1
budget = 50
budget_window_s = 600
[watchdog]
startup_grace_s = 10
hang_timeout_s = 1.5
kill_grace_s = 1
[stability]
cooldown_s = 1
calm_s = 3600
window_s = 3600
"""


def game(name: str) -> str:
    return f'[[games]]\nname = "{name}"\nenv_id = "CartPole-v1"\ntotal_steps = 1000000000\n'


class Wall:
    """The wall clock, steppable: what `date -s` does to time.time()."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Supervisor]]:
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    made: list[Supervisor] = []

    def factory(
        games: str, scripts: dict[str, dict[str, Any]] | None = None, **kw: Any
    ) -> Supervisor:
        path = tmp_path / "rlsup.toml"
        path.write_text(kw.pop("top", "") + CONFIG.format(games=games))
        for name, script in (scripts or {}).items():
            run = tmp_path / "state" / "runs" / name
            run.mkdir(parents=True, exist_ok=True)
            (run / "fake.json").write_text(json.dumps(script))
        sup = Supervisor(
            load_config(path),
            launcher=kw.pop("launcher", None)
            or Launcher(python=sys.executable, module="tests.supervisor.fake_worker"),
            cores=4,
            gpu_probe=FakeNvml(None),
            **kw,
        )
        sup.start()
        made.append(sup)
        return sup

    yield factory
    close_supervisors(made)


def evs(sup: Supervisor, kind: str, game: str | None = None) -> list[db.Event]:
    assert sup.on.journal is not None and sup.on.conn is not None
    sup.on.journal.flush(force=True)
    return db.events(sup.on.conn, kind=kind, game=game)


def fake_workers(game_name: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        mine = any(part.endswith(f"/runs/{game_name}") for part in cmd)
        if mine and "tests.supervisor.fake_worker" in cmd and p.info["status"] != "zombie":
            out.append(p.pid)
    return out


# ---- a state database that fails ----------------------------------------------------------


def test_a_hung_worker_is_signalled_while_the_database_is_locked(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a"))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING and sup.games["a"].progressed)
    pid = sup.games["a"].proc.pid
    locker = sqlite3.connect(sup.cfg.state_dir / db.DB_NAME, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # an operator's sqlite3 shell, say
    try:
        os.kill(pid, signal.SIGSTOP)
        spin(sup, lambda: (rt := sup.games["a"]).proc is None or rt.proc.pid != pid, timeout=30)
        assert not same_process(pid, None), "signalled, exited and reaped"
        assert not sup.on.journal.healthy, "the hang was handled while no row could be written"
    finally:
        locker.execute("COMMIT")
        locker.close()
    spin(sup, lambda: sup.games["a"].state is S.RUNNING and sup.on.journal.healthy)
    [hang] = evs(sup, "worker_hang", "a")
    assert hang.detail["pid"] == pid
    assert evs(sup, "state_db_unavailable")


# ---- no process escapes supervision --------------------------------------------------------


def test_a_failed_pidfd_leaves_no_child_running(make, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = os.pidfd_open
    failures = {"left": 1}
    spawned: list[int] = []

    def flaky(pid: int, flags: int = 0) -> int:
        spawned.append(pid)
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real(pid, flags)

    monkeypatch.setattr(os, "pidfd_open", flaky)
    sup = make(game("a"))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    first = spawned[0]
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    assert fake_workers("a") == [sup.games["a"].proc.pid], "exactly one worker, tracked"
    reasons = [e.detail["reason"] for e in evs(sup, "backoff", "a")]
    assert reasons and "Too many open files" in reasons[0]


def test_a_game_removed_and_readded_while_it_stops_never_has_two_workers(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a") + game("b"), scripts={"a": {"stop_delay_s": 1.5}})
    spin(sup, lambda: all(rt.state is S.RUNNING for rt in sup.games.values()))
    old = sup.games["a"].proc.pid
    text = sup.cfg.path.read_text()
    sup.cfg.path.write_text(text.replace(game("a"), ""))
    sup.flags.reload = True
    spin(sup, lambda: sup.games.get("a") is None and "a" in sup.removed)
    sup.cfg.path.write_text(text)  # the operator changes their mind at once
    sup.flags.reload = True
    most = 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        most = max(most, len(fake_workers("a")))
        rt = sup.games.get("a")
        if rt is not None and rt.state is S.RUNNING and rt.proc is not None and rt.proc.pid != old:
            break
        sup.safe_tick()
        sup.wait(0.02)
    assert sup.games["a"].proc.pid != old, "a new worker once the old one stopped"
    assert most == 1, "two workers for one game at once"
    assert not sup.games["a"].failures


# ---- clocks, identity and boot ids ------------------------------------------------------


def test_a_backward_wall_clock_step_does_not_suppress_a_step_down(make) -> None:  # type: ignore[no-untyped-def]
    wall = Wall()
    sup = make(game("a"), scripts={"a": {"exit": 1, "kind": "crash", "message": "boom"}}, wall=wall)
    wall.offset = -600.0  # `date -s` ten minutes back, right after the start set the mode
    spin(sup, lambda: bool(evs(sup, "scale_down", "a")), timeout=40)
    down = evs(sup, "scale_down", "a")[0].detail
    assert (down["from"], down["to"]) == ("heavy", "light")
    assert re.match(r"a failed \d+ times", down["reasons"][0])


def test_a_forward_wall_clock_step_still_reads_the_workers_error(make) -> None:  # type: ignore[no-untyped-def]
    wall = Wall()
    wall.offset = 600.0  # the host's clock is ten minutes ahead of the files' times
    sup = make(game("a"), scripts={"a": {"exit": 78, "message": "--lr: must be > 0"}}, wall=wall)
    spin(sup, lambda: sup.games["a"].state is S.FATAL)
    assert "--lr: must be > 0" in sup.games["a"].reason


def test_process_identity_is_pid_plus_start_ticks_since_boot() -> None:
    ticks = start_ticks(os.getpid())
    assert ticks == int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert same_process(os.getpid(), ticks)
    assert not same_process(os.getpid(), ticks + 1), "a reused pid is another process"
    child = psutil.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        t = start_ticks(child.pid)
        assert t is not None and same_process(child.pid, t)
        assert find_leftover(child.pid, t) is None, "not a training worker: never signalled"
    finally:
        child.kill()
        child.wait()
    assert start_ticks(child.pid) is None and not same_process(child.pid, t)


def test_a_missing_boot_id_falls_back_and_the_supervisor_starts(
    make, monkeypatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "no-such-file"))
    sup = make(game("a"))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    assert sup.boot_id.startswith("init-start-")
    [start] = evs(sup, "supervisor_start")
    assert start.detail["boot_id"] == sup.boot_id


class _UnreachableBackend(Launcher):
    """A launcher whose backend cannot be reached at start (a Ray head down at boot)."""

    def connect(self) -> None:
        raise OSError(errno.ECONNREFUSED, "the cluster's head does not answer")


def test_a_start_that_fails_after_a_reboot_still_records_the_reboot_once(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The first start after an unexpected reboot dies before it is up (its backend is not
    reachable; systemd restarts it): the ledger must still say the host rebooted, exactly once.
    It used to record the new boot first and the event later, so the next start found the boot
    already known, took it for a supervisor crash, and the reboot was lost."""
    from supervisor.daemon import StartFailed

    first = make(game("a"))
    spin(first, lambda: first.games["a"].state is S.RUNNING)
    first.close()  # no clean stop: the power is cut
    (tmp_path / "boot").write_text("boot-2")
    cfg = load_config(tmp_path / "rlsup.toml")
    failing = Supervisor(
        cfg,
        launcher=_UnreachableBackend(python=sys.executable, module="tests.supervisor.fake_worker"),
        cores=4,
        gpu_probe=FakeNvml(None),
    )
    with pytest.raises(StartFailed):
        failing.start()
    failing.close()
    sup = make(game("a"))
    reboots = evs(sup, "host_reboot")
    assert [e.detail["boot_id"] for e in reboots] == ["boot-2"], reboots
    assert reboots[0].detail["previous_boot_id"] == "boot-1"
    [after] = [e for e in evs(sup, "supervisor_start") if e.detail["boot_id"] == "boot-2"]
    assert after.detail["after"] == "supervisor_crash"


def test_a_reboot_before_any_up_time_was_seen_starts_the_workers(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The ledger's MTBF is 0 when the boot before was never seen up (its row's first and last
    sighting the same): no `--host-mtbf-s 0`, which the worker refuses (exit 78, FATAL)."""
    first = make(game("a"))
    first.close()  # the power is cut at once
    for pid in fake_workers("a"):
        psutil.Process(pid).kill()
    (tmp_path / "boot").write_text("boot-2")
    sup = make(game("a"))
    assert sup.on.conn is not None
    spin(sup, lambda: sup.games["a"].state is S.RUNNING and bool(fake_workers("a")))
    flag = _worker_flag("a", "--host-mtbf-s")
    assert flag is None or float(flag) > 0


def _worker_flag(game_name: str, flag: str) -> str | None:
    [pid] = fake_workers(game_name)
    cmd = psutil.Process(pid).cmdline()
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


@pytest.mark.parametrize("adaptive", [True, False])
def test_after_a_reboot_workers_get_the_ledgers_mtbf_for_their_checkpoint_interval(
    make, tmp_path, adaptive: bool
) -> None:  # type: ignore[no-untyped-def]
    """A host that has failed hands its MTBF (the ledger's, `rlsup status`'s) to each worker it
    starts, which shortens its checkpoint interval by Young's rule (training/protocol.py);
    `adaptive_checkpoints = false` keeps the interval fixed. Before any failure none is known."""
    top = "" if adaptive else "adaptive_checkpoints = false\n"
    first = make(game("a"), top=top)
    spin(first, lambda: first.games["a"].state is S.RUNNING)
    assert _worker_flag("a", "--host-mtbf-s") is None  # no failure yet: unknown
    time.sleep(0.5)  # some up-time in the ledger
    first.close()  # no clean stop: the power is cut
    for pid in fake_workers("a"):
        psutil.Process(pid).kill()
    (tmp_path / "boot").write_text("boot-2")
    sup = make(game("a"), top=top)
    spin(sup, lambda: sup.games["a"].state is S.RUNNING and bool(fake_workers("a")))
    assert [e.detail["boot_id"] for e in evs(sup, "host_reboot")] == ["boot-2"]
    assert sup.on.conn is not None
    mtbf = db.mtbf_s(sup.on.conn, time.time())
    assert mtbf is not None and mtbf > 0
    flag = _worker_flag("a", "--host-mtbf-s")
    if not adaptive:
        assert flag is None
    else:
        assert flag is not None and 0 < float(flag) <= mtbf + 1e-6


# ---- files that are not what they seem ------------------------------------------------------


def test_a_fifo_in_a_run_dir_never_blocks_a_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "heartbeat.json"
    os.mkfifo(fifo)
    result: list[object] = []
    reader = threading.Thread(
        target=lambda: result.extend(
            [protocol.read_heartbeat(tmp_path), protocol.read_json_file(fifo)]
        ),
        daemon=True,
    )
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "opening the FIFO blocked the reader"
    assert result == [None, None]
    os.unlink(fifo)
    (tmp_path / "elsewhere.json").write_text('{"seq": 1}')
    fifo.symlink_to(tmp_path / "elsewhere.json")
    assert protocol.read_json_file(fifo) is None, "a symlink is not followed"


def test_a_symlinked_supervisor_lock_is_refused(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("")
    (tmp_path / "supervisor.lock").symlink_to(tmp_path / "target")
    with pytest.raises(OSError) as info:
        acquire_lock(tmp_path)
    assert info.value.errno == errno.ELOOP
    assert (tmp_path / "target").read_text() == "", "nothing written through the link"
