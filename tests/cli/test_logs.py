"""`rlsup logs`: the readable rendering, the tail, and following across rotation."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from follow import Follow

from supervisor.commands.logs import LogFollower, tail_offset
from supervisor.observe.logs import render_log_line

pytestmark = pytest.mark.e2e

UTC = time.gmtime
CONFIG = """\
state_dir = "state"
[modes.light]
num_envs = 4
batch_size = 128
n_steps = 64
max_concurrent = 1
[[games]]
name = "pong"
env_id = "Pong-v5"
algo = "ppo"
total_steps = 1000
"""


def record(event: str, level: str = "info", **fields: object) -> str:
    return json.dumps(
        {**fields, "event": event, "level": level, "timestamp": "2026-11-24T09:31:25.123456Z"}
    )


# ---- rendering ------------------------------------------------------------------------------


def test_a_json_line_reads_time_level_event_then_fields() -> None:
    line = record("checkpoint_failed", "warning", step=1234, error="disk full")
    assert render_log_line(line + "\n", local=UTC) == (
        '2026-11-24 09:31:25 warning  checkpoint_failed  step=1234 error="disk full"'
    )


def test_field_values_are_bare_words_or_json() -> None:
    line = record("x", path="/a/b", empty="", n=1.5, flag=True, none=None, xs=[1, 2], eq="a=b")
    out = render_log_line(line, local=UTC)
    assert out.endswith('path=/a/b empty="" n=1.5 flag=true none=null xs=[1,2] eq="a=b"'), out


def test_a_traceback_follows_its_line_indented() -> None:
    line = record("worker_error", "error", exception="Traceback:\n  File x\nValueError: y\n")
    assert render_log_line(line, local=UTC).splitlines() == [
        "2026-11-24 09:31:25 error    worker_error",
        "    Traceback:",
        "      File x",
        "    ValueError: y",
    ]


@pytest.mark.parametrize(
    "line", ["Traceback (most recent call last):", "", "[1, 2]", '{"broken": ', "plain text"]
)
def test_a_line_that_is_not_a_json_object_is_printed_as_is(line: str) -> None:
    assert render_log_line(line + "\n") == line


def test_colour_only_when_asked() -> None:
    line = record("checkpoint_failed", "error", step=1)
    assert "\x1b[" not in render_log_line(line, local=UTC)
    coloured = render_log_line(line, color=True, local=UTC)
    assert "\x1b[31merror" in coloured
    assert "\x1b[1mcheckpoint_failed\x1b[0m" in coloured


# ---- the tail -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "n", "expected"),
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 5, b"a\nb\nc\n"),
        (b"a\nb\nc", 2, b"b\nc"),  # an unterminated last line counts, like tail
        (b"a\nb\nc", 0, b"c"),  # -n 0: from the end of the last complete line
        (b"a\nb\nc\n", 0, b""),
        (b"", 3, b""),
    ],
)
def test_tail_offset(content: bytes, n: int, expected: bytes) -> None:
    f = io.BytesIO(content)
    assert content[tail_offset(f, n) :] == expected


def test_tail_offset_across_read_blocks() -> None:
    content = b"".join(b"line %04d\n" % i for i in range(1000))
    start = tail_offset(io.BytesIO(content), 300, block=7)
    assert content[start:].splitlines()[0] == b"line 0700"


# ---- following ------------------------------------------------------------------------------


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_follower_reads_on_into_the_next_file_after_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "pong.log"
    append(log, b"1\n2\n")
    follower = LogFollower(log)
    assert follower.poll() == [b"1\n", b"2\n"]
    append(log, b"3\n")  # written after the last poll, before the rotation
    os.replace(log, tmp_path / "pong.log.1")
    assert follower.poll() == [b"3\n"]  # no new file yet: still the old one
    append(log, b"4\n")
    assert follower.poll() == [b"4\n"]
    assert follower.poll() == []
    follower.close()


def test_follower_waits_for_a_log_that_does_not_exist_yet(tmp_path: Path) -> None:
    log = tmp_path / "pong.log"
    follower = LogFollower(log)
    assert follower.poll() == []
    append(log, b"first\n")
    assert follower.poll() == [b"first\n"]
    follower.close()


def test_follower_holds_a_line_until_it_is_complete(tmp_path: Path) -> None:
    log = tmp_path / "pong.log"
    append(log, b'{"event": "che')
    follower = LogFollower(log)
    assert follower.poll() == []
    append(log, b'ckpoint"}\n')
    assert follower.poll() == [b'{"event": "checkpoint"}\n']
    follower.close()


def test_follower_ends_an_unfinished_last_line_at_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "pong.log"
    append(log, b"killed mid-li")
    follower = LogFollower(log)
    assert follower.poll() == []
    os.replace(log, tmp_path / "pong.log.1")
    append(log, b"next\n")
    assert follower.poll() == [b"killed mid-li\n", b"next\n"]
    follower.close()


def test_follower_starts_over_after_a_truncation(tmp_path: Path) -> None:
    log = tmp_path / "pong.log"
    append(log, b"old line one\nold line two\n")
    follower = LogFollower(log)
    assert len(follower.poll()) == 2
    log.write_bytes(b"new\n")
    assert follower.poll() == [b"new\n"]
    follower.close()


# ---- the command ----------------------------------------------------------------------------


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "rlsup.toml").write_text(CONFIG)
    (tmp_path / "state" / "logs").mkdir(parents=True)
    return tmp_path


def rlsup_argv(site: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "supervisor.cli",
        "logs",
        "--config",
        str(site / "rlsup.toml"),
        "pong",
        *args,
    ]


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "RLSUP_CONFIG")}
    return {**base, "PYTHONPATH": str(REPO), **extra}


def logs(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        rlsup_argv(site, *args), cwd=REPO, env=env(), capture_output=True, text=True, timeout=60
    )


def test_logs_off_a_terminal_prints_the_raw_lines(site: Path) -> None:
    lines = [record("a", step=1), "not json", record("b", "warning", step=2)]
    (site / "state" / "logs" / "pong.log").write_text("\n".join(lines) + "\n")
    assert logs(site).stdout == "\n".join(lines) + "\n"
    assert logs(site, "--json", "-n", "1").stdout == lines[2] + "\n"


def test_logs_pretty_renders_off_a_terminal(site: Path) -> None:
    lines = [record("a", step=1), "not json", record("b", "warning", step=2)]
    (site / "state" / "logs" / "pong.log").write_text("\n".join(lines) + "\n")
    out = logs(site, "--pretty", "-n", "2").stdout.splitlines()
    assert out[0] == "not json"
    assert out[1].endswith(" warning  b  step=2") and "\x1b[" not in out[1]


def test_logs_of_a_game_not_started_fails_without_follow(site: Path) -> None:
    r = logs(site)
    assert r.returncode == 1 and "no log yet" in r.stderr


def run_on_a_terminal(site: Path, extra_env: dict[str, str]) -> str:
    """`rlsup logs pong` with its stdout on a pseudo-terminal; what it printed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        rlsup_argv(site), cwd=REPO, env=env(**extra_env), stdout=follower, stderr=subprocess.PIPE
    )
    os.close(follower)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 30)
            assert ready, "no output from rlsup logs on a terminal"
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
        assert proc.wait(30) == 0
    return out.decode()


