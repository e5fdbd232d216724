"""Alert hooks ([[hooks]]): real programs, run off the caller's thread, bounded, reported."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from supervisor.config import ConfigError, HookSpec, parse_config
from supervisor.observe.hooks import HookRunner

pytestmark = pytest.mark.e2e

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
    # (no `exec -a`: dash has none; the script failed at once and passed only by defect 6)
    script.write_text("#!/bin/sh\nsleep 300 &\nexec sleep 300\n")
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
        (  # whether the program exists is for run/check-config: test_check_config_refuses_...
            '[[hooks]]\non = ["fatal"]\ncommand = ["/bin/true"]\npass_env = ["A B"]\n',
            "environment variable names",
        ),
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


# ---- issue 24: bounded output, timeouts that hold, lanes, environment, programs ------------


def leftover(argv: list[str]) -> list[psutil.Process]:
    """Our processes whose command line is exactly `argv` (a marker no one else uses)."""
    out = []
    for p in psutil.process_iter(["cmdline", "uids"]):
        if p.info["cmdline"] == argv and p.info["uids"] and p.info["uids"].real == os.getuid():
            out.append(p)
    return out


def kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


BIG_OUTPUT = """\
import resource, sys, time
from supervisor.config import HookSpec
from supervisor.observe.hooks import HookRunner

size = int(sys.argv[1])
spec = HookSpec(("fatal",), ("/bin/sh", "-c", f"head -c {size} /dev/zero; echo; echo THE-END"))
runner = HookRunner((spec,))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
runner.fire("fatal", None, {}, time.time())
deadline = time.monotonic() + 60
results = []
while not results and time.monotonic() < deadline:
    results = runner.drain()[0]
    time.sleep(0.05)
