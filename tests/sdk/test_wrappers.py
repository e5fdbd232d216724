"""A script started through a wrapper (`sh -c "...; ..."`, `uv run`, `conda run`, `poetry run`,
`torchrun`, `accelerate launch`) is a grandchild of the supervisor: `should_stop()` must stay
False while the supervisor lives, and turn True within about a second once it is gone.

Real processes: a supervisor stand-in starts the wrapper with the supervisor's own
`start_worker_process` (the environment a command game gets), the script trains, the stand-in
is SIGKILLed and left unreaped (a zombie, as dead as it gets before its parent waits)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from training import protocol as P

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

TRAIN = """
    import sys, time
    from pathlib import Path
    import rlsup

    run = rlsup.attach(checkpoint_every_s=3600)
    step, noticed = 0, None
    try:
        while True:
            step += 1
            time.sleep(0.002)
            run.heartbeat(step)
            stop = run.should_stop()
            if stop or run.should_checkpoint(step):
                noticed = time.time()
                with run.checkpoint(step) as d:  # exits 75 once committed, on a stop
                    (d / "step").write_text(str(step))
    except SystemExit as exc:
        Path("exit.json").write_text(__import__("json").dumps(
            {"code": exc.code, "step": step, "why": run.stop_reason, "noticed": noticed}
        ))
        raise
"""

# Stands in for `uv run` / `conda run` / `poetry run`: a Python process that runs the command
# as its child and waits for it.
PY_WRAPPER = """
    import subprocess, sys
    sys.exit(subprocess.call(sys.argv[1:]))
"""

SUPERVISOR = """
    import json, sys, time
    from pathlib import Path
    from supervisor.launch.spawn import start_worker_process

    cmd, cwd = json.loads(sys.argv[1]), Path(sys.argv[2])
    proc = start_worker_process(
        cmd, cwd / "game.log", cwd, extra_env={"RLSUP_RUN_DIR": str(cwd / "run")}
    )
    print(proc.pid, flush=True)
    time.sleep(3600)
