"""Shared helpers for the supervisor tests: configs, a supervisor subprocess, waiting."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

MODES = """
[modes.light]
num_envs = 4
batch_size = 128
n_steps = 64
max_concurrent = {max_concurrent}
[modes.medium]
num_envs = 8
batch_size = 128
n_steps = 64
max_concurrent = {max_concurrent}
"""


# The head of an in-process supervisor's configuration: a fast loop and one tiny mode, `light`
# (each test adds its max_concurrent, games and sections).
FAST_LIGHT_HEAD = """\
state_dir = "state"
stop_grace_s = 5
tick_s = 0.05
[modes.light]
num_envs = 2
batch_size = 2
n_steps = 4
"""


def game_toml(name: str, total_steps: int, env_id: str = "CartPole-v1", seed: int = 1) -> str:
    return (
        f'[[games]]\nname = "{name}"\nenv_id = "{env_id}"\nalgo = "ppo"\n'
        f'total_steps = {total_steps}\nseed = {seed}\ndevice = "cpu"\n'
        "args = { eval_episodes = 0 }\n"
    )


def write_config(
    directory: Path,
    games: list[tuple[str, int]],
    *,
    max_concurrent: int = 2,
    extra: str = "",
    restart: str = "",
    watchdog: str = "",
) -> Path:
    text = (
        f'state_dir = "state"\ncheckpoint_every_s = 1\nstop_grace_s = 20\n{extra}\n'
        + MODES.format(max_concurrent=max_concurrent)
        + "".join(game_toml(n, s) for n, s in games)
        + "[restart]\nbackoff_base_s = 0.3\nbackoff_max_s = 1\nbudget = 5\n"
        + "budget_window_s = 600\nstable_after_s = 30\n"
        + restart
        + "[watchdog]\nstartup_grace_s = 90\nhang_timeout_s = 5\nkill_grace_s = 10\n"
        + watchdog
    )
    path = directory / "rlsup.toml"
    path.write_text(text)
    return path


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env["RLSUP_BOOT_ID_PATH"] = str(tmp / "boot_id")
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "RLSUP_CONFIG"):
        env.pop(key, None)
    env.update(extra)
    if not (tmp / "boot_id").exists():
        (tmp / "boot_id").write_text("boot-1\n")
    return env


def rlsup(
    *args: str, env: dict[str, str], timeout: float = 60, **kw: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def start_supervisor(
    config: Path, env: dict[str, str], *extra: str, log: Path | None = None
) -> subprocess.Popen[bytes]:
    out = open(log or config.parent / "supervisor.log", "ab")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "run", "--config", str(config), *extra],
        env=env,
        cwd=REPO,
        stdout=out,
        stderr=out,
        start_new_session=True,
    )


def spare_ready_now(state: Path, host: str | None = None) -> bool:
    """The newest spare event of `host` (None: this host's own spare, whose events name no
    host) is its `spare_ready`: a ready spare, not taken since."""
    kinds = [e["kind"] for e in events(state, None)
             if e["kind"].startswith("spare_") and e["detail"].get("host") == host]  # fmt: skip
    return bool(kinds) and kinds[-1] == "spare_ready"


def wait_for(pred: Callable[[], Any], timeout: float, what: str, poll: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def heartbeat(state: Path, game: str) -> dict[str, Any] | None:
    try:
        return json.loads((state / "runs" / game / "heartbeat.json").read_text())
    except (OSError, ValueError):
        return None


def committed_step(state: Path, game: str) -> int:
    best = -1
    ckpts = state / "runs" / game / "checkpoints"
    if ckpts.is_dir():
        for p in ckpts.iterdir():
            if p.name.startswith("ckpt-") and (p / "MANIFEST.json").exists():
                best = max(best, int(p.name[5:]))
    return best


def query(state: Path, sql: str, *params: Any) -> list[sqlite3.Row]:
    conn = sqlite3.connect(state / "rlsup.db", timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def events(state: Path, kind: str | None = None, game: str | None = None) -> list[dict[str, Any]]:
    try:
        rows = query(state, "SELECT * FROM events ORDER BY id")
    except sqlite3.Error:
        return []
    out = [dict(r) | {"detail": json.loads(r["detail"])} for r in rows]
    return [
        e
        for e in out
        if (kind is None or e["kind"] == kind) and (game is None or e["game"] == game)
    ]


def training_pid(
    state: Path, game: str, *, not_pid: int | None = None, min_step: int = 1
) -> int | None:
    """The pid of the game's worker once it trains (global_step >= min_step)."""
    hb = heartbeat(state, game)
    if hb and hb["pid"] != not_pid and hb["global_step"] >= min_step and hb["phase"] == "training":
        return int(hb["pid"])
    return None


def worker_pids(state: Path, game: str) -> list[int]:
    """Live worker processes whose --run-dir is this game's (never more than one)."""
    import psutil

    from supervisor.launch.spawn import process_argv

    run_dir = str(state / "runs" / game)
    pids = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = process_argv(p.info["cmdline"] or [])
        if "training.worker" in cmd and run_dir in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            pids.append(p.pid)
    return pids


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class FakeNvml:
    """`gpugate.NvmlLike` faked at the NVML seam: free memory set by the test; counts reads so
    tests can check the poll interval."""

    def __init__(self, free: float | None) -> None:
        self.free = free
        self.reads = 0

    def free_mb(self, index: int) -> float | None:
        self.reads += 1
        return self.free


def spin(sup: Any, until: Callable[[], object], timeout: float = 20) -> None:
    """Drive an in-process Supervisor's tick loop until `until()` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, {
            n: (rt.state, rt.reason) for n, rt in sup.games.items()
        }
        sup.safe_tick()
        sup.wait(0.05)


def close_supervisors(made: list[Any]) -> None:
    """Tear down in-process Supervisors: SIGKILL and reap their workers, then close them."""
    for sup in made:
        for rt in sup.life.all():
            if rt.proc is not None:
                sup.launcher.kill(rt.proc)
                rt.proc.popen.wait()
        sup.close()


def stop_supervisor(sup: subprocess.Popen[bytes], grace_s: float = 90) -> None:
    """SIGTERM (it stops its workers first), SIGKILL if it outlives the grace."""
    if sup.poll() is None:
        sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(grace_s)
        except subprocess.TimeoutExpired:
            sup.kill()
            sup.wait(10)
