"""`rlsup check-config` starts each command game's program once, as the spawn would (its PATH,
its cwd, its environment), and says what is wrong and how to fix it: a program that is not
there, an interpreter that cannot import the SDK its script imports, a bare name that systemd's
PATH resolves to another program. Real interpreters, real files; no supervisor runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.config import load_config
from supervisor.launch.probe import probe_command_games
from tests.supervisor.config.test_config import GOOD

pytestmark = pytest.mark.e2e

SDK_SCRIPT = "import rlsup\nrun = rlsup.attach()\n"
PLAIN_SCRIPT = "print('no sdk here')\n"


def write_config(tmp: Path, command: list[str], extra: str = "") -> Path:
    quoted = ", ".join(f'"{c}"' for c in command)
    path = tmp / "c.toml"
    path.write_text(f'{GOOD}\n[[games]]\nname = "mine"\ncommand = [{quoted}]\ncwd = "."\n{extra}')
    return path


def isolated_python(tmp: Path) -> Path:
    """A `python` that ignores PYTHONPATH and site-packages (-I -S), as a venv of the user's
    that lacks rlsup would be: it starts, and `import rlsup` fails."""
    bin_dir = tmp / "userbin"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    python.chmod(0o755)
    return python


def test_an_interpreter_with_the_sdk_passes_without_a_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(SDK_SCRIPT)
    path = write_config(tmp_path, [sys.executable, "train.py"])
    assert main(["check-config", "--config", str(path)]) == 0
    assert "mine" not in capsys.readouterr().err


def test_a_script_that_imports_the_sdk_from_an_interpreter_without_it_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(SDK_SCRIPT)
    python = isolated_python(tmp_path)
    path = write_config(tmp_path, [str(python), "train.py"])
    assert main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "error: game mine" in err and str(python) in err
    assert "cannot `import rlsup`: ModuleNotFoundError: No module named 'rlsup'" in err
    assert "PYTHONPATH=" in err  # and how rlsup is found, to fix it


def test_a_script_without_the_sdk_gets_a_warning_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(PLAIN_SCRIPT)
    path = write_config(tmp_path, [str(isolated_python(tmp_path)), "train.py"])
    assert main(["check-config", "--config", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: game mine" in err and "(if it uses the SDK)" in err


def test_heartbeat_true_promises_the_sdk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(PLAIN_SCRIPT)  # it may import it indirectly
    path = write_config(
        tmp_path, [str(isolated_python(tmp_path)), "train.py"], "heartbeat = true\n"
    )
    assert main(["check-config", "--config", str(path)]) == 2
    assert "error: game mine" in capsys.readouterr().err


def test_a_program_not_on_the_path_is_refused_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, ["no-such-trainer-rlsup", "train.py"])
    assert main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "'no-such-trainer-rlsup' is not on the PATH" in err and "absolute path" in err


def test_a_relative_program_is_looked_up_in_the_games_cwd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, ["./bin/train", "x"])
    assert main(["check-config", "--config", str(path)]) == 2
    assert "'./bin/train': no such file" in capsys.readouterr().err
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "train").write_text("#!/bin/sh\n")
    assert main(["check-config", "--config", str(path)]) == 2
    assert "not an executable file" in capsys.readouterr().err
    (tmp_path / "bin" / "train").chmod(0o755)
    assert main(["check-config", "--config", str(path)]) == 0


def test_a_bare_name_that_only_the_operators_path_finds_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The day-one trap: `python` in a shell with a venv active is not systemd's `python`."""
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    python = isolated_python(tmp_path)
    (tmp_path / "train.py").write_text(PLAIN_SCRIPT)
    monkeypatch.setenv("PATH", f"{python.parent}{os.pathsep}{os.environ['PATH']}")
    path = write_config(tmp_path, ["python", "train.py"])
    assert main(["check-config", "--config", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"'python' is {python} here, but under the systemd service" in err
    assert f'command = ["{python}", ...]' in err


def test_each_distinct_command_is_probed_once(tmp_path: Path) -> None:
    """Seeds of one game share its command: one probe, one finding."""
    (tmp_path / "train.py").write_text(SDK_SCRIPT)
    path = write_config(
        tmp_path, [str(isolated_python(tmp_path)), "train.py"], "seeds = [1, 2, 3]\n"
    )
    findings = probe_command_games(load_config(path))
    assert [(f.game, f.error) for f in findings] == [("mine", True)]


def test_rlsup_run_says_what_the_probe_found_at_start_up(tmp_path: Path) -> None:
    """Not a refusal (the other games run), but said once, in the supervisor's log."""
    from harness.runs import MODES, env_for, start_supervisor, stop_supervisor

    (tmp_path / "train.py").write_text(SDK_SCRIPT)
    python = isolated_python(tmp_path)
    config = tmp_path / "rlsup.toml"
    config.write_text(
        'state_dir = "state"\n'
        + MODES.format(max_concurrent=1)
        + f'[[games]]\nname = "mine"\ncommand = ["{python}", "train.py"]\ncwd = "."\n'
    )
    sup = start_supervisor(config, env_for(tmp_path), "--exit-when-done")
    try:
        sup.wait(60)
    finally:
        stop_supervisor(sup)
    log = (tmp_path / "supervisor.log").read_text()
    assert "command_game_check" in log and "No module named 'rlsup'" in log, log[-2000:]


def test_on_a_ray_cluster_the_probe_says_it_checked_the_supervisor_s_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command game on several hosts: the same check, said to be this host's (each Ray host
    is checked again on placement, naming itself: supervisor/launch/ray/command.py)."""
    ray = '[mirror]\nurl = "s3://rlsup-bucket/p"\n[cluster]\nbackend = "ray"\n'
    path = write_config(tmp_path, ["no-such-trainer-rlsup", "train.py"])
    path.write_text(path.read_text().replace("[[games]]", ray + "[[games]]", 1))
    [finding] = probe_command_games(load_config(path))
    assert finding.error and "'no-such-trainer-rlsup' is not on the PATH" in finding.message
    assert "checked on this host, the supervisor's" in finding.message, finding.message
