"""rlsup as a systemd service, under a real systemd 252 (one sandbox per test): start at boot,
stop and drain, `rlsup stop`, a bad configuration, the supervisor killed or frozen, reloads,
a power loss, and an operator who is not root."""

from __future__ import annotations

import time

import pytest

from tests.systemd.sandbox import CONFIG, RLSUP, Sandbox, game, install, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]


def stays(box: Sandbox, state: str, seconds: float) -> None:
    """The unit is in `state` now and still `seconds` later (RestartSec is 5 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert box.show("ActiveState") == state, box.show("ActiveState")
        time.sleep(0.5)


def test_the_enabled_service_starts_at_boot_as_its_own_user_and_trains(service: Sandbox) -> None:
    box = service
    assert box.show("UnitFileState") == "enabled"
    assert box.ok("ps -o user= -p $(systemctl show -p MainPID --value rlsup)").strip() == "rlsup"
    # Group-readable for the operators, never for others; the database group-writable.
    modes = box.ok(
        "stat -c '%U:%G %a %n' /var/lib/rlsup /var/lib/rlsup/rlsup.db /var/log/rlsup "
        "/var/log/rlsup/cart.log /var/lib/rlsup/runs/cart/heartbeat.json /etc/rlsup/rlsup.toml"
    ).splitlines()
    assert modes == [
        "rlsup:rlsup 750 /var/lib/rlsup",
        "rlsup:rlsup 660 /var/lib/rlsup/rlsup.db",
        "rlsup:rlsup 750 /var/log/rlsup",
        "rlsup:rlsup 640 /var/log/rlsup/cart.log",
        "rlsup:rlsup 640 /var/lib/rlsup/runs/cart/heartbeat.json",
        "root:rlsup 640 /etc/rlsup/rlsup.toml",
    ]
    before = wait_for(lambda: box.checkpoints("cart"), 60, "a checkpoint")[-1]
    boot = box.events("supervisor_start")[-1]["detail"]["boot_id"]
    assert boot == box.ok("cat /proc/sys/kernel/random/boot_id").strip()
    done = box.tool("reboot")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: box.training("cart", above=before), 120, "cart training after the reboot")
    starts = box.events("supervisor_start")
    assert starts[-1]["detail"]["after"] == "reboot", "a clean reboot is planned, not a crash"
    assert starts[-1]["detail"]["boot_id"] != boot and not box.events("host_reboot")
    assert box.heartbeat("cart")["resumed_from_step"] >= before  # type: ignore[index]


def test_systemctl_stop_drains_the_workers_and_the_unit_stays_stopped(service: Sandbox) -> None:
    box = service
    box.ok("systemctl stop rlsup", timeout=120)
    stays(box, "inactive", 8)
    exits = box.events("worker_exit")
    assert exits[-1]["detail"]["returncode"] == 75, exits[-1]
    hb = box.heartbeat("cart")
    assert hb is not None and box.checkpoints("cart")[-1] == hb["global_step"], "final checkpoint"
    assert box.show("NRestarts") == "0"


def test_rlsup_stop_as_root_and_as_an_operator_stays_stopped(service: Sandbox) -> None:
    box = service
    out = box.ok(f"{RLSUP} stop", timeout=120)
    assert "SIGTERM" in out and "rlsup.service" in out and "inactive" in out
    stays(box, "inactive", 8)
    box.ok("systemctl start rlsup")
    wait_for(lambda: box.show("ActiveState") == "active", 60, "the unit started again")
    box.ok("useradd --create-home alice && usermod --append --groups rlsup alice")
    out = box.ok(f"cd /tmp && runuser -u alice -- {RLSUP} stop", timeout=120)
    assert "a stop request in the state database" in out, out
    stays(box, "inactive", 8)
    assert box.events("worker_exit")[-1]["detail"]["returncode"] == 75


def test_a_bad_configuration_fails_the_unit_without_a_restart_loop(service: Sandbox) -> None:
    box = service
    box.push('initial_mode = "light"\n[modes.light]\nnum_envs = 0\n', "/etc/rlsup/rlsup.toml")
    box.sh("systemctl restart rlsup")
    stays(box, "failed", 12)
    assert box.show("NRestarts") == "0"
    assert box.show("ExecMainStatus") == "2"
    assert "num_envs" in box.ok("journalctl -u rlsup --no-pager -n 20")


def test_kill_9_of_the_supervisor_loses_no_training(sandbox: Sandbox) -> None:
    """KillMode=control-group: when the supervisor dies, systemd SIGTERMs its workers, which
    write a final checkpoint; the restarted supervisor resumes every game from it."""
    box = sandbox
    install(box, game("cart") + game("pole"))
    for name in ("cart", "pole"):
        wait_for(lambda n=name: len(box.checkpoints(n)) >= 2, 120, f"{name} checkpoints")
    before = {n: box.checkpoints(n)[-1] for n in ("cart", "pole")}
    old = {n: box.heartbeat(n)["pid"] for n in ("cart", "pole")}  # type: ignore[index]
    main = box.main_pid()
    box.ok(f"kill -9 {main}")
    for name in ("cart", "pole"):
        hb = wait_for(lambda n=name: box.training(n, not_pid=old[n]), 120, f"{name} again")
        assert hb["resumed_from_step"] > before[name], "a checkpoint written after the kill"
        assert box.workers(name) == [hb["pid"]], "one worker per game"
    assert box.main_pid() != main and box.show("NRestarts") == "1"
    for name in ("cart", "pole"):  # each worker of the dead supervisor stopped itself, cleanly
        assert '"event": "stop_requested"' in box.ok(f"cat /var/log/rlsup/{name}.log")


def test_the_watchdog_aborts_a_frozen_supervisor_and_training_resumes(service: Sandbox) -> None:
    box = service
    box.ok(
        "mkdir -p /etc/systemd/system/rlsup.service.d && printf '[Service]\\nWatchdogSec=6\\n'"
        " > /etc/systemd/system/rlsup.service.d/watchdog.conf && systemctl daemon-reload"
        " && systemctl restart rlsup",
        timeout=120,
    )
    hb = wait_for(lambda: box.training("cart"), 120, "training")
    main = box.main_pid()
    box.ok(f"kill -STOP {main}")
    wait_for(lambda: box.main_pid() not in (0, main), 90, "a restart after the watchdog")
    assert "watchdog" in box.ok("journalctl -u rlsup --no-pager -n 80").lower()
    wait_for(lambda: box.training("cart", not_pid=hb["pid"]), 120, "training again")


def test_reload_applies_a_good_file_and_refuses_a_bad_one(service: Sandbox) -> None:
    box = service
    main = box.main_pid()
    good = CONFIG.format(games=game("cart") + game("pole")).replace(
        'initial_mode = "light"',
        'state_dir = "/var/lib/rlsup"\nlogs_dir = "/var/log/rlsup"\ninitial_mode = "light"',
    )
    box.push(good, "/etc/rlsup/rlsup.toml")
    box.ok("systemctl reload rlsup")
    wait_for(lambda: box.training("pole"), 120, "the added game training")
    reloads = len(box.events("config_reload"))
    box.push("state_dir = [\n", "/etc/rlsup/rlsup.toml")
    bad = box.sh("systemctl reload rlsup")
    assert bad.returncode != 0, "a bad file must fail `systemctl reload`"
    assert "not valid TOML" in box.ok("journalctl -u rlsup --no-pager -n 30")
    assert box.show("ActiveState") == "active" and box.main_pid() == main
    assert len(box.events("config_reload")) == reloads


def test_a_power_loss_is_an_unexpected_reboot_and_every_game_resumes(service: Sandbox) -> None:
    box = service
    wait_for(lambda: len(box.checkpoints("cart")) >= 2, 60, "checkpoints")
    boot_before = box.ok("cat /proc/sys/kernel/random/boot_id").strip()
    box.tool("stop", "--kill")  # PID 1 SIGKILLed: nothing stops cleanly
    newest = box.checkpoints("cart")[-1]
    box.boot()
    hb = wait_for(lambda: box.training("cart", above=newest), 120, "cart after the power loss")
    assert hb["resumed_from_step"] == newest
    [reboot] = box.events("host_reboot")
    assert reboot["detail"]["previous_boot_id"] == boot_before
    assert reboot["detail"]["boot_id"] == box.ok("cat /proc/sys/kernel/random/boot_id").strip()


def test_an_operator_reads_the_state_without_sudo_and_a_stranger_is_told_why(
    service: Sandbox,
) -> None:
    box = service
    box.ok("useradd --create-home alice && usermod --append --groups rlsup alice")
    box.ok("useradd --create-home mallory")
    status = box.ok(f"cd /home/alice && runuser -u alice -- {RLSUP} status --json")
    assert '"name": "cart"' in status and '"state": "running"' in status
    wait_for(lambda: len(box.checkpoints("cart")) >= 3, 60, "three checkpoints, three log lines")
    logs = box.ok(f"cd /home/alice && runuser -u alice -- {RLSUP} logs cart -n 3")
    assert len(logs.splitlines()) == 3 and all(line.startswith("{") for line in logs.splitlines())
    denied = box.sh(f"cd /home/mallory && runuser -u mallory -- {RLSUP} status")
    assert denied.returncode == 2
    assert "/etc/rlsup/rlsup.toml: permission denied" in denied.stderr
    assert "Traceback" not in denied.stderr and len(denied.stderr.strip().splitlines()) == 1


def test_a_power_loss_after_a_stop_a_start_and_a_supervisor_kill_is_an_unexpected_reboot(
    sandbox: Sandbox,
) -> None:
    """Issue 24, defect 14: as root, `rlsup stop`, `systemctl start`, kill -9 of the supervisor
    (systemd restarts it), then a power loss: the next boot still records the host_reboot."""
    box = sandbox
    install(box, game("cart"), "--run-as", "root")
    box.ok(f"{RLSUP} stop", timeout=120)
    box.ok("systemctl start rlsup")
    first = wait_for(lambda: box.training("cart"), 120, "training after the start")
    main = box.main_pid()
    box.ok(f"kill -9 {main}")
    wait_for(lambda: box.main_pid() not in (0, main), 90, "systemd restarting the supervisor")
    hb = wait_for(lambda: box.training("cart", not_pid=first["pid"]), 120, "training again")
    wait_for(lambda: box.checkpoints("cart")[-1:] > [hb["resumed_from_step"]], 60, "a checkpoint")
    boot_before = box.ok("cat /proc/sys/kernel/random/boot_id").strip()
    box.tool("stop", "--kill")  # PID 1 SIGKILLed: nothing stops cleanly
    newest = box.checkpoints("cart")[-1]
    box.boot()
    wait_for(lambda: box.training("cart", above=newest), 120, "cart after the power loss")
    kinds = [e["kind"] for e in box.events()]
    reboots = box.events("host_reboot")
    assert len(reboots) == 1, kinds
    assert reboots[0]["detail"]["previous_boot_id"] == boot_before
    assert box.events("supervisor_start")[-1]["detail"]["after"] == "host_reboot"
