"""Worker processes on this host: starting one (its environment, its session, its pidfd),
recognising one after a restart of the supervisor (pid, start ticks, argv), stopping leftovers.
The launchers (local, spare, Ray) are built on these. Rotating a log is `supervisor/files.py`'s."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from supervisor.config import Config, GameSpec, ModeSpec, worker_config
from supervisor.files import make_private_dir, rotate_log
from supervisor.launch import sessions
from supervisor.launch.crashlog import death_from_log
from supervisor.launch.process import HOST_LOST_RC, same_process
from supervisor.tracking.wandb import wandb_env
from training import protocol as P
from training.protocol import HEARTBEAT_FILE, PARENT_PID_ENV, PARENT_START_ENV, own_start_ticks

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
WORKER_MODULE = "training.worker"
KEEP_CHECKPOINTS = 3  # what the built-in worker keeps (`--keep-checkpoints` default)


def process_argv(cmdline: list[str]) -> list[str]:
    """A process's argv as psutil reads it, whether or not it was retitled: a worker started
    from the spare carries its command line as one string (setproctitle), NUL-padded."""
    parts = [part for part in cmdline if part]
    if len(parts) == 1 and " " in parts[0]:
        return parts[0].split()
    return list(cmdline)


class NoRoom(OSError):
    """No host has room for another game now (several hosts): the game waits, no failure."""

    event: str | None = "no_host"  # recorded once while the game waits


class StillDraining(NoRoom):
    """The game's last worker is gone but what it left is not (a wrapper died of the stop at
    once; its child still writes the final checkpoint): the next waits, within the stop grace.
    Nothing failed and nothing is recorded: the game was asked to stop, and is stopping."""

    event = None


@dataclass
class WorkerProcess:
    """A spawned worker: its Popen, a pidfd (readable when it exits), its identity."""

    popen: subprocess.Popen[bytes]
    pidfd: int
    create_time: float  # wall clock, for display
    started_mono: float
    start_ticks: int | None = None  # identity: clock ticks since boot
    served: str = "cold"  # "cold" (a fresh process) or "spare" (the pre-warmed one)
    # Its monotonic clock is the supervisor's (the same host): the start breakdown may
    # subtract the worker's marks from the supervisor's readings.
    same_clock: bool = True

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        return self.popen.wait(timeout)

    def placement(self) -> dict[str, Any]:
        """Where it runs, for its events: {} on this host; host and epoch on several."""
        return {}

    def lost_before_start(self) -> bool:
        """Did it die before it became the worker (a spare that never took its assignment)?
        Then the game never had this worker: it starts again at once, no failure."""
        return False

    def close(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


def start_worker_process(
    cmd: list[str],
    log_path: Path,
    cwd: Path | None,
    pass_fds: tuple[int, ...] = (),
    extra_env: Mapping[str, str] | None = None,
    unset_env: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """`cmd` (a worker) in its own session, in `cwd`, output appended to `log_path` (never
    through a link), with an environment that finds rlsup's packages and lacks systemd's;
    `pass_fds`: descriptors it inherits (a spare's channel); `extra_env`: set on top (its
    GPU: `CUDA_VISIBLE_DEVICES`); `unset_env`: left out."""
    env = {k: v for k, v in {**os.environ, **(extra_env or {})}.items() if k not in unset_env}
    # Not pip-installed yet (or run from a checkout): the worker must find `training`.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    # Its parent, for a worker orphaned before it could ask (it then checkpoints and exits).
    env[PARENT_PID_ENV] = str(os.getpid())
    env[PARENT_START_ENV] = own_start_ticks()  # with the pid: this process, through wrappers
    env.pop("NOTIFY_SOCKET", None)  # only the supervisor talks to systemd
    env.pop("WATCHDOG_USEC", None)
    env.pop("WATCHDOG_PID", None)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(log_path, flags, 0o640)
    try:
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env=env,
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
        )
    finally:
        os.close(fd)


def find_leftover(
    pid: int | None, ticks: int | None, create_time: float | None = None
) -> psutil.Process | None:
    """The process `pid` if it is still the worker we started (same start, a worker)."""
    if not pid or (ticks is None and not create_time):
        return None
    if not same_process(pid, ticks, create_time):
        return None
    try:
        proc = psutil.Process(pid)
        if WORKER_MODULE not in process_argv(proc.cmdline()) and not _command_game(proc):
            return None
        return proc
    except psutil.Error:
        return None


def unrecorded_workers(runs_root: Path, known: set[int]) -> list[psutil.Process]:
    """Workers of this state directory's games that the database does not name: started (a
    cold spawn, or the spare handed a game) just before the supervisor died, while their row
    was still to be written (a database that is locked keeps writes in memory a while). A
    worker module whose `--run-dir` lies under `runs_root`, or a process a supervisor started
    whose run dir (its environment) does; a spare still on standby ends on its own."""
    root = runs_root.resolve()
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.pid == os.getpid() or proc.pid in known:
            continue
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            argv = process_argv(proc.info["cmdline"] or [])
            run_dir: str | None = None
            if WORKER_MODULE in argv and "--standby" not in argv:
                at = [i for i, part in enumerate(argv[:-1]) if part == "--run-dir"]
                run_dir = argv[at[-1] + 1] if at else None
            elif _started_by_rlsup(proc.pid):
                run_dir = proc.environ().get(P.RUN_DIR_ENV)
            if run_dir and Path(run_dir).resolve().is_relative_to(root):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _command_game(proc: psutil.Process) -> bool:
    """Was it started as a command game (its environment names its game and run dir)?"""
    try:
        env = proc.environ()
    except psutil.Error:
        return False
    return bool(env.get(P.GAME_ENV)) and bool(env.get(P.RUN_DIR_ENV))


def orphaned_remains(pid: int | None, ticks: int | None) -> list[int]:
    """What is left of the session of a worker `pid` (started at `ticks`) that is gone or a
    zombie nobody reaps (`find_leftover` found no live leader): the processes still in its
    session (`sh -c "sleep 1000 & exec python train.py"` after train.py exited, a forked child
    holding the run-dir lock), each one started by a supervisor (its environment says so):
    never a stranger's session that reused the id."""
    if not pid or not sessions.is_ours(pid, ticks):
        return []
    return [m for m in sessions.members(pid) if _started_by_rlsup(m)]


