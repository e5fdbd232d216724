"""The stability policy wired into the daemon (scaling.StabilityPolicy), the GPU gate at the
NVML seam with a fake clock, the persisted mode across a reboot, and crashes right after a
resume (which never move a checkpoint): real (torch-free) stand-in worker processes, fakes only
at NVML and the clock."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoints import CheckpointStore
from harness.runs import REPO, FakeNvml, close_supervisors, spin
from supervisor.config import load_config
from supervisor.daemon import Supervisor
from supervisor.gpu.gate import ALLOC_CONF
from supervisor.launch.launcher import Launcher
from supervisor.launch.oomwatch import KernelOomWatch
from supervisor.ledger import db
from supervisor.lifecycle.states import WorkerState as S
from supervisor.stability import modes, scaling

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

CONFIG = """\
state_dir = "state"
stop_grace_s = 5
tick_s = 0.05
initial_mode = "{initial}"
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
budget = 5
budget_window_s = 60
[stability]
cooldown_s = 1
calm_s = 3600
{stability}
[gpu]
min_free_mb = 1000
poll_s = 30
timeout_s = 600
"""


def game(name: str, device: str = "cpu", steps: int = 10**9) -> str:
    return (
        f'[[games]]\nname = "{name}"\nenv_id = "CartPole-v1"\ntotal_steps = {steps}\n'
        f'device = "{device}"\n'
    )


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Supervisor]]:
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    made: list[Supervisor] = []

    def factory(games: str, initial: str = "heavy", stability: str = "", **kw: Any) -> Supervisor:
        path = tmp_path / "rlsup.toml"
        path.write_text(CONFIG.format(games=games, initial=initial, stability=stability))
        sup = Supervisor(
            load_config(path),
            launcher=Launcher(python=sys.executable, module="tests.supervisor.fake_worker"),
            cores=4,
            gpu_probe=kw.pop("gpu", None) or FakeNvml(None),
            **kw,
        )
        sup.start()
        made.append(sup)
        return sup

    yield factory
    close_supervisors(made)


def fake_script(sup: Supervisor, name: str, script: dict[str, Any]) -> None:
    run = sup.cfg.run_dir(name)
    run.mkdir(parents=True, exist_ok=True)
    (run / "fake.json").write_text(json.dumps(script))


def set_auto_mode(sup: Supervisor, scope: str, mode: str, reasons: list[str], *now: float) -> None:
    """As the policy would: a change, recorded by the supervisor's Recorder."""
    change = modes.auto_mode_change(sup.on.conn, sup.cfg, scope, mode, reasons, *now)
    modes.record(sup.on.recorder, [change])


def evs(sup: Supervisor, kind: str, game: str | None = None) -> list[db.Event]:
    assert sup.on.conn is not None
    return db.events(sup.on.conn, kind=kind, game=game)


# ---- the policy in the loop -----------------------------------------------------------------


