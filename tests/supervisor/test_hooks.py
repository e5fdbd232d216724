"""Alert hooks ([[hooks]]): real programs, run off the caller's thread, bounded, reported."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from supervisor.config import ConfigError, HookSpec, parse_config
from supervisor.hooks import HookRunner

RECORD = """\
import json, os, sys
event = json.load(sys.stdin)
event["env"] = {k: os.environ.get(k) for k in ("RLSUP_EVENT_KIND", "RLSUP_GAME")}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(event) + "\\n")
"""


def drain_all(runner: HookRunner, n: int, timeout: float = 30.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n} hook runs finished"
        got += runner.drain()[0]
        time.sleep(0.05)
    return got


def test_a_hook_gets_the_event_on_stdin_and_its_kind_and_game_in_the_environment(
    tmp_path: Path,
) -> None:
    (tmp_path / "record.py").write_text(RECORD)
    out = tmp_path / "calls.jsonl"
    spec = HookSpec(
        ("fatal", "host_reboot"), (sys.executable, str(tmp_path / "record.py"), str(out))
    )
    runner = HookRunner((spec,))
    try:
        runner.fire("fatal", "pong", {"reason": "restart budget spent"}, 1700000000.5)
        runner.fire("host_reboot", None, {"downtime_s": 12.0}, 1700000001.0)
        runner.fire("worker_crash", "pong", {}, 1700000002.0)  # not one of its kinds
        results = drain_all(runner, 2)
    finally:
        runner.close(wait_s=10)
    assert all(not r.failed for r in results)
    calls = sorted((json.loads(x) for x in out.read_text().splitlines()), key=lambda c: c["ts"])
    assert [c["kind"] for c in calls] == ["fatal", "host_reboot"]
    assert calls[0]["game"] == "pong" and calls[0]["detail"] == {"reason": "restart budget spent"}
    assert calls[0]["env"] == {"RLSUP_EVENT_KIND": "fatal", "RLSUP_GAME": "pong"}
    assert calls[1]["env"] == {"RLSUP_EVENT_KIND": "host_reboot", "RLSUP_GAME": ""}
    assert calls[1]["game"] is None and calls[1]["host"]


def test_a_hung_hook_is_killed_with_its_children_at_its_timeout_and_reported(
    tmp_path: Path,
) -> None:
    marker = f"rlsup-hook-test-{os.getpid()}"
    script = tmp_path / "hang.sh"
    script.write_text(f"#!/bin/sh\nsleep 300 &\nexec -a {marker} sleep 300\n")
    script.chmod(0o755)
    runner = HookRunner((HookSpec(("fatal",), (str(script),), timeout_s=1.0),))
    try:
        runner.fire("fatal", "pong", {}, time.time())
        assert runner.drain() == ([], 0)  # fire() returned; the hook still runs
        [result] = drain_all(runner, 1)
    finally:
        runner.close(wait_s=10)
    assert result.failed and result.returncode is None
    assert "timeout_s of 1 s" in result.error
    time.sleep(0.2)
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any(marker in a or a == "300" for a in (p.info["cmdline"] or []))
        and p.info["cmdline"][0] in ("sleep", marker)
        and p.ppid() in (1, os.getpid())
    ]
    assert not left, [p.info["cmdline"] for p in left]


def test_a_failing_or_missing_program_is_reported_not_retried(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    runner = HookRunner(
        (
            HookSpec(("*",), ("/bin/sh", "-c", "echo oops; exit 3")),
            HookSpec(("fatal",), (str(gone),)),
        )
    )
    try:
        runner.fire("fatal", "pong", {}, time.time())
        results = sorted(drain_all(runner, 2), key=lambda r: r.hook)
        # Events about hooks never fire hooks, even a "*" one: no loop.
        runner.fire("hook_failed", "pong", {}, time.time())
        time.sleep(0.3)
        assert runner.drain() == ([], 0)
    finally:
        runner.close(wait_s=10)
    assert results[0].returncode == 3 and "status 3" in results[0].error
    assert results[1].returncode is None and "could not run" in results[1].error
    detail = results[0].detail(runner.hooks[0])
    assert detail["command"] == ["/bin/sh", "-c", "echo oops; exit 3"]
    assert detail["event"] == "fatal" and detail["returncode"] == 3


def test_a_hook_can_be_limited_to_some_games() -> None:
    runner = HookRunner((HookSpec(("fatal",), ("/bin/true",), games=("pong",)),))
    spec = runner.hooks[0]
    try:
        assert runner.matches(spec, "fatal", "pong")
        assert not runner.matches(spec, "fatal", "breakout")
        assert runner.matches(spec, "fatal", None)  # host-wide events reach every hook
        assert not runner.matches(spec, "scale_down", "pong")
    finally:
        runner.close(wait_s=1)


BASE = """\
state_dir = "s"
[modes.light]
num_envs = 4
batch_size = 64
max_concurrent = 1
[[games]]
name = "pong"
env_id = "CartPole-v1"
total_steps = 1000
"""


def load(tmp_path: Path, extra: str):  # type: ignore[no-untyped-def]
    import tomllib

    text = BASE + textwrap.dedent(extra)
    return parse_config(tomllib.loads(text), tmp_path / "rlsup.toml", text)


def test_hooks_and_metrics_configuration(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        [metrics]
        textfile = "node/rlsup.prom"
        listen = 9469
        [[hooks]]
        on = ["fatal", "host_reboot"]
        command = ["curl", "-s", "https://hooks.example/x"]
        """,
    )
    assert cfg.metrics.textfile == tmp_path / "node" / "rlsup.prom"
    assert (cfg.metrics.listen_host, cfg.metrics.listen_port) == ("127.0.0.1", 9469)
    assert cfg.hooks[0].on == ("fatal", "host_reboot") and cfg.hooks[0].timeout_s == 30.0
    assert load(tmp_path, "").metrics.enabled is False  # no listener unless asked for
    wide = load(tmp_path, '[metrics]\nlisten = "0.0.0.0:9100"\n').metrics
    assert (wide.listen_host, wide.listen_port) == ("0.0.0.0", 9100)
    assert load(tmp_path, '[metrics]\nlisten = ":9100"\n').metrics.listen_host == "127.0.0.1"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[[hooks]]\non = ["fatl"]\ncommand = ["/bin/true"]\n', "did you mean fatal"),
        ('[[hooks]]\non = ["fatal"]\ncommand = ["no-such-prog-xyz"]\n', "no such program"),
        ('[[hooks]]\non = ["fatal"]\ncommand = "/bin/true"\n', "an argv list"),
        ('[[hooks]]\non = []\ncommand = ["/bin/true"]\n', "non-empty list"),
        ('[[hooks]]\non = ["fatal"]\ncommand = ["/bin/true"]\ngames = ["x"]\n', "unknown game"),
        ('[[hooks]]\non = ["fatal"]\n', "command: missing"),
        ('[metrics]\nlisten = "localhost"\n', "HOST:PORT"),
        ("[metrics]\nlisten = 70000\n", "HOST:PORT"),
        ('[metrics]\ntextfile = "x.txt"\n', ".prom"),
        ("[metrics]\nport = 1\n", "unknown key"),
    ],
)
def test_bad_hooks_or_metrics_are_named_in_the_error(
    tmp_path: Path, extra: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, extra)
    assert message in str(err.value), str(err.value)
    assert "rlsup.toml" in str(err.value)