def _started_by_rlsup(pid: int) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return any(v.startswith(f"{PARENT_PID_ENV}=".encode()) for v in environ.split(b"\0"))


def stop_leftovers(
    procs: list[psutil.Process], grace_s: float, orphaned: Mapping[int, list[int]] | None = None
) -> list[int]:
    """Stop leftover workers, each with its whole session: SIGTERM (+SIGCONT) each leader's
    process group and the remains of sessions whose leader is gone (`orphaned`: session id ->
    its members), wait for them all against one deadline, then SIGKILL whatever is left in
    any of those sessions. Returns the pids stopped (leaders, and the orphaned remains)."""
    orphaned = orphaned or {}
    for p in procs:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            sessions.signal_group(p.pid, sig)
    for sid, pids in orphaned.items():
        for sig in (signal.SIGTERM, signal.SIGCONT):
            sessions.signal_members(sid, sig, pids)
    sids = [p.pid for p in procs] + list(orphaned)
    if not sessions.wait_empty(sids, grace_s, poll_s=0.05):
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()  # the leader itself, whatever session it has moved to
        for sid in sids:
            sessions.signal_members(sid, signal.SIGKILL)
        sessions.wait_empty(sids, 5, poll_s=0.05)
    return [p.pid for p in procs] + [pid for pids in orphaned.values() for pid in pids]


@dataclass(frozen=True)
class Prepared:
    """What starts one worker: its argv (rlsup's worker's flags, or a command game's whole
    command), its log, working directory and the variables set for it alone."""

    argv: list[str]
    log: Path
    cwd: Path
    env: dict[str, str]
    command: bool  # a command game: argv is the program itself (never the spare)