runner.close(wait_s=5)
grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print("RESULT", grown_kib, [r.error for r in results], flush=True)
"""


def test_a_hooks_huge_output_costs_the_supervisor_no_memory(tmp_path: Path) -> None:
    size = 96 << 20
    got = subprocess.run(
        [sys.executable, "-c", BIG_OUTPUT, str(size)],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next(x for x in got.stdout.splitlines() if x.startswith("RESULT"))
    _, grown_kib, errors = line.split(" ", 2)
    assert errors == "['']", (errors, got.stderr[-2000:])  # one run, exited 0
    assert int(grown_kib) < 16 * 1024, f"the runner's peak RSS grew {int(grown_kib) >> 10} MiB"


def test_a_hooks_output_goes_to_its_log_and_its_tail_to_the_journal_line(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    body = "".join(f"line {i}\n" for i in range(20_000))  # ~200 KB
    (tmp_path / "body.txt").write_text(body)
    spec = HookSpec(("fatal",), ("/bin/sh", "-c", f"cat {tmp_path / 'body.txt'}; echo bye >&2"))
    runner = HookRunner((spec,), log_dir=logs)
    try:
        runner.fire("fatal", "pong", {}, time.time())
        [result] = drain_all(runner, 1)
    finally:
        runner.close(wait_s=10)
    assert not result.failed
    assert result.output.endswith("line 19999\nbye") and len(result.output) <= 4096
    logged = (logs / "hooks.log").read_text().splitlines()
    assert len(logged) == 20_001, logged[-3:]
    assert all(" hook 0 " in x for x in logged)  # each line says whose it is
    assert logged[0].endswith("line 0") and logged[-1].endswith("bye")
    assert (logs / "hooks.log").stat().st_mode & 0o777 == 0o600


def test_a_descendant_in_another_session_holding_the_output_does_not_outlast_the_timeout(
    tmp_path: Path,
) -> None:
    marker = ["sleep", f"{300 + os.getpid() % 1000}.25"]
    # The hook starts a child in a new session (out of its process group) that holds the
    # hook's stdout, then waits: at timeout_s the whole of it ends, the child included.
    script = f"setsid {' '.join(marker)} &\necho started\nsleep 300\n"
    runner = HookRunner((HookSpec(("fatal",), ("/bin/sh", "-c", script), timeout_s=1.0),))
    try:
        t0 = time.monotonic()
        runner.fire("fatal", "pong", {}, time.time())
        [result] = drain_all(runner, 1, timeout=20)
        took = time.monotonic() - t0
        assert result.returncode is None and "timeout_s of 1 s" in result.error
        assert took < 10, took
        assert result.output == "started"
        wait_gone = time.monotonic() + 5
        while leftover(marker) and time.monotonic() < wait_gone:
            time.sleep(0.05)
        assert not leftover(marker), "the hook's descendant in another session outlived it"
    finally:
        kill_all(leftover(marker))
        runner.close(wait_s=1)


def test_a_hook_that_exits_is_done_even_if_its_descendant_keeps_its_output(
    tmp_path: Path,
) -> None:
    marker = ["sleep", f"{300 + os.getpid() % 1000}.5"]
    script = f"setsid {' '.join(marker)} &\necho sent\n"  # exits at once; the child holds stdout
    runner = HookRunner((HookSpec(("fatal",), ("/bin/sh", "-c", script), timeout_s=60),))
    try:
        t0 = time.monotonic()
        runner.fire("fatal", "pong", {}, time.time())
        [result] = drain_all(runner, 1, timeout=20)
        assert time.monotonic() - t0 < 10  # not its timeout_s of 60 s
        assert not result.failed and result.output == "sent"
        wait_gone = time.monotonic() + 5
        while leftover(marker) and time.monotonic() < wait_gone:
            time.sleep(0.05)
        assert not leftover(marker), "what the hook left running was not stopped with it"
    finally:
        kill_all(leftover(marker))
        runner.close(wait_s=1)


def test_a_slow_hook_never_delays_another_hook(tmp_path: Path) -> None:
    marker = ["sleep", f"{300 + os.getpid() % 1000}.75"]
    slow = HookSpec(("*",), tuple(marker), timeout_s=60)
    pager = HookSpec(("fatal",), ("/bin/true",))
    runner = HookRunner((slow, pager))
    try:
        for _ in range(6):  # more slow runs than hooks may run at once
            runner.fire("worker_crash", "pong", {}, time.time())
        runner.fire("fatal", "pong", {}, time.time())  # the pager's, and a 7th slow one
        [paged] = drain_all(runner, 1, timeout=15)
        assert paged.hook == 1 and not paged.failed
        assert leftover(marker), "the slow runs still run"
    finally:
        runner.close(wait_s=0)  # the supervisor's stop: what still runs is killed
        gone = time.monotonic() + 10
        while leftover(marker) and time.monotonic() < gone:
            time.sleep(0.05)
        left = leftover(marker)
        kill_all(left)
    assert not left, "the supervisor's stop left hook runs behind"


ENV_DUMP = """\
import json, os, sys
with open(sys.argv[1], "w") as f:
    json.dump(dict(os.environ), f)
