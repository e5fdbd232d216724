"""The contract between the supervisor and a training worker.

Torch-free on purpose: the supervisor and the CLI import this module, and `rlsup status` must
start in milliseconds. What an operator's script may rely on lives here: the files a worker
keeps in its run directory, the heartbeat fields (`Heartbeat`, `read_heartbeat`), the exit
codes, the phases and the spare worker's channel messages. The run dir's file names and the
checked reading of what another process wrote there are training/run_files.py's (handed on
here: a reader such as `rlsup status` imports that alone). The worker's arguments
(`WorkerConfig`, its parser and validation) are training/args.py.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import fcntl
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# The run dir's file names and the checked reading of what another process wrote live in
# run_files.py (what `rlsup status` imports of the contract); every name keeps working here.
# isort: off
from training.run_files import (
    CHECKPOINT_DIR as CHECKPOINT_DIR,
    ERROR_FILE as ERROR_FILE,
    EVAL_CHECKS as EVAL_CHECKS,
    EVAL_FILE as EVAL_FILE,
    HEARTBEAT_CHECKS as HEARTBEAT_CHECKS,
    HEARTBEAT_FILE as HEARTBEAT_FILE,
    LOCK_FILE as LOCK_FILE,
    MAX_COUNT as MAX_COUNT,
    MAX_STATE_FILE_BYTES as MAX_STATE_FILE_BYTES,
    MAX_UNIX_TIME as MAX_UNIX_TIME,
    PROGRESS_COLUMNS as PROGRESS_COLUMNS,
    PROGRESS_FILE as PROGRESS_FILE,
    clean_eval as clean_eval,
    clean_heartbeat as clean_heartbeat,
    finite_number as finite_number,
    read_json_file as read_json_file,
    read_regular_file as read_regular_file,
    whole_number as whole_number,
)
# isort: on

HEARTBEAT_SCHEMA = 1


class ExitCode(enum.IntEnum):
    """A worker's exit status. Anything else, or death by a signal, is a crash."""

    DONE = 0  # total_steps reached (and the final checkpoint and evaluation written)
    STOPPED = 75  # stopped on request (SIGTERM/SIGINT/parent gone) after a checkpoint
    OOM = 76  # CUDA or host out of memory
    FENCED = 77  # several hosts: the game was placed elsewhere since; nothing committed
    CONFIG = 78  # configuration error: restarting cannot help


class Phase(enum.StrEnum):
    """What a worker is doing; each phase has its own deadline for progress."""

    STARTING = "starting"
    WAITING_GPU = "waiting_gpu"
    LOADING = "loading"
    TRAINING = "training"
    CHECKPOINTING = "checkpointing"
    EVALUATING = "evaluating"
    STOPPING = "stopping"


# The pid of the process that started a worker (the supervisor, or a host's actor): a worker
# whose parent is already gone when it looks (killed during its imports) still notices.
PARENT_PID_ENV = "RLSUP_PARENT_PID"
# That process's start time (clock ticks after boot, field 22 of /proc/<pid>/stat): with the
# pid it names one process for good, so a pid taken over by another process reads as gone.
PARENT_START_ENV = "RLSUP_PARENT_START"
PARENT_CHECK_EVERY_S = 0.5  # the most often `ParentWatch.gone()` reads /proc


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot), or None when no such process runs
    (none, or a zombie: dead, not yet reaped). OSError when /proc cannot say (not Linux)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        if not os.path.isdir("/proc/self"):
            raise
        return None
    # `comm` (field 2) may hold spaces and parentheses: the fields after its last ")" are fixed.
    after = raw[raw.rindex(b")") + 2 :].split()
    if after[0] in (b"Z", b"X"):
        return None
    return int(after[19])


def own_start_ticks() -> str:
    """RLSUP_PARENT_START's value for the processes this one starts ("" where /proc cannot
    say: they then identify this process by its pid when they first look)."""
    try:
        ticks = process_start_ticks(os.getpid())
    except (OSError, ValueError, IndexError):
        return ""
    return "" if ticks is None else str(ticks)