"""


def _wrapped(name: str, script: Path) -> list[str] | None:
    """The command line of `script` under wrapper `name`, or None when it is not installed."""
    py = sys.executable
    if name == "sh -c":
        return ["sh", "-c", f"{py} {script}; true"]  # `;`: sh forks, it does not exec
    if name == "python wrapper":
        return [py, str(script.with_name("wrapper.py")), py, str(script)]
    found = shutil.which(name) or (str(VENV_BIN / name) if (VENV_BIN / name).exists() else None)
    if found is None:
        return None
    return {
        "torchrun": [found, "--standalone", "--nproc-per-node=1", str(script)],
        "uv": [found, "run", "--no-project", "python", str(script)],
        "conda": [found, "run", "-n", "base", "python", str(script)],
        "accelerate": [found, "launch", "--cpu", "--num_processes=1", str(script)],
    }.get(name)


class Game:
    """The supervisor stand-in and the game it started (a process group of its own)."""

    def __init__(self, tmp_path: Path, cmd: list[str]) -> None:
        self.dir = tmp_path
        self.run_dir = tmp_path / "run"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env = {k: v for k, v in env.items() if not k.startswith("RLSUP_") or k == "RLSUP_TEST_RUN"}
        self.supervisor = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(SUPERVISOR), json.dumps(cmd), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.supervisor.stdout is not None
        self.leader = int(self.supervisor.stdout.readline())

    def exit(self) -> dict[str, object] | None:
        path = self.dir / "exit.json"
        return json.loads(path.read_text()) if path.exists() else None

    def step(self) -> int:
        hb = P.read_heartbeat(self.run_dir)
        return 0 if hb is None else hb.global_step

    def close(self) -> None:
        self.supervisor.kill()
        self.supervisor.wait()
        with contextlib.suppress(ProcessLookupError):  # the wrapper's group: nothing left
            os.killpg(self.leader, signal.SIGKILL)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[str], Game]]:
    games: list[Game] = []

    def starting(wrapper: str) -> Game:
        script = tmp_path / "train.py"
        script.write_text(textwrap.dedent(TRAIN))
        (tmp_path / "wrapper.py").write_text(textwrap.dedent(PY_WRAPPER))
        cmd = _wrapped(wrapper, script)
        if cmd is None:
            pytest.skip(f"{wrapper} is not installed here")
        games.append(Game(tmp_path, cmd))
        return games[-1]

    yield starting
    for game in games:
        game.close()


def _wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


WRAPPERS = ["sh -c", "python wrapper", "torchrun", "uv", "conda", "accelerate"]


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_through_a_wrapper_the_supervisor_alive_is_no_stop_and_gone_is_one(
    start: Callable[[str], Game], wrapper: str
) -> None:
    game: Game = start(wrapper)
    # torchrun and accelerate import torch first: seconds on a small machine.
    _wait_for(lambda: game.step() > 0 or game.exit() is not None, 60, "the first step")
    first = time.monotonic()
    # Several of the checks' 0.5 s periods, hundreds of iterations: never a stop.
    _wait_for(lambda: time.monotonic() - first > 1.5 or game.exit() is not None, 10, "steps")
    assert game.exit() is None, f"stopped with the supervisor alive: {game.exit()}"
    assert game.step() > 100
    assert not (game.run_dir / P.CHECKPOINT_DIR).exists() or not any(
        p.name.startswith("ckpt-") for p in (game.run_dir / P.CHECKPOINT_DIR).iterdir()
    )

    killed = time.time()
    os.kill(game.supervisor.pid, signal.SIGKILL)  # not reaped yet: a zombie
    _wait_for(lambda: game.exit() is not None, 15, "the script to checkpoint and exit")
    done = game.exit()
    assert done is not None
    assert done["code"] == P.ExitCode.STOPPED and done["why"] == "supervisor gone"
    # At most one 0.5 s period between two looks at /proc, and an iteration.
    noticed_s = float(done["noticed"]) - killed  # type: ignore[arg-type]
    assert 0 <= noticed_s < 1.5, f"noticed after {noticed_s:.2f} s"
    ckpts = sorted(p.name for p in (game.run_dir / P.CHECKPOINT_DIR).iterdir())
    assert ckpts == [f"ckpt-{done['step']:012d}"]


# ---- the watch itself (training.protocol.ParentWatch: the SDK, the worker, the uploader) ------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not our parent: the supervisor as a grandchild sees it."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_supervisor_that_died_as_a_zombie_is_gone_once_the_period_passed(
    stranger: subprocess.Popen[bytes],
) -> None:
    clock = Clock()
    ticks = P.process_start_ticks(stranger.pid)
    watch = P.ParentWatch(stranger.pid, ticks, clock=clock)
    assert not watch.gone()
    stranger.kill()  # not reaped: /proc still lists it, state Z
    _wait_for(lambda: P.process_start_ticks(stranger.pid) is None, 10, "the zombie")
    assert os.path.exists(f"/proc/{stranger.pid}"), "a zombie, not yet reaped"
    clock.now += 0.4
    assert not watch.gone(), "/proc is read at most every 0.5 s"
    clock.now += 0.1
    assert watch.gone()
    assert watch.gone(), "gone stays gone"


def test_a_pid_that_another_process_holds_now_is_gone(stranger: subprocess.Popen[bytes]) -> None:
    ticks = P.process_start_ticks(stranger.pid)
    assert ticks is not None
    env = {P.PARENT_PID_ENV: str(stranger.pid), P.PARENT_START_ENV: str(ticks - 1)}
    assert P.ParentWatch.from_env(env).gone()
    env[P.PARENT_START_ENV] = str(ticks)
    assert not P.ParentWatch.from_env(env).gone()


def test_without_a_start_time_the_process_is_identified_at_the_first_look(
    stranger: subprocess.Popen[bytes],
) -> None:
    clock = Clock()
    watch = P.ParentWatch.from_env({P.PARENT_PID_ENV: str(stranger.pid)}, clock=clock)
    assert watch.start_ticks == P.process_start_ticks(stranger.pid)
    assert not watch.gone()
    stranger.kill()
    stranger.wait()
    clock.now += 0.5
    assert watch.gone()
    assert P.ParentWatch.from_env({P.PARENT_PID_ENV: str(_dead_pid())}).gone()


def test_without_a_pid_the_watch_is_on_the_parent_and_costs_no_proc_read() -> None:
    watch = P.ParentWatch.from_env({})
    assert watch.pid == os.getppid()
    assert watch.start_ticks == P.process_start_ticks(os.getppid())
    watch.start_ticks = -5  # were /proc read, this would read as another process
    assert not watch.gone()
    assert P.own_start_ticks() == str(P.process_start_ticks(os.getpid()))


def test_the_supervisor_passes_its_pid_and_start_time(tmp_path: Path) -> None:
    from supervisor.launch.spawn import start_worker_process

    code = "import os; print(os.environ['RLSUP_PARENT_PID'], os.environ['RLSUP_PARENT_START'])"
    proc = start_worker_process([sys.executable, "-c", code], tmp_path / "log", tmp_path)
    assert proc.wait(30) == 0
    pid, start = (tmp_path / "log").read_text().split()
    assert (int(pid), int(start)) == (os.getpid(), P.process_start_ticks(os.getpid()))