"""


def test_a_hook_gets_an_allow_listed_environment_not_the_services(tmp_path: Path) -> None:
    (tmp_path / "dump.py").write_text(ENV_DUMP)
    out = tmp_path / "env.json"
    service_env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/var/lib/rlsup",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "HTTPS_PROXY": "http://proxy:3128",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",  # the mirror's credentials: none of a hook's business
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "SLACK_TOKEN": "xoxb-1",
    }
    spec = HookSpec(
        ("fatal",), (sys.executable, str(tmp_path / "dump.py"), str(out)), pass_env=("SLACK_TOKEN",)
    )
    runner = HookRunner((spec,), env=service_env)
    try:
        runner.fire("fatal", "pong", {}, time.time())
        [result] = drain_all(runner, 1)
    finally:
        runner.close(wait_s=10)
    assert not result.failed, result.error
    got = json.loads(out.read_text())
    assert "AWS_SECRET_ACCESS_KEY" not in got and "NOTIFY_SOCKET" not in got
    for key in ("PATH", "HOME", "LANG", "TZ", "HTTPS_PROXY", "SLACK_TOKEN"):
        assert got.get(key) == service_env[key], key
    assert got["RLSUP_EVENT_KIND"] == "fatal" and got["RLSUP_GAME"] == "pong"


def check_config(
    tmp_path: Path, hook_command: list[str], *, path: str
) -> subprocess.CompletedProcess[str]:
    return rlsup_in(tmp_path, hook_command, "check-config", path=path)


def rlsup_in(
    tmp_path: Path, hook_command: list[str], *args: str, path: str = "/usr/bin:/bin"
) -> subprocess.CompletedProcess[str]:
    """`rlsup ARGS` on a configuration with one hook, run by a caller whose PATH is `path`."""
    config = tmp_path / "rlsup.toml"
    config.write_text(BASE + f'[[hooks]]\non = ["fatal"]\ncommand = {json.dumps(hook_command)}\n')
    env = {k: v for k, v in os.environ.items() if k != "RLSUP_CONFIG"}
    env.update(PATH=path, RLSUP_BOOT_ID_PATH=str(tmp_path / "boot_id"))
    (tmp_path / "boot_id").write_text("boot-1\n")
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args, "--config", str(config)],
        cwd=Path(__file__).resolve().parents[3],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_config_refuses_a_hook_program_that_is_missing_or_not_executable(
    tmp_path: Path,
) -> None:
    plain = tmp_path / "notify.txt"
    plain.write_text("not a program\n")
    for program, why in ((str(tmp_path / "gone"), "no such file"), (str(plain), "not executable")):
        got = check_config(tmp_path, [program, "--urgent"], path="/usr/bin:/bin")
        assert got.returncode == 2, (program, got.stdout, got.stderr)
        assert "hooks[0].command" in got.stderr or "hooks.0.command" in got.stderr, got.stderr
        assert program in got.stderr and why in got.stderr, got.stderr


def test_a_bare_hook_program_is_found_as_the_service_would_not_on_the_callers_path(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "bin"
    mine.mkdir()
    (mine / "my-notify").write_text("#!/bin/sh\nexit 0\n")
    (mine / "my-notify").chmod(0o755)
    # On the operator's PATH only: the service (PATH of systemd's default) would not find it.
    got = check_config(tmp_path, ["my-notify"], path=f"{mine}:/usr/bin:/bin")
    assert got.returncode == 2 and "my-notify" in got.stderr, got.stderr
    assert "/usr/local/bin" in got.stderr  # says where the service looks
    # A program in the service's PATH passes, whatever the caller's PATH says.
    assert check_config(tmp_path, ["true"], path=str(mine)).returncode == 0


def test_read_only_commands_never_fail_on_a_hook_program(tmp_path: Path) -> None:
    for command in (["no-such-notify-xyz"], [str(tmp_path / "gone")]):
        got = rlsup_in(tmp_path, command, "status", path="/usr/bin:/bin")
        assert got.returncode == 3, (command, got.stdout, got.stderr)  # 3: not running
        got = rlsup_in(tmp_path, command, "events", path="/usr/bin:/bin")
        assert got.returncode == 0, (command, got.stdout, got.stderr)


def test_a_hook_runs_when_the_supervisor_holds_more_than_1024_descriptors() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"descriptor limit {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:  # the hook's pipe gets a number past select()'s
            held += os.pipe()
        runner = HookRunner((HookSpec(("fatal",), ("/bin/sh", "-c", "echo fine")),))
        try:
            runner.fire("fatal", None, {}, time.time())
            [result] = drain_all(runner, 1)
        finally:
            runner.close(wait_s=5)
        assert not result.failed and result.output == "fine", result.error
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
