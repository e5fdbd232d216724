"""The supervisor's own log (`supervisor.observe.logs.configure_logging`): syslog priorities on the
journal only, the level from `--log-level`, NO_COLOR on a terminal."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from harness.runs import REPO, env_for, rlsup, write_config
from supervisor.observe.logs import colors_wanted, level_number, on_journal

pytestmark = pytest.mark.e2e

# Every level once, through the real configure_logging, in a fresh process (it configures once).
SCRIPT = """
import sys, structlog
from supervisor.observe.logs import configure_logging, level_number
configure_logging(level=level_number(sys.argv[1]))
log = structlog.get_logger("rlsup.test")
log.debug("d"); log.info("i"); log.warning("w"); log.error("e"); log.critical("c")
"""


def log_every_level(stderr: object, level: str = "debug", **extra_env: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "NO_COLOR")}
    subprocess.run(
        [sys.executable, "-c", SCRIPT, level],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO), **extra_env},
        stderr=stderr,  # type: ignore[arg-type]
        stdout=subprocess.DEVNULL,
        check=True,
        timeout=60,
    )


def journal_stream_of(path: Path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def test_on_the_journal_each_line_carries_its_syslog_priority(tmp_path: Path) -> None:
    out = tmp_path / "journal"
    with open(out, "wb") as f:
        log_every_level(f, JOURNAL_STREAM=journal_stream_of(out))
    lines = out.read_text().splitlines()
    assert [ln[:3] for ln in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>"]
    assert [json.loads(ln[3:])["event"] for ln in lines] == ["d", "i", "w", "e", "c"]


def test_off_the_journal_lines_are_plain_json(tmp_path: Path) -> None:
    out, other = tmp_path / "stderr", tmp_path / "elsewhere"
    other.write_text("")
    for extra in ({}, {"JOURNAL_STREAM": journal_stream_of(other)}, {"JOURNAL_STREAM": "junk"}):
        with open(out, "wb") as f:
            log_every_level(f, **extra)
        lines = out.read_text().splitlines()
        assert [json.loads(ln)["level"] for ln in lines] == [
            "debug",
            "info",
            "warning",
            "error",
            "critical",
        ], extra


def test_the_level_drops_less_severe_lines(tmp_path: Path) -> None:
    out = tmp_path / "journal"
    with open(out, "wb") as f:
        log_every_level(f, "warning", JOURNAL_STREAM=journal_stream_of(out))
    assert [ln[:3] for ln in out.read_text().splitlines()] == ["<4>", "<3>", "<2>"]


def console_output(**extra_env: str) -> str:
    leader, follower = pty.openpty()
    try:
        log_every_level(follower, "info", **extra_env)
    finally:
        os.close(follower)
    out = b""
    while select.select([leader], [], [], 5)[0]:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the writer is gone
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return out.decode()


def test_the_console_on_a_terminal_honours_no_color() -> None:
    assert "\x1b[" in console_output()
    plain = console_output(NO_COLOR="1")
    assert "\x1b[" not in plain and "warning" in plain


def test_colors_wanted_follows_no_color_and_the_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert colors_wanted(Tty(), {})
    assert colors_wanted(Tty(), {"NO_COLOR": ""})
    assert not colors_wanted(Tty(), {"NO_COLOR": "1"})
    assert not colors_wanted(io.StringIO(), {})


def test_on_journal_needs_the_streams_own_device_and_inode(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("")
    with open(path) as f:
        assert on_journal(f, {"JOURNAL_STREAM": journal_stream_of(path)})
        assert not on_journal(f, {})
        assert not on_journal(f, {"JOURNAL_STREAM": "1:2"})
        assert not on_journal(io.StringIO(), {"JOURNAL_STREAM": journal_stream_of(path)})


def test_level_names() -> None:
    assert level_number("warning") == 30 and level_number("DEBUG") == 10
    with pytest.raises(ValueError, match="unknown log level"):
        level_number("verbose")


def test_run_rejects_an_unknown_log_level(tmp_path: Path) -> None:
    config = write_config(tmp_path, [("g", 1000)])
    env = env_for(tmp_path)
    r = rlsup("run", "--config", str(config), "--log-level", "verbose", env=env)
    assert r.returncode == 2 and "--log-level" in r.stderr
    r = rlsup("run", "--config", str(config), env={**env, "RLSUP_LOG_LEVEL": "loud"})
    assert r.returncode == 2 and "RLSUP_LOG_LEVEL" in r.stderr
    assert not (tmp_path / "state").exists(), "nothing started"
