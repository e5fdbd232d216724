"""The soak's table of fault kinds, without running a soak: every kind is scheduled, and no kind
can pass on an empty event log (each expects something, or checks inline in its injection)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from harness.chaos.soak_analysis import EventLog
from harness.chaos.soak_engine import KINDS, Soak, SoakSettings
from harness.chaos.soak_faults import Fault

pytestmark = pytest.mark.e2e

# Judged inline by their injections (the refused and the accepted reload; the commands' answers
# over hostile files), not by later events.
INLINE = {"env_id_change", "hostile_files"}


@pytest.mark.parametrize("phase_s", [200.0, 3510.0])
def test_every_kind_is_scheduled_and_pins_come_in_order(tmp_path: Path, phase_s: float) -> None:
    soak = Soak(SoakSettings(workdir=tmp_path, fault_phase_s=phase_s, min_faults=20))
    plan = soak.schedule()
    assert set(plan) == set(KINDS)
    assert plan.index("scale_light") < plan.index("scale_auto")
    assert len(plan) >= 20


@pytest.mark.parametrize("name", sorted(KINDS))
def test_no_kind_survives_an_empty_event_log(name: str) -> None:
    fault = Fault(name, ["g"], 0.0, victims={"g": 12345}, event_ids=(0, 10))
    fault.storm = {12345: 11} if name == "crash_storm" else {}
    fault.damaged_file = "replay/frames-000001.bin"
    seen = [ok for _, ok in KINDS[name].expect(EventLog([], fault, since=0.0))]
    if name in INLINE:
        assert seen == []
    else:
        assert seen and not all(seen), f"{name} would pass with no events at all"


def test_a_forbidden_event_during_the_fault_is_a_problem() -> None:
    fault = Fault("db_locked", [], 0.0, event_ids=(0, 10))
    hang = {"id": 5, "kind": "worker_hang", "game": "g", "ts": 1.0, "detail": {}}
    log = EventLog([hang], fault, since=0.0)
    assert log.during(KINDS["db_locked"].forbid) == ["worker_hang g"]
    assert log.during(KINDS["kill"].forbid) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_second_disk_fault_never_orphans_the_first_filler(tmp_path: Path) -> None:
    """Two fillers at once: the first, no longer referenced, would keep the disk full for the
    rest of the run (seen in a 60-minute soak: a game that could never checkpoint again)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(disk)], check=True)
    soak = Soak(SoakSettings(workdir=tmp_path / "soak", fault_phase_s=200.0))
    try:
        soak._fill(disk)
        soak._fill(disk)
        fillers = [t for t in threading.enumerate() if t.name == "soak-filler" and t.is_alive()]
        assert len(fillers) == 1
        assert shutil.disk_usage(disk).free < 64 * 1024
        with soak._disk_lock:
            assert soak._filler is not None
            soak._filler.stop()
            soak._filler = None
        assert not [t for t in threading.enumerate() if t.name == "soak-filler" and t.is_alive()]
        assert shutil.disk_usage(disk).free > 900 * 1024, "space back once the filler stops"
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_checkpoint_retired_while_it_is_verified_is_no_problem(tmp_path: Path) -> None:
    """The 60-minute soak flagged four checkpoints that retention retired while the engine
    verified them ("missing MANIFEST.json"): only a checkpoint still there is judged."""
    from checkpoints import CheckpointStore
    from checkpoints.errors import CheckpointError
    from checkpoints.names import CheckpointRef
    from harness.chaos.soak_faults import verify_unless_retired

    store = CheckpointStore(tmp_path / "checkpoints")
    with store.begin(7, {"game": "g"}) as w:
        w.write_bytes("learner.pt", b"x" * 1000)
        w.commit()
    [ref] = store.committed()
    assert verify_unless_retired(ref.path, 7) is None
    data = bytearray((ref.path / "learner.pt").read_bytes())
    data[10] ^= 1
    (ref.path / "learner.pt").write_bytes(bytes(data))
    assert verify_unless_retired(ref.path, 7) is not None, "damage that is there is judged"
    ref.path.rename(tmp_path / "checkpoints" / ".staging-retired")  # retention's first move
    with pytest.raises(CheckpointError):  # what the engine used to report as damage
        store.verify(CheckpointRef(ref.path, 7))
    assert verify_unless_retired(ref.path, 7) is None


def test_the_soak_config_loads_with_the_services_its_kinds_drive(tmp_path: Path) -> None:
    """The config the soak writes (metrics endpoint, hook, mirror) loads as `rlsup run` loads
    it, and `mirror_move`'s edit is one the reload must refuse, naming mirror.url: a typo in
    either would fail a 5-minute soak, or pass it without the fault ever happening."""
    from harness.chaos.soak_services import write_hook
    from harness.seaweed import Weed
    from supervisor.config import load_config, mirror_reload_refusal, resolve_hook_programs

    soak = Soak(SoakSettings(workdir=tmp_path, fault_phase_s=200.0))
    write_hook(soak.hook_program, soak.hook_storm_flag, soak.hook_runs)
    soak.metrics_port = 49469
    soak.mirror.weed = Weed(None, "http://127.0.0.1:48333", tmp_path, [])  # type: ignore[arg-type]
    soak.write_config()
    cfg = resolve_hook_programs(load_config(soak.config))
    assert (cfg.metrics.listen_host, cfg.metrics.listen_port) == ("127.0.0.1", 49469)
    assert [h.program for h in cfg.hooks] == [str(soak.hook_program)]
    assert {"worker_crash", "restart"} <= set(cfg.hooks[0].on)
    assert cfg.mirror is not None and cfg.mirror.url == soak.mirror.url
    text = soak.config.read_text()
    moved = text.replace(f'url = "{soak.mirror.url}"', f'url = "{soak.mirror.moved_url}"')
    assert moved != text
    soak.config.write_text(moved)
    assert "mirror.url" in (mirror_reload_refusal(cfg, load_config(soak.config)) or "")
    quiet = subprocess.run([str(soak.hook_program)], capture_output=True, timeout=10)
    assert quiet.returncode == 0 and not quiet.stdout, "without the storm flag: exit 0 at once"
    assert not soak.hook_runs.exists()


