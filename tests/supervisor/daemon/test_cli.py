"""CLI commands without a running supervisor: init, scale, install-service, stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runs import REPO
from supervisor.cli import main
from supervisor.ledger import db
from tests.supervisor.config.test_config import GOOD


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "rlsup.toml"
    path.write_text(GOOD)
    return path


def test_init_writes_a_valid_example_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from supervisor.config import load_config

    path = tmp_path / "new.toml"
    assert main(["init", str(path)]) == 0
    cfg = load_config(path)
    assert sum(g.env_id.endswith("-v5") for g in cfg.games) == 2
    assert any(g.env_id == "CartPole-v1" for g in cfg.games)
    before = path.read_text()
    # Its commented `gpu` line is valid as written, once uncommented.
    assert '# gpu = "auto"' in before
    path.write_text(before.replace('# gpu = "auto"', 'gpu = "auto"', 1))
    assert load_config(path).games[0].gpu is None  # "auto": every visible GPU
    path.write_text(before)
    assert main(["init", str(path)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert path.read_text() == before


def test_scale_pins_a_mode_and_leaves_its_event_to_the_supervisor(config: Path) -> None:
    assert main(["scale", "--mode", "heavy", "--game", "pong", "--config", str(config)]) == 0
    assert main(["scale", "--mode", "light", "--config", str(config)]) == 0
    conn = db.connect(config.parent / "state")
    assert db.get_desired(conn, "pong") == ("heavy", True)
    assert db.get_desired(conn, "*") == ("light", True)
    assert main(["scale", "--mode", "auto", "--game", "pong", "--config", str(config)]) == 0
    assert db.get_desired(conn, "pong") == ("auto", False)
    # The supervisor records mode_pinned as it reads the wish (its hooks fire then).
    assert db.events(conn, kind="mode_pinned") == []


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--mode", "turbo"], ["'turbo'", "light, heavy, auto"]),
        (["--mode", "light", "--game", "pongg"], ["'pongg'", "cart, pong"]),
    ],
)
def test_scale_rejects_unknown_mode_or_game_listing_valid_ones(
    config: Path, capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]
) -> None:
    assert main(["scale", *args, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err
    assert not (config.parent / "state").exists()


def test_install_service_dry_run_prints_unit_and_commands(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["install-service", "--dry-run", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "run --config /etc/rlsup/rlsup.toml" in out
    assert "/etc/systemd/system/rlsup.service" in out
    assert "TimeoutStopSec=90" in out  # stop_grace_s (60) + 30
    for line in (
        "Type=notify",
        "NotifyAccess=main",
        "Restart=on-failure",  # a clean `rlsup stop` (exit 0) is not undone
        "RestartPreventExitStatus=2 73",  # config error, state dir held by another
        "StartLimitIntervalSec=600",
        "StartLimitBurst=5",
        "RestartSec=5",
        "WatchdogSec=60",
        "KillMode=control-group",  # workers checkpoint when the supervisor dies
        "TimeoutStartSec=120",
        "OOMPolicy=continue",
        "WantedBy=multi-user.target",
        "User=rlsup",
        "Group=rlsup",
        "StateDirectory=rlsup",
        "LogsDirectory=rlsup",
        "UMask=0027",
        "NoNewPrivileges=yes",
        "ProtectSystem=full",
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        "Environment=RLSUP_CONFIG=/etc/rlsup/rlsup.toml",
        "check-config --config /etc/rlsup/rlsup.toml",
    ):
        assert line in out, line
    assert "PrivateDevices" not in out and "MemoryDenyWriteExecute" not in out  # CUDA
    assert "systemctl daemon-reload" in out and "systemctl enable --now rlsup.service" in out
    assert 'state_dir = "/var/lib/rlsup"' in out and 'logs_dir = "/var/log/rlsup"' in out
    assert "${" not in out
    exec_line = next(x for x in out.splitlines() if x.startswith("ExecStart="))
    assert exec_line.split("=", 1)[1].startswith("/")


def test_install_service_refuses_an_interpreter_the_account_cannot_reach() -> None:
    import shutil
    import tempfile

    from supervisor.commands import install_service

    base = Path(tempfile.mkdtemp())  # /tmp/xyz: the way there is open to anyone
    base.chmod(0o755)
    hidden = base / "private"
    (hidden / "bin").mkdir(parents=True)
    (hidden / "bin" / "python3").write_text("")
    hidden.chmod(0o700)
    problem = install_service.unreachable(hidden / "bin" / "python3", "nobody")
    assert problem == f"nobody cannot enter {hidden} (mode drwx------)"
    hidden.chmod(0o755)
    assert install_service.unreachable(hidden / "bin" / "python3", "nobody") is None
    shutil.rmtree(base)


def test_service_config_points_state_and_logs_at_the_service_directories() -> None:
    from supervisor.commands.install_service import with_service_paths

    text = 'state_dir = "var/rlsup"\ninitial_mode = "light"\n\n[modes.light]\nnum_envs = 1\n'
    out = with_service_paths(text, Path("/var/lib/rlsup"), Path("/var/log/rlsup"))
    import tomllib

    data = tomllib.loads(out)
    assert data["state_dir"] == "/var/lib/rlsup" and data["logs_dir"] == "/var/log/rlsup"
    assert data["initial_mode"] == "light" and data["modes"]["light"]["num_envs"] == 1
    assert '# state_dir = "var/rlsup"' in out


def test_install_service_without_console_script_runs_the_module(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.commands import install_service

    monkeypatch.setattr(install_service.sys, "executable", "/opt/py/bin/python3")
    unit = install_service.render(config, 60, user=False)
    assert "ExecStart=/opt/py/bin/python3 -m supervisor.cli run --config" in unit
    assert f"Environment=PYTHONPATH={REPO}" in unit


@pytest.mark.e2e  # it starts a process (the probe of a command's interpreter, systemd)
def test_install_service_user_dry_run(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install-service", "--user", "--dry-run", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert ".config/systemd/user/rlsup.service" in out
    assert "systemctl --user enable --now" in out and "WantedBy=default.target" in out


def test_service_template_is_shipped_in_the_package_too() -> None:
    assert (REPO / "systemd/rlsup.service").read_text() == (
        REPO / "supervisor/rlsup.service"
    ).read_text()


def test_stop_without_a_running_supervisor_says_so(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stop", "--config", str(config)]) == 0
    assert "no supervisor is running" in capsys.readouterr().out
    conn = db.connect(config.parent / "state")
    db.set_supervisor(conn, pid=2**22 + 7, pid_create_time=1.0, state="running")
    assert main(["stop", "--config", str(config)]) == 0
    assert "no supervisor is running" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [["run"], ["stop"], ["scale", "--mode", "auto"], ["status"], ["events"], ["plot"]],
)
def test_every_command_says_how_to_create_a_missing_config(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "absent.toml"
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main([*argv, "--config", str(missing)]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"no configuration file at {missing}" in err and "rlsup init" in err
    assert not (tmp_path / "var").exists()


def test_check_config_says_ok_or_names_the_key(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", "--config", str(config)]) == 0
    assert f"{config}: ok:" in capsys.readouterr().out
    config.write_text(config.read_text().replace("num_envs = ", "num_envs = -", 1))
    with pytest.raises(SystemExit) as exc:
        main(["check-config", "--config", str(config)])
    assert exc.value.code == 2
    assert "num_envs" in capsys.readouterr().err


def test_commands_find_the_installed_services_config_without_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Path
) -> None:
    from supervisor.config import location as config_mod

    monkeypatch.setattr(config_mod, "SYSTEM_CONFIG", config)
    monkeypatch.delenv("RLSUP_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path / "..")
    assert config_mod.resolve_config_path(None) == config
    (Path.cwd() / "rlsup.toml").write_text("")
    assert config_mod.resolve_config_path(None) == Path("rlsup.toml"), "./rlsup.toml first"