def prepare_worker(
    cfg: Config,
    spec: GameSpec,
    mode: ModeSpec,
    threads: int,
    env: Mapping[str, str] | None = None,
    starts: int = 0,
    host_mtbf_s: float | None = None,
) -> Prepared:
    """A new worker's argv, log (the previous one rotated), run directory (made private, its
    last heartbeat removed: the supervisor must never read a predecessor's) and environment
    (`env`: its GPU; a command game also gets the RLSUP_* contract, `starts`: its earlier
    starts; `host_mtbf_s`: the ledger's MTBF, for the checkpoint interval, None when unknown
    or `adaptive_checkpoints = false`)."""
    # A matrix run's name has folders (`pong/lr3/s1`): each level is made private too.
    parts = spec.name.split("/")
    run_dir = make_private_dir(cfg.run_dir(parts[0]))
    for part in parts[1:]:
        run_dir = make_private_dir(run_dir / part)
    logs_dir = make_private_dir(cfg.logs_dir)
    for part in parts[:-1]:
        logs_dir = make_private_dir(logs_dir / part)
    log = logs_dir / f"{parts[-1]}.log"
    rotate_log(log)
    with contextlib.suppress(FileNotFoundError):
        (run_dir / HEARTBEAT_FILE).unlink()
    if spec.command is not None:
        extra = {**dict(spec.env), **command_env(cfg, spec, mode, run_dir, threads, starts)}
        if host_mtbf_s is not None:
            extra[P.MTBF_ENV] = repr(host_mtbf_s)  # never "0.0" for a short one: the SDK refuses 0
        extra |= wandb_env(spec.name, spec.group, run_dir, dict(spec.env), os.environ)
        cwd = Path(spec.cwd) if spec.cwd else run_dir
        return Prepared(list(spec.command), log, cwd, {**extra, **(env or {})}, True)
    wcfg = worker_config(
        spec, mode, run_dir, cfg.checkpoint_every_s, threads, cfg.mirror, host_mtbf_s
    )
    return Prepared(wcfg.to_argv(), log, run_dir, dict(env or {}), False)


def command_env(
    cfg: Config, spec: GameSpec, mode: ModeSpec, run_dir: Path, threads: int, starts: int
) -> dict[str, str]:
    """The RLSUP_* variables of a command game (training/protocol.py, docs/own-trainer.md)."""
    return {
        P.RUN_DIR_ENV: str(run_dir),
        P.GAME_ENV: spec.name,
        P.SEED_ENV: str(spec.seed),
        P.RESUME_COUNT_ENV: str(starts),
        P.MODE_ENV: mode.name,
        P.NUM_ENVS_ENV: str(mode.num_envs),
        P.BATCH_SIZE_ENV: str(mode.batch_size),
        P.TOTAL_STEPS_ENV: str(spec.total_steps),
        P.CHECKPOINT_EVERY_S_ENV: f"{cfg.checkpoint_every_s:g}",
        P.KEEP_CHECKPOINTS_ENV: str(KEEP_CHECKPOINTS),
        P.HEARTBEAT_ENV: "1" if spec.heartbeat else "0",
        P.PARAMS_ENV: json.dumps(dict(spec.params), allow_nan=False, sort_keys=True),
        P.THREADS_ENV: str(threads),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }


def worker_error(cfg: Config, spec: GameSpec, pid: int, returncode: int) -> dict[str, Any] | None:
    """Why the worker `pid` of `spec` ended, in its own words: the error.json it wrote itself
    (by pid, not by file time, which a wall-clock step makes meaningless; another run's is
    ignored; a command game's script behind a wrapper signs it with its session, `sid`).
    A command game that failed without one (they rarely write it) is told by its log
    (`crashlog`): a signal by its name, else its last traceback from the first line through
    the exception (`exception`; kind `import_error` when an ImportError was its last words),
    else the log's last lines, so that FATAL and the crash events say why."""
    error = P.read_json_file(cfg.run_dir(spec.name) / P.ERROR_FILE)
    if error is not None and error.get("pid") == pid:
        return error
    if error is not None and spec.command is not None and error.get("sid") == pid:
        return error  # the SDK behind a wrapper (`sh -c`, `uv run`): of the worker's session
    if spec.command is None or returncode in (0, P.ExitCode.STOPPED, HOST_LOST_RC):
        return None  # done, stopped, or its host lost (no exit of its own: nothing to read)
    death = death_from_log(cfg.logs_dir / f"{spec.name}.log", returncode)
    out: dict[str, Any] = {"pid": pid, "kind": "command_exit"}
    out["message"] = death.message if death else f"exit status {returncode}"
    if death is not None and death.exception is not None:
        out["exception"] = death.exception
        if death.import_error:
            out["kind"] = "import_error"
    return out


def heartbeat_of(hb_pid: int, pid: int, spec: GameSpec) -> bool:
    """Is a heartbeat signed `hb_pid` the worker `pid`'s? Its own; for a command game also a
    process of its session (`bash -c "python train.py"`: the SDK runs in a child)."""
    if hb_pid == pid:
        return True
    if spec.command is None or hb_pid <= 0:
        return False
    try:
        return os.getsid(hb_pid) == pid
    except ProcessLookupError:
        # Gone already: a wrapped script's last words, read after the wrapper's exit. The run
        # dir's heartbeat was removed before this worker started, and nothing of an earlier
        # life outlives it (its session is emptied before the next start): a heartbeat from a
        # process that is no more is this life's.
        return True
    except OSError:
        return False