def test_logs_on_a_terminal_is_rendered_in_colour_unless_no_color(site: Path) -> None:
    (site / "state" / "logs" / "pong.log").write_text(record("checkpoint", "info", step=7) + "\n")
    coloured = run_on_a_terminal(site, {})
    assert "checkpoint" in coloured and "\x1b[32minfo" in coloured and '"event"' not in coloured
    plain = run_on_a_terminal(site, {"NO_COLOR": "1"})
    assert "\x1b[" not in plain and " info     checkpoint  step=7" in plain
    assert "\x1b[" in run_on_a_terminal(site, {"NO_COLOR": ""}), "NO_COLOR empty: colours"


def test_follow_waits_for_the_log_then_follows_it_across_a_rotation(site: Path) -> None:
    log = site / "state" / "logs" / "pong.log"
    f = Follow(rlsup_argv(site, "-f", "--json"), env())
    try:
        f.wait_stderr("waiting for")  # started before the log exists
        append(log, b"one\ntwo\n")
        f.wait_for(lambda got: got == ["one", "two"])
        append(log, b"three\n")
        os.replace(log, log.with_name("pong.log.1"))  # as the supervisor rotates it
        append(log, b"four\n")
        assert f.wait_for(lambda got: len(got) >= 4) == ["one", "two", "three", "four"]
    finally:
        assert f.interrupt() == 0


def test_follow_with_n_0_prints_only_new_lines(site: Path) -> None:
    log = site / "state" / "logs" / "pong.log"
    append(log, b"old\n")
    f = Follow(rlsup_argv(site, "-f", "-n", "0", "--json"), env())
    try:
        f.wait_open(log)
        append(log, b"new\n")
        assert f.wait_for(lambda got: got) == ["new"]
    finally:
        assert f.interrupt() == 0