class ParentWatch:
    """Is the process that started us (`RLSUP_PARENT_PID`: the supervisor, or a host's actor)
    gone? Asked every training iteration, it must hold through any wrapper between the two
    (`sh -c "...; ..."`, `uv run`, `conda run`, `poetry run`, `torchrun`, `accelerate launch`):
    there the asker is a grandchild, and "my parent is not the supervisor" means nothing. So it
    asks whether the supervisor process itself still runs: its pid, and its start time
    (`RLSUP_PARENT_START`; read at the first look when the variable is absent) so that a pid
    reused by another process reads as gone. A direct child answers with getppid() alone (it
    is re-parented the moment its parent dies); otherwise /proc is read at most every
    `every_s`. Without /proc (not Linux), the pid's existence is all it can check."""

    def __init__(
        self,
        pid: int,
        start_ticks: int | None = None,
        *,
        every_s: float = PARENT_CHECK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pid = pid
        self.every_s = every_s
        self._clock = clock
        self._next_check = -math.inf
        self._gone = False
        self.start_ticks = start_ticks
        if start_ticks is None:  # identified now: it may die as a zombie, keeping its pid
            ticks = self._ticks_now()
            self._gone = ticks is None
            self.start_ticks = None if ticks == -1 else ticks

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kw: Any) -> ParentWatch:
        """The watch the environment asks for; our parent now when it names no process."""
        env = os.environ if environ is None else environ
        pid, ticks = env.get(PARENT_PID_ENV, ""), env.get(PARENT_START_ENV, "")
        if not pid.isdigit() or int(pid) < 1:
            return cls(os.getppid(), **kw)
        return cls(int(pid), int(ticks) if ticks.isdigit() else None, **kw)

    def gone(self) -> bool:
        if self._gone:
            return True
        if os.getppid() == self.pid:
            return False  # its child: it lives (an orphan is re-parented at once)
        now = self._clock()
        if now < self._next_check:
            return False
        self._next_check = now + self.every_s
        self._gone = not self._alive()
        return self._gone

    def _alive(self) -> bool:
        if self.start_ticks is None:
            return self._exists()
        ticks = self._ticks_now()
        return self._exists() if ticks == -1 else ticks == self.start_ticks

    def _ticks_now(self) -> int | None:
        """The pid's start time now; None: no such process; -1: /proc cannot say."""
        try:
            return process_start_ticks(self.pid)
        except (OSError, ValueError, IndexError):
            return -1

    def _exists(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # EPERM: it exists, and is not ours to signal
            return True
        return True


# ---- the spare worker's channel ------------------------------------------------------------
# `python -m training.worker --standby --channel-fd N`: a pre-warmed process that waits on a
# SOCK_SEQPACKET socket (a socketpair; the supervisor holds the other end, nothing on disk)
# for the argv of the worker it is to become. One JSON object per message, both ways:
#   spare -> supervisor: {"type": "ready", "pid", "warm_s", "device", "priority"}, then
#       {"type": "alive"} every SPARE_ALIVE_EVERY_S, and {"type": "assigned", "mono"} once it
#       has taken an assignment (it is a worker from then on and says nothing more here);
#   supervisor -> spare: {"type": "assign", "argv": [...], "cwd": run_dir, "log": path}.
# End of file on either side means the other is gone: an idle spare then exits 0.
SPARE_ALIVE_EVERY_S = 2.0
SPARE_MAX_MESSAGE = 1 << 16


def encode_message(msg: dict[str, Any]) -> bytes:
    raw = json.dumps(msg, allow_nan=False).encode("utf-8")
    if len(raw) > SPARE_MAX_MESSAGE:
        raise ValueError(f"channel message of {len(raw)} bytes (at most {SPARE_MAX_MESSAGE})")
    return raw


def decode_message(raw: bytes) -> dict[str, Any] | None:
    """One message, or None when it is not a JSON object with a string `type`."""
    try:
        msg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return msg if isinstance(msg, dict) and isinstance(msg.get("type"), str) else None


# ---- heartbeat ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """What a worker says about itself about once a second (`<run_dir>/heartbeat.json`).

    The supervisor judges liveness by its own monotonic clock: when `seq` last changed, and
    whether `global_step` moved within `phase_deadline_s`.
    """

    seq: int
    pid: int
    phase: str
    phase_deadline_s: float
    global_step: int
    total_steps: int
    episodes: int
    sps: float
    mean_return: float | None
    last_checkpoint_step: int | None
    resumed_from_step: int | None
    num_envs: int
    batch_size: int
    device: str
    gpu_mem_mb: float | None
    # Extensions (additive):
    schema: int = HEARTBEAT_SCHEMA
    game: str = ""
    algo: str = ""
    time: float = 0.0
    last_checkpoint_time: float | None = None
    resume_count: int = 0
    threads: int | None = None
    eval: dict[str, Any] | None = None
    # The last EVALS_KEPT evaluations, oldest first, each {step, mean, episodes, seconds,
    # time}: a supervisor that reads the heartbeat less often than a fast game evaluates
    # still records each one (`eval` is only the newest, whole).
    evals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    quarantined: list[str] = dataclasses.field(default_factory=list)
    checkpoint_failures: int = 0
    last_checkpoint_error: str | None = None
    # Checkpoints taken synchronously because a background capture would not fit in memory,
    # and why the last one was (training/checkpointing.py).
    checkpoint_sync_fallbacks: int = 0
    last_checkpoint_sync_fallback: str | None = None
    # Seconds from the last checkpoint to the next one due: `checkpoint_every_s`, or longer
    # when the last one's stall or write was dear (checkpoint_interval_s).
    checkpoint_interval_s: float | None = None
    # Replay chunks found damaged, newest last: on load (`when` "load": left out, their
    # transitions dropped) or when about to link them into a new checkpoint ("checkpoint":
    # rewritten from memory). Each: checkpoint, files, when, and transitions_dropped on load.
    replay_damage: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # A checkpoint restored from the mirror at start (no local one): step, bytes, skipped.
    mirror_restore: dict[str, Any] | None = None
    # Several hosts: local checkpoints of an earlier placement moved aside at start because
    # the mirror held a newer placement's: local and mirror [epoch, step], moved_to.
    superseded: dict[str, Any] | None = None
    # Several hosts: the host this worker runs on (set by the node's actor when it relays).
    host: str | None = None
    # Writes that failed and were survived (a full disk, an I/O error), per file kind:
    # "heartbeat" (kept up in place), "progress" (rows kept and appended later), "eval", "log",
    # "tensorboard" (event files; retried in a new file a minute later).
    write_failures: dict[str, int] = dataclasses.field(default_factory=dict)
    # How this process came to train, on the system's monotonic clock (CLOCK_MONOTONIC, the
    # same in every process, so the supervisor can subtract its own readings): "served"
    # ("spare" or "cold"), and the marks "assigned" (a spare took its assignment), "loaded"
    # (checkpoint loaded and learner built) and "first_step" (its first iteration done).
    start: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The torch this worker runs, set once its device is picked: "torch" (version), "cuda"
    # (torch.version.cuda; null for a CPU-only build), "cuda_available", "driver" (the NVIDIA
    # driver's version; null without one). `rlsup status` flags a `device = "auto"` game that
    # trains on the CPU of a host with a driver ("cpu (no CUDA torch)").
    torch_build: dict[str, Any] | None = None
    # The networks' arithmetic as it runs (`--precision` resolved): "fp32", "bf16", "fp16".
    precision: str | None = None
    # A script's own numbers (the SDK's `run.heartbeat(step, loss=..., ...)`): name -> value.
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    # Who wrote it: "worker" (rlsup's own learners) or "sdk" (a user's script through `rlsup`).
    writer: str = "worker"
    # The latest `checkpoint.request` the built-in worker saw, from notice to commit, all times
    # Unix seconds: "requested" (the file's mtime), "seen", "reason", "deadline", "provider"
    # (from its JSON; null when absent), "cut" (what the iteration in progress gave up:
    # "rollout", "update", "env_steps", "gradient_steps", or null at an iteration's end),
    # then once a checkpoint captured after it commits: "committed", "committed_step" and
    # "latency_s" (committed - requested). `committed_step` null: not served yet.
    checkpoint_request: dict[str, Any] | None = None
    # Values a script reported that were no finite number, dropped (never a crash), counted per
    # kind: "metric" (a `run.heartbeat()` metric), "evaluation" (a `run.evaluation()` whose
    # step or mean was unusable: nothing recorded), "evaluation_field" (one of its other
    # numbers, left out of it).
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Heartbeat:
        """The heartbeat of a JSON object, each field checked (`clean_heartbeat`): an unusable
        one reads as its neutral value. ValueError when a field liveness is judged by (seq,
        pid, phase, global_step) is unusable; TypeError when a required one is missing."""
        clean, bad = clean_heartbeat(data)
        unusable = [k for k in LIVENESS_FIELDS if k in bad or (k in clean and clean[k] is None)]
        if unusable:
            raise ValueError(f"heartbeat fields unusable: {', '.join(sorted(unusable))}")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: _NEUTRAL[key] for key in bad if key in _NEUTRAL}
        values |= {k: v for k, v in clean.items() if k in known}
        return cls(**values)


# ---- reading what another process wrote: training/run_files.py (handed on above) -----------

LIVENESS_FIELDS = frozenset({"seq", "pid", "phase", "global_step"})
# What a required field reads as when its value is unusable (the dataclass has no default).
_NEUTRAL: dict[str, Any] = {
    "total_steps": 0, "episodes": 0, "sps": 0.0, "mean_return": None, "num_envs": 0,
    "batch_size": 0, "last_checkpoint_step": None, "resumed_from_step": None, "device": "",
    "gpu_mem_mb": None, "phase_deadline_s": 0.0,
}  # fmt: skip
EVALS_KEPT = 8  # Heartbeat.evals


def read_heartbeat(run_dir: str | os.PathLike[str]) -> Heartbeat | None:
    """The latest heartbeat, or None when there is none (yet) or it cannot be parsed."""
    data = read_json_file(Path(run_dir) / HEARTBEAT_FILE)
    if data is None:
        return None
    try:
        return Heartbeat.from_json(data)
    except (TypeError, ValueError):
        return None


# ---- a command game (`[[games]] command = [...]`): its environment -------------------------
# rlsup runs a user's own training script with these set (docs/own-trainer.md); the SDK
# (`import rlsup`, `rlsup.attach()`) reads them. Outside rlsup none is set and the SDK works
# standalone in a directory of the caller's choosing.
RUN_DIR_ENV = "RLSUP_RUN_DIR"  # the game's run directory (also the default cwd)
GAME_ENV = "RLSUP_GAME"  # the game's name in the config
SEED_ENV = "RLSUP_SEED"  # `games.seed`
RESUME_COUNT_ENV = "RLSUP_RESUME_COUNT"  # earlier starts of this game (0 on the first)
MODE_ENV = "RLSUP_MODE"  # the mode in force for the game (light / medium / heavy / ...)
NUM_ENVS_ENV = "RLSUP_NUM_ENVS"  # the mode's knobs
BATCH_SIZE_ENV = "RLSUP_BATCH_SIZE"
TOTAL_STEPS_ENV = "RLSUP_TOTAL_STEPS"  # `games.total_steps` (0 when the config gives none)
CHECKPOINT_EVERY_S_ENV = "RLSUP_CHECKPOINT_EVERY_S"  # the file's `checkpoint_every_s`
# `checkpoint_every_s` when the file gives none: what one unannounced fault in 20 minutes costs
# is half an interval of redone training plus the restart, so 99 % goodput needs an interval
# of about 15 s (benchmarks/goodput.py); a checkpoint costs training its capture only
# (milliseconds: the write runs in the background), and pacing keeps a dearer one rarer.
DEFAULT_CHECKPOINT_EVERY_S = 15.0
# Pacing: the next checkpoint falls due no sooner than the interval, nor before the last
# checkpoint's stall of training is at most MAX_PAUSE_SHARE of the time since, nor before its
# write (in the background, or in the caller) is at most MAX_WRITE_SHARE of it. Cheap
# checkpoints come at the interval; a script whose synchronous save stalls it 2 s gets one
# every 200 s, not every 15 s (CheckFreq's bound on checkpoint overhead).
MAX_PAUSE_SHARE = 0.01
MAX_WRITE_SHARE = 0.5


# On a host that fails often the interval shortens (`adaptive_checkpoints`, the default): to
# Young's rule, sqrt(2 x cost x MTBF), the interval that minimises a checkpoint's cost per
# second plus the redone half interval per failure (Young 1974; Daly 2006 for its refinements).
# `cost_s`: what the last checkpoint took from training (its stall and its writer's CPU, which
# on a small host is the learner's), `mtbf_s`: the host's mean time between unexpected failures
# (the ledger's, as `rlsup status` shows it). A checkpoint of 8 ms under a reboot every 20
# minutes: 4.4 s. Never below MIN_ADAPTIVE_INTERVAL_S (the disk's wear, the writer's CPU),
# never above the configured interval; pacing (above) applies after it.
MIN_ADAPTIVE_INTERVAL_S = 2.0
# The cost assumed before a process measured its first checkpoint's: the stall the built-in
# learners are held to (PPO 20 ms; docs/figures.md), 6.9 s under a reboot every 20 minutes.
ASSUMED_CHECKPOINT_COST_S = 0.02
MTBF_ENV = "RLSUP_HOST_MTBF_S"  # a command game's: the host's MTBF, unset when none is known


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young's rule: the checkpoint interval with the least expected loss, sqrt(2 x C x M)."""
    return math.sqrt(2.0 * max(0.0, cost_s) * max(0.0, mtbf_s))


def checkpoint_interval_s(
    every_s: float,
    pause_s: float = 0.0,
    write_s: float = 0.0,
    *,
    cost_s: float | None = None,
    mtbf_s: float | None = None,
) -> float:
    """Seconds from one checkpoint to the next: the interval (shortened by Young's rule when the
    host's MTBF and the last checkpoint's cost are known), paced by what the last cost."""
    base = every_s
    if cost_s is not None and mtbf_s is not None and mtbf_s > 0:
        base = min(every_s, max(MIN_ADAPTIVE_INTERVAL_S, young_interval_s(cost_s, mtbf_s)))
    return max(base, pause_s / MAX_PAUSE_SHARE, write_s / MAX_WRITE_SHARE)


KEEP_CHECKPOINTS_ENV = "RLSUP_KEEP_CHECKPOINTS"  # how many committed checkpoints to keep
# The game's declared `params` (a JSON object of scalars; "{}" when it declares none): the
# SDK's `run.params`.
PARAMS_ENV = "RLSUP_PARAMS"
HEARTBEAT_ENV = "RLSUP_HEARTBEAT"  # "1": the config promises heartbeats (`games.heartbeat`)
THREADS_ENV = "RLSUP_THREADS"  # the thread budget (OMP/MKL/torch threads are set to it too)
# Several hosts (`[cluster] backend = "ray"`): the placement's epoch, and the mirror it is
# fenced in. The SDK stamps the epoch on each checkpoint and, before each commit, checks the
# mirror's fence for the game: once the game was placed again elsewhere it commits nothing
# and exits 77 (FENCED). Unset on one host.
EPOCH_ENV = "RLSUP_EPOCH"
MIRROR_URL_ENV = "RLSUP_MIRROR_URL"
MIRROR_ENDPOINT_URL_ENV = "RLSUP_MIRROR_ENDPOINT_URL"  # "" or unset: the S3 default
MIRROR_REGION_ENV = "RLSUP_MIRROR_REGION"
# What the host restored from the mirror before the program started (a JSON object: step,
# bytes, skipped, url), for the SDK's heartbeat (`mirror_restore`, the `mirror_restored`
# event). Unset when nothing was restored.
MIRROR_RESTORE_ENV = "RLSUP_MIRROR_RESTORE"
# A file in the run dir the supervisor touches to ask for a checkpoint now (an operator's
# request, a preemption notice): `run.should_checkpoint()` is True until a newer one commits.
# Any file there is a request, made at its mtime, whatever it holds (an operator may just
# `touch` it); the supervisor writes it atomically with a JSON object, every key optional:
# {"reason": "preemption", "deadline": <Unix seconds the machine may be taken at>,
#  "provider": "gcp"}. A request is satisfied by a checkpoint whose state was captured after
# it was made; the built-in worker serves it within about one minibatch (docs).
CHECKPOINT_REQUEST_FILE = "checkpoint.request"
PREEMPTION_REASON = "preemption"  # the request's "reason" on a cloud's preemption notice
# When the machine may be taken (Unix seconds), for a process started while a preemption
# notice stands; a request file's own "deadline" wins over it.
PREEMPTION_DEADLINE_ENV = "RLSUP_PREEMPTION_DEADLINE"


@dataclasses.dataclass(frozen=True)
class CheckpointRequest:
    """A standing `checkpoint.request`: when it was made (its mtime, Unix seconds) and what
    its JSON said, each None when absent, of the wrong type or the file is not JSON."""

    mtime: float
    reason: str | None = None
    deadline: float | None = None
    provider: str | None = None
    final: bool = False  # the supervisor's last request before the deadline

    def details(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "deadline": self.deadline,
            "provider": self.provider,
            "final": self.final,
        }


def read_checkpoint_request(run_dir: str | os.PathLike[str]) -> CheckpointRequest | None:
    """The request standing in `run_dir`, or None when there is no file (one stat(); the
    content is read only when the file is there)."""
    path = Path(run_dir) / CHECKPOINT_REQUEST_FILE
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    data = read_json_file(path) or {}
    return CheckpointRequest(
        mtime=mtime,
        reason=_short_text(data.get("reason")),
        deadline=unix_time(data.get("deadline")),
        provider=_short_text(data.get("provider")),
        final=data.get("final") is True,
    )


def unix_time(value: Any) -> float | None:
    """A finite positive number of seconds (a JSON number or a numeric string), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def preemption_deadline(
    run_dir: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> float | None:
    """When the machine may be taken: the standing request's "deadline", else
    RLSUP_PREEMPTION_DEADLINE, else None (no notice known)."""
    request = read_checkpoint_request(run_dir)
    if request is not None and request.deadline is not None:
        return request.deadline
    env = os.environ if environ is None else environ
    return unix_time(env.get(PREEMPTION_DEADLINE_ENV))


def _short_text(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None


class RunDirBusy(OSError):
    """Another process holds a run directory's lock; `holder` is the pid it wrote ("?")."""

    def __init__(self, holder: str) -> None:
        super().__init__(errno.EWOULDBLOCK, f"locked by pid {holder}")
        self.holder = holder


def lock_run_dir(run_dir: Path, wait_s: float) -> int:
    """Take `<run_dir>/worker.lock` (an exclusive flock; the kernel lets go with the process),
    waiting up to `wait_s` for a predecessor; write our pid into it for humans. Returns the
    descriptor to keep open; RunDirBusy when another process still holds it after `wait_s`.
    The built-in worker and the SDK both take it: never two writers on one run directory."""
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise RunDirBusy(holder) from exc
            time.sleep(0.2)
    try:  # the pid is for humans; the lock is the flock
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return fd