def test_the_monitor_follows_the_worker_through_a_hostile_heartbeat(tmp_path: Path) -> None:
    """`hostile_files` replaces a heartbeat with one of no worker (pid -5, a string step) for
    the second until the worker writes again: the soak's eyes must keep following the worker,
    not take that for a new life (which hid the worker from every later fault)."""
    import json

    from harness.chaos.soak_monitor import Monitor

    run_dir = tmp_path / "runs" / "g"
    run_dir.mkdir(parents=True)
    monitor = Monitor(tmp_path, ["g"])
    beat = {"pid": os.getpid(), "global_step": 10, "phase": "training"}
    (run_dir / "heartbeat.json").write_text(json.dumps(beat))
    monitor._read_heartbeat("g", 1.0)
    (run_dir / "heartbeat.json").write_text('{"pid": -5, "global_step": "a", "seq": "x"}')
    monitor._read_heartbeat("g", 2.0)
    (run_dir / "heartbeat.json").write_text(json.dumps(beat | {"global_step": 20}))
    monitor._read_heartbeat("g", 3.0)
    life = monitor.current("g")
    assert life is not None and life.pid == os.getpid() and life.max_step == 20


def test_a_replacement_that_trains_to_the_end_in_one_iteration_is_a_replacement(
    tmp_path: Path,
) -> None:
    """CI (stop 46): Pong resumed after a host reboot a few thousand steps short of its total,
    trained one iteration and finished. Its step moved only in the final checkpoint's
    heartbeat, so the soak's eyes took it for a worker that never moved, a later global fault
    (a clock step) during its short life made it "cut short", and the fault read "no
    replacement worker ever trained"."""
    import json

    from harness.chaos.soak_monitor import Monitor

    soak = Soak(SoakSettings(workdir=tmp_path, fault_phase_s=200.0))
    soak.monitor = Monitor(tmp_path, soak.game_names)
    total = next(g.total_steps for g in soak.s.games if g.name == "pong")
    run_dir = tmp_path / "runs" / "pong"
    run_dir.mkdir(parents=True)
    victim, rep = 4_000_001, 4_000_002

    def beat(pid: int, step: int, phase: str, now: float, **extra: object) -> None:
        hb = {"pid": pid, "global_step": step, "phase": phase, "num_envs": 8} | extra
        (run_dir / "heartbeat.json").write_text(json.dumps(hb))
        soak.monitor._read_heartbeat("pong", now)

    resume = total - 1024
    for i, now in enumerate((1.0, 2.0, 3.0, 4.0)):
        beat(victim, resume - 3072 + 1024 * i, "training", now)
    soak.monitor.committed["pong"][resume] = 3.5
    beat(rep, resume, "training", 10.0, resumed_from_step=resume)
    beat(rep, total, "checkpointing", 12.0, resumed_from_step=resume)
    beat(rep, total, "stopping", 12.5, resumed_from_step=resume)
    soak.monitor.committed["pong"][total] = 12.4
    reboot = Fault("host_reboot", ["pong"], 5.0, victims={"pong": victim})
    clock = Fault("clock_step", ["pong"], 11.0, victims={"pong": rep})
    soak.faults = [reboot, clock]
    soak.recovered(reboot)
    assert reboot.problems == []
    assert reboot.redone_steps == 0, "the victim died at the step the replacement resumed from"


def test_a_replacement_first_seen_as_it_ends_at_the_total_is_a_replacement(tmp_path: Path) -> None:
    """The same finish, with the monitor's first look at the replacement already in its final
    checkpoint: the game is done, and a life after the fault brought it there."""
    import json

    from harness.chaos.soak_monitor import Monitor

    soak = Soak(SoakSettings(workdir=tmp_path, fault_phase_s=200.0))
    soak.monitor = Monitor(tmp_path, soak.game_names)
    total = next(g.total_steps for g in soak.s.games if g.name == "pong")
    run_dir = tmp_path / "runs" / "pong"
    run_dir.mkdir(parents=True)
    for pid, step, phase, now in (
        (4_000_001, total - 2048, "training", 1.0),
        (4_000_001, total - 1024, "training", 2.0),
        (4_000_002, total, "checkpointing", 10.0),
    ):
        hb = {"pid": pid, "global_step": step, "phase": phase, "resumed_from_step": total - 1024}
        (run_dir / "heartbeat.json").write_text(json.dumps(hb))
        soak.monitor._read_heartbeat("pong", now)
    soak.monitor.committed["pong"] |= {total - 1024: 1.5, total: 10.5}
    reboot = Fault("host_reboot", ["pong"], 5.0, victims={"pong": 4_000_001})
    soak.faults = [reboot]
    soak.recovered(reboot)
    assert reboot.problems == []
    soak.monitor.committed["pong"].pop(total)  # not done: then it is a problem
    reboot.problems.clear()
    soak.recovered(reboot)
    assert reboot.problems == ["pong: no replacement worker ever trained after host_reboot"]
