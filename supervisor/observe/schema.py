"""The `rlsup status --json` document (schema 1): these records produce it and are its schema.

Fields may be added; none is ever renamed or removed (operators' scripts read them). Times are
Unix seconds (float), durations seconds (`*_s`); unknown values are null. mypy checks that
`status.py` fills every field of every record, and tests/cli checks that the document and the
docs/observability.md's field tables match these records.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

# The version (1) is `status.SCHEMA`, beside the document's producer: `rlsup status` imports
# these records for its types only, never to run.


class SupervisorDoc(TypedDict):
    # stale: its pid is alive but last_tick is older than status.STALE_TICK_S;
    # stopped: its pid (with its start) is gone; absent: no state database yet.
    state: Literal["running", "stale", "stopped", "absent"]
    pid: int | None
    alive: bool
    started: float | None
    clean_stop: bool  # stopped, and said so
    last_tick: float | None
    last_tick_age_s: float | None
    boot_id: str | None
    db_state: str | None  # what its row says ("running" / "stopped")


class HostDoc(TypedDict):
    boot_id: str | None
    boot_time: float | None
    uptime_s: float | None
    unexpected_reboots_24h: int
    unexpected_reboots_7d: int
    unexpected_reboots_total: int
    uptime_fraction_7d: float | None  # supervisor-observed up time, last 7 days
    observed_s: float | None  # since the first boot the database saw
    # Mean time between failures (unexpected host reboots and supervisor crashes): observed
    # up time / their count; null while there was none (db.mtbf_s).
    mtbf_s: float | None
    cpu_pct: float | None
    ram_available_pct: float | None
    vitals_age_s: float | None  # age of the supervisor's sample (null: read live now)
    # [{index, mem_used_mb, mem_total_mb, util_pct, temp_c, power_w}]
    gpus: list[dict[str, Any]]


class ScopeDoc(TypedDict):
    scope: str  # "*" (the host) or a game
    mode: str
    since: float | None
    reason: str | None
    pinned: bool


class ModeDoc(TypedDict):
    ladder: list[str]  # lightest first
    initial_mode: str
    scopes: list[ScopeDoc]
    last_decision: dict[str, Any] | None  # {ts, kind, game, detail} of the newest mode event


class ErrorDoc(TypedDict):
    kind: Any
    message: Any
    step: Any


class GameDoc(TypedDict):
    name: str
    env_id: str | None
    algo: str | None
    in_config: bool
    state: str  # a WorkerState value, or "not_started" (no row yet)
    reason: str | None
    state_since: float | None
    pid: int | None
    pid_alive: bool | None
    host: str | None  # several hosts: the host its worker runs on (null on a single host)
    phase: str | None
    mode: str | None
    num_envs: int | None
    batch_size: int | None
    global_step: int
    total_steps: int
    percent: float
    episodes: int | None
    episodes_per_hour: float | None
    sps: float | None  # agent steps/s (all envs); null unless its worker is alive
    mean_return: float | None  # last 100 episodes
    last_checkpoint_step: int | None
    last_checkpoint_age_s: float | None
    mirror_step: int | None  # newest checkpoint in the mirror (null without [mirror])
    mirror_age_s: float | None  # how long ago that checkpoint was committed locally
    restarts: int
    eta_s: float | None  # null unless running with sps > 0
    heartbeat_age_s: float | None
    heartbeat_stale: bool
    last_error: ErrorDoc | None  # from error.json, for fatal / backoff / exited games
    # How its newest worker started: served ("spare" | "cold") and the seconds from its
    # predecessor's exit seen to the spawn, to the checkpoint loaded, to the first step.
    start: dict[str, Any] | None
    # The GPU its current worker was placed on ({"index": NVML index, "uuid": "GPU-…"}; the
    # worker sees it as cuda:0), null without a worker or when it runs unplaced (CPU, no NVML).
    gpu: dict[str, Any] | None
    # The device its worker trains on ("cpu", "cuda:0"; the newest heartbeat's, null before
    # one), and its last evaluation: mean return (PPO sampling, DQN epsilon 0.05) and the
    # agent step it was taken at.
    device: str | None
    # Why a `device = "auto"` game trains on the CPU of a host with an NVIDIA driver: "no CUDA
    # torch" (a CPU-only build is installed) or "CUDA unavailable"; null when nothing is amiss.
    device_note: str | None
    # The networks' arithmetic its worker runs ("fp32", "bf16", "fp16": `--precision` as
    # resolved on that host; the newest heartbeat's, null before one).
    precision: str | None
    eval_return: float | None
    eval_step: int | None
    # "builtin" (rlsup's worker) or "command" (your own program: docs/own-trainer.md); null for
    # a game no longer in the configuration. A command game's program and arguments, the
    # contract level it reached ("L0" no heartbeat seen, "L1" heartbeats, "L2" a committed
    # checkpoint), and whether it has hang detection (false: it promised no heartbeat and
    # sent none).
    kind: str | None
    command: list[str] | None
    contract_level: str | None
    hang_detection: bool
    # Where its time went since its first start (ledger/accounting.py): wall_s and its parts
    # training_s, evaluation_s, redone_s, setup_s, starting_s, waiting_s, backoff_s, down_s,
    # paused_s (sum: wall_s), downtime_s, lost_s, redone_steps, since; with cost_per_hour, money and
    # money_lost (the host's price shared among the games alive). Null before its first start.
    time: dict[str, Any] | None


class CostDoc(TypedDict):  # only with cost_per_hour > 0 in the configuration
    per_hour: float
    spent: float
    since: float
    remaining_s: float | None  # remaining steps of all games / current total sps
    projected_total: float | None
    lost: float  # money of the games' time lost to instability (redone, restarts, down)


class NodeDoc(TypedDict):
    """Several hosts: one host of the cluster, from the ledger's events and the games."""

    host: str
    games: list[str]  # games whose worker runs there now
    alive: bool  # joined, not lost since
    joined: float | None  # when it last joined
    lost: int  # times it was lost (node_lost)
    reboots: int  # times it came back with a new boot id (node_reboot)
    boot_id: str | None
    spare: str | None  # its spare worker: warming | ready (from the spare_* events); None


