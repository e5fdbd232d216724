"""`[mirror]` values are checked at load time by the S3 client's own rules (botocore's
validators), so a value the client would refuse is a configuration error naming the file, the
line and the key, not a worker crash loop, an uploader crash loop and a `pull` traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.runs import REPO, env_for, write_config
from supervisor.config import ConfigError, check_for_service, load_config

pytestmark = pytest.mark.e2e


def _with_mirror(tmp_path: Path, body: str) -> Path:
    path = write_config(tmp_path, [("g", 1000)])
    path.write_text(path.read_text() + f'\n[mirror]\nurl = "s3://rlsup-test/runs"\n{body}\n')
    return path


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("endpoint_url", "http://s3_server:8333"),  # an underscore: not a host name
        ("endpoint_url", "http://-s3:8333"),
        ("region", "eu_west_1"),
        ("region", "eu-west-1-"),
    ],
)
def test_a_mirror_value_botocore_refuses_names_file_line_and_key(
    tmp_path: Path, key: str, value: str
) -> None:
    path = _with_mirror(tmp_path, f'{key} = "{value}"')
    with pytest.raises(ConfigError) as err:
        check_for_service(load_config(path))
    message = str(err.value)
    assert str(path) in message
    assert f"line {_line_of(path, key)}: mirror.{key}" in message
    assert repr(value) in message


@pytest.mark.parametrize(
    "body",
    [
        'endpoint_url = "http://127.0.0.1:8333"\nregion = "us-east-1"',
        'endpoint_url = "https://s3.eu-west-1.amazonaws.com"\nregion = "eu-west-1"',
        'endpoint_url = "http://[::1]:8333"',
        'endpoint_url = "http://s3-server:8333"\nregion = "garage"',
        "",
    ],
)
def test_mirror_values_botocore_accepts_load(tmp_path: Path, body: str) -> None:
    cfg = check_for_service(load_config(_with_mirror(tmp_path, body)))
    assert cfg.mirror is not None


def test_read_only_commands_neither_import_botocore_nor_fail_on_its_rules(tmp_path: Path) -> None:
    """`rlsup status` and the other read-only commands load the file without the S3 client's
    rules: they never fail on a mirror value, and pay no botocore import (~260 ms)."""
    path = _with_mirror(tmp_path, 'endpoint_url = "http://s3_server:8333"')
    probe = (
        "import sys; from supervisor.config import load_config; "
        f"cfg = load_config({str(path)!r}); "
        "assert cfg.mirror is not None; assert 'botocore' not in sys.modules, 'botocore'"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("command", [["check-config"], ["pull", "--game", "g"]])
def test_a_command_that_uses_the_mirror_refuses_the_endpoint_with_exit_2(
    tmp_path: Path, command: list[str]
) -> None:
    path = _with_mirror(tmp_path, 'endpoint_url = "http://s3_server:8333"')
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *command, "--config", str(path)],
        cwd=REPO,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "mirror.endpoint_url" in done.stderr and "Traceback" not in done.stderr