def test_early_oom_steps_the_game_down_before_its_restart(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a") + game("b"))
    fake_script(sup, "a", {"oom_above_envs": 2})
    spin(sup, lambda: sup.games["a"].state is S.RUNNING and sup.games["b"].state is S.RUNNING)
    # One OOM at heavy, then straight back at light: never retried at the same size.
    assert sup.games["a"].mode.name == "light" and sup.games["a"].heartbeat.num_envs == 2
    assert sup.games["b"].mode.name == "heavy", "only the failing game steps down"
    ooms = evs(sup, "worker_oom", "a")
    assert len(ooms) == 1 and 0 <= ooms[0].detail["uptime_s"] < 30
    down = evs(sup, "scale_down", "a")
    assert len(down) == 1 and down[0].detail["scope"] == "a"
    assert (down[0].detail["from"], down[0].detail["to"]) == ("heavy", "light")
    assert "OOM" in down[0].detail["reasons"][0]
    assert [e.detail["mode"] for e in evs(sup, "worker_start", "a")] == ["heavy"]
    assert [e.detail["mode"] for e in evs(sup, "restart", "a")] == ["light"]


def test_a_sigkill_from_outside_is_a_crash_unless_the_kernel_says_oom(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A SIGKILL rlsup did not send is no kernel OOM on its own: it is one when the kernel log
    names the victim (here a log file standing in for /dev/kmsg), and only then does it step
    the whole host down."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    sup = make(game("a"), oom_watch=KernelOomWatch(kmsg=str(kmsg), cgroup_dir=None))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    os.kill(sup.games["a"].proc.pid, signal.SIGKILL)  # an operator's kill -9
    spin(sup, lambda: len(evs(sup, "worker_crash", "a")) == 1)
    crash = evs(sup, "worker_crash", "a")[0].detail
    assert crash["returncode"] == -9 and crash["kernel_oom"] is False
    assert "no OOM kill of this pid in the kernel log" in crash["oom_evidence"]
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    assert evs(sup, "scale_down") == [] and sup.games["a"].mode.name == "heavy"

    pid = sup.games["a"].proc.pid
    uptime_us = int(float(Path("/proc/uptime").read_text().split()[0]) * 1e6)
    kmsg.write_text(
        f"3,1234,{uptime_us},-;Out of memory: Killed process {pid} (python) total-vm:1kB\n"
    )
    os.kill(pid, signal.SIGKILL)  # what the OOM killer does, named by the kernel log
    spin(sup, lambda: sup.games["a"].state is S.RUNNING and sup.games["a"].mode.name == "light")
    [oom] = evs(sup, "worker_oom", "a")
    assert (
        oom.detail["kernel_oom"] is True and f"Killed process {pid}" in oom.detail["oom_evidence"]
    )
    down = evs(sup, "scale_down")
    assert down[-1].detail["scope"] == "*" and "kernel OOM" in down[-1].detail["reasons"][0]


def test_calm_steps_back_up_and_stay_decisions_are_applied_nowhere(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a"), stability="", initial="heavy")
    assert sup.on.conn is not None
    set_auto_mode(sup, "*", "light", ["test"], time.time() - 7200)
    db.set_mode(sup.on.conn, "*", "light", time.time() - 7200, "test")  # long calm
    sup.sampler.sample_once()
    spin(sup, lambda: sup.games["a"].state is S.RUNNING and sup.games["a"].mode.name == "heavy")
    up = evs(sup, "scale_up")
    assert up[-1].detail["to"] == "heavy" and "calm" in up[-1].detail["reasons"][0]
    assert isinstance(sup.policy, scaling.StabilityPolicy)
    assert {d.scope for d in sup.policy.last_decisions} == {"*", "a"}


def test_checkpoint_failures_in_the_heartbeat_become_one_event_each(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a"))
    fake_script(sup, "a", {"checkpoint_failures": 2, "last_checkpoint_error": "ENOSPC"})
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    for _ in range(10):
        sup.safe_tick()
        sup.wait(0.05)
    failed = evs(sup, "checkpoint_failed", "a")
    assert len(failed) == 1, "one event per increase of the counter"
    assert failed[0].detail["error"] == "ENOSPC" and failed[0].detail["failures"] == 2
    assert failed[0].detail["step"] > 0


def test_vitals_samples_are_persisted_as_json(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a"))
    assert sup.on.conn is not None
    spin(sup, lambda: sup.on.conn.execute("SELECT count(*) FROM samples").fetchone()[0] >= 1)
    data = json.loads(sup.on.conn.execute("SELECT data FROM samples").fetchone()[0])
    assert 0 < data["ram_available_pct"] <= 100 and data["gpus"] == []


# ---- GPU gate at the NVML seam, with a fake monotonic clock ------------------------------


def test_gpu_gate_waits_then_falls_back_one_rung_after_the_timeout(make, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(ALLOC_CONF, raising=False)
    clock, nvml = FakeClock(), FakeNvml(100.0)
    sup = make(game("a", "cuda") + game("c", "auto"), gpu=nvml, clock=clock, policy=None)
    assert os.environ[ALLOC_CONF] == "expandable_segments:True"
    sup.safe_tick()  # t = 1000: both wait
    for _ in range(2):
        clock.t += 100
        sup.safe_tick()
    assert sup.games["a"].state is S.WAITING and sup.games["c"].state is S.WAITING
    waits = evs(sup, "gpu_wait", "a")
    assert len(waits) == 1, "one gpu_wait event per wait"
    assert "100 MB free < 1000 MB needed" in waits[0].detail["reason"]
    polls = nvml.reads
    sup.safe_tick()
    assert nvml.reads == polls, "NVML is read at most every poll_s"
    # Memory frees for one of them: a starts and holds its need; c still waits.
    nvml.free = 1500.0
    clock.t = 1500  # a's reservation lasts reserve_s (120 s): past c's timeout below
    sup.safe_tick()
    assert sup.games["a"].state is S.STARTING and sup.games["a"].mode.name == "heavy"
    assert sup.games["c"].state is S.WAITING, "a's reservation is not free memory for c"
    # Past the timeout: c starts now, one rung lower, and says why.
    clock.t = 1000 + 601
    sup.safe_tick()
    assert sup.games["c"].state is S.STARTING and sup.games["c"].mode.name == "light"
    last = evs(sup, "gpu_wait", "c")[-1].detail
    assert last["timed_out"] and (last["from"], last["to"]) == ("heavy", "light")
    down = evs(sup, "scale_down", "c")
    assert len(down) == 1 and "timeout" in down[0].detail["reasons"][0]
    assert sup.games["a"].mode.name == "heavy"


# ---- the host mode across a reboot --------------------------------------------------------


def test_mode_persisted_across_a_reboot_is_resumed_never_above_the_ceiling(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a"), initial="heavy", policy=None)
    assert sup.on.conn is not None
    set_auto_mode(sup, "*", "light", ["2 unexpected reboots"])
    since = db.get_mode(sup.on.conn, "*")[1]  # type: ignore[index]
    sup.close()  # no clean stop: a power loss
    (tmp_path / "boot").write_text("boot-2")
    sup2 = make(game("a"), initial="heavy", policy=None)
    assert sup2.on.conn is not None
    assert evs(sup2, "host_reboot")
    assert modes.host_mode(sup2.on.conn, sup2.cfg).name == "light", "not initial_mode"
    assert db.get_mode(sup2.on.conn, "*")[1] == since, "the calm clock survives the reboot"  # type: ignore[index]
    assert evs(sup2, "supervisor_start")[-1].detail["host_mode"] == "light"
    spin(sup2, lambda: sup2.games["a"].state is S.RUNNING)
    assert sup2.games["a"].heartbeat.num_envs == 2
    # A persisted mode above a lowered ceiling resumes at the ceiling.
    set_auto_mode(sup2, "*", "heavy", ["x"])
    proc = sup2.games["a"].proc
    assert proc is not None
    sup2.launcher.kill(proc)
    proc.popen.wait()
    sup2.games["a"].life = None
    sup2.close()
    sup3 = make(game("a"), initial="heavy", stability='ceiling = "light"', policy=None)
    assert sup3.on.conn is not None
    assert modes.host_mode(sup3.on.conn, sup3.cfg).name == "light"


# ---- a crash right after a resume never moves the checkpoint ---------------------------------


def _checkpoint(run: Path, step: int) -> None:
    store = CheckpointStore(run / "checkpoints")
    with store.begin(step, {"game": "CartPole-v1", "algo": "ppo"}) as w:
        w.write_bytes("learner.pt", b"x" * 64)
        w.commit()


def test_crashes_right_after_a_resume_never_move_a_verified_checkpoint(make) -> None:  # type: ignore[no-untyped-def]
    """Crashes right after loading a checkpoint whose every byte verifies (here an env that
    fails to build) say nothing against it: nothing is quarantined or skipped, and once the
    cause is gone the game resumes from its newest checkpoint. A crash loop that does not end
    spends the budget and goes FATAL with the crash's own reason, the checkpoint still there."""
    sup = make(game("a") + game("solo"), policy=None)
    script = {"resume_from_checkpoints": True, "crash_after_resume": True}
    for name in ("a", "solo"):
        fake_script(sup, name, script)
    run_a, run_solo = sup.cfg.run_dir("a"), sup.cfg.run_dir("solo")
    _checkpoint(run_a, 100)
    _checkpoint(run_a, 200)
    _checkpoint(run_solo, 300)
    spin(sup, lambda: len(evs(sup, "worker_crash", "a")) >= 3)
    fake_script(sup, "a", {"resume_from_checkpoints": True})  # the cause is gone
    spin(
        sup,
        lambda: (
            sup.games["a"].state is S.RUNNING
            and sup.games["a"].heartbeat is not None
            and sup.games["a"].heartbeat.resumed_from_step == 200
            and sup.games["solo"].state is S.FATAL
        ),
    )
    assert "restart budget spent" in sup.games["solo"].reason
    assert "crash" in sup.games["solo"].reason
    for run, steps in ((run_a, ["ckpt-000000000100", "ckpt-000000000200"]),
                       (run_solo, ["ckpt-000000000300"])):  # fmt: skip
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == steps
    assert evs(sup, "checkpoint_corrupt", "a") == evs(sup, "checkpoint_corrupt", "solo") == []