class SpareDoc(TypedDict):
    """The pre-warmed spare worker ([spare]) on this host."""

    state: str  # off | starting | warming | ready | stale (the supervisor is not running)
    pid: int | None
    alive: bool  # the recorded process is alive and the same one
    device: str | None
    since: float | None  # when it was spawned
    ready_since: float | None
    rss_mib: float | None  # now, from /proc (else the last measured)
    pss_mib: float | None  # its proportional share (pages it shares with others split)
    reason: str | None  # why there is (or is not) one


class PreemptionDoc(TypedDict):
    """The cloud's preemption notice standing on this host's boot ([preemption])."""

    provider: str  # aws | gcp | azure
    action: str | None  # aws: terminate | stop | hibernate; gcp: terminate; azure: preempt
    deadline: float | None  # when the machine goes (Unix seconds)
    notice_at: float | None  # when the supervisor saw the notice
    remaining_s: float | None  # deadline - now (negative: past it)


class StatusDoc(TypedDict):
    schema: int
    generated_at: float
    config_path: str
    state_dir: str
    db_present: bool
    supervisor: SupervisorDoc
    host: HostDoc
    mode: ModeDoc
    games: list[GameDoc]
    nodes: list[NodeDoc]  # several hosts only; [] on a single host
    spare: SpareDoc | None  # None: no spare was ever kept (several hosts, an old database)
    cost: CostDoc | None
    preemption: PreemptionDoc | None  # None: no notice stands on this boot
    # Will a preemption's checkpoint (+ upload) fit its window? One warning for the slowest
    # game, naming the knobs; [] when it fits or the provider (so its window) is unknown.
    preemption_fit: list[str]
