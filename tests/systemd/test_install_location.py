"""`rlsup install-service` refuses an environment the unit's sandboxing hides from the service
(PrivateTmp: /tmp and /var/tmp; a home directory the account cannot enter, as pyenv's and
conda's interpreters live in) and names the way out; the way out works (issue 24)."""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.commands import install_service
from tests.systemd.sandbox import (
    RLSUP,
    Sandbox,
    follow_the_way_out,
    game,
    prepare,
    wait_training,
)

pytestmark = pytest.mark.e2e

CONFIG = """\
initial_mode = "light"
[modes.light]
num_envs = 4
batch_size = 64
n_steps = 32
max_concurrent = 1
[[games]]
name = "cart"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = 1000
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "rlsup.toml"
    path.write_text(CONFIG)
    return path


def dry_run_problems(config: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> list[str]:
    assert main(["install-service", "--dry-run", "--config", str(config), *flags]) == 0
    return [
        line.removeprefix("# problem: ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("# problem: ")
    ]


@pytest.mark.parametrize("where", ["/tmp/clone/.venv", "/var/tmp/clone/.venv"])
def test_an_interpreter_under_a_private_tmp_is_refused_naming_it_and_the_way_out(
    config: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    monkeypatch.setattr(install_service.sys, "executable", f"{where}/bin/python3")
    for flags in ((), ("--run-as", "root")):  # root gets the same private /tmp
        problems = dry_run_problems(config, capsys, *flags)
        hidden = [p for p in problems if f"{where}/bin/python3 is under" in p]
        assert hidden and "PrivateTmp=yes" in hidden[0], problems
        [way] = [p for p in problems if p.startswith("the way out")]
        assert "-m venv /opt/rlsup && /opt/rlsup/bin/pip install " in way
        assert "--run-as root" not in way, "root does not see the host's /tmp either"


def test_a_symlink_into_tmp_is_followed() -> None:
    link = Path("/opt/rlsup-link-that-does-not-exist")
    assert install_service.sandbox_hides(Path("/var/tmp/x/python")) is not None
    assert install_service.sandbox_hides(link) is None
    assert install_service.sandbox_hides(Path("/usr/bin/python3")) is None


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every account may enter (pytest's tmp_path is in a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="rlsup-install-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_a_home_the_account_cannot_enter_is_refused_with_a_system_interpreter_and_root(
    config: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    open_dir: Path,
) -> None:
    """pyenv's python3 lives in /root: a venv made from it leads back there. The way out
    names an interpreter the service can read, never this one's base."""
    home = open_dir / "home"
    base = home / ".pyenv/versions/3.11.7/bin"
    base.mkdir(parents=True)
    (base / "python3.11").touch()
    home.chmod(0o700)
    monkeypatch.setattr(install_service.sys, "executable", str(base / "python3.11"))
    monkeypatch.setattr(install_service.sys, "_base_executable", str(base / "python3.11"))
    system = open_dir / "usr-bin"
    system.mkdir()
    (system / f"python{sys.version_info[0]}.{sys.version_info[1]}").write_text("")
    (system / f"python{sys.version_info[0]}.{sys.version_info[1]}").chmod(0o755)
    monkeypatch.setattr(install_service, "SYSTEM_PYTHON_DIRS", (system,))
    monkeypatch.setattr(install_service, "PRIVATE_TMP_DIRS", ())  # open_dir is in /var/tmp
    problems = dry_run_problems(config, capsys, "--run-as", "nobody")
    assert any(f"nobody cannot enter {home}" in p for p in problems), problems
    [way] = [p for p in problems if p.startswith("the way out")]
    assert re.search(rf"`{system}/python3\.\d+ -m venv /opt/rlsup && ", way), way
    assert f"not from {base / 'python3.11'}" in way
    assert "--run-as root" in way and "full power over this host" in way
    assert dry_run_problems(config, capsys, "--run-as", "root") == []


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_way_out_of_a_pyenv_interpreter_works_and_the_service_trains(
    sandbox: Sandbox,
) -> None:
    """This checkout's python3 is pyenv's, in /root (0700, as on a fresh host): refused naming
    /root; the printed way out, followed, installs a service that trains as its own user."""
    if not Path(sys.executable).resolve().is_relative_to("/root"):
        pytest.skip(f"this interpreter ({Path(sys.executable).resolve()}) is not in /root")
    box = sandbox
    box.ok("chmod 0700 /root")  # the fixture opened it for the other tests
    prepare(box, game("cart"))
    refused = box.sh(f"{RLSUP} install-service --config /root/rlsup.toml")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "rlsup cannot enter /root (mode drwx------)" in refused.stderr, refused.stderr
    assert box.sh("test -e /etc/systemd/system/rlsup.service").returncode != 0, "nothing done"
    command = follow_the_way_out(box, refused.stderr)
    assert command.startswith("/opt/rlsup/bin/rlsup install-service --config /root/rlsup.toml")
    box.ok(command, timeout=180)
    wait_training(box, game("cart"))
    assert "/opt/rlsup/bin/rlsup" in box.show("ExecStart")
    assert box.ok("ps -o user= -p $(systemctl show -p MainPID --value rlsup)").strip() == "rlsup"
