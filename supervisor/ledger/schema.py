"""The state database's schema, a contract: the event kinds and the tables, as forward
migrations (`PRAGMA user_version` counts those applied). Plain data: `db.migrate` applies the
migrations, and the config's hooks and the CLI's `--kind` check name the kinds.
"""

from __future__ import annotations

EVENT_KINDS = frozenset(
    {
        "supervisor_start",
        "supervisor_stop",
        "host_reboot",
        "worker_start",
        "worker_exit",
        "worker_crash",
        "worker_hang",
        "worker_oom",
        "restart",
        "backoff",
        "fatal",
        "checkpoint_corrupt",
        "checkpoint_failed",
        # A checkpoint taken synchronously: a background capture would not fit in memory.
        "checkpoint_sync_fallback",
        "checkpoint_unreadable",
        "replay_damaged",
        "gpu_wait",
        "scale_down",
        "scale_up",
        "mode_pinned",
        "game_done",
        "config_reload",
        "config_error",
        "state_db_unavailable",
        "write_failed",
        "mirror_ok",
        "mirror_failed",
        "mirror_restored",
        "uploader_exit",
        # Several hosts ([cluster] backend = "ray"): the hosts' ledger and placements.
        "node_joined",
        "node_lost",
        "node_reboot",
        "no_host",
        "leftovers_stopped",
        # The pre-warmed spare worker ([spare]) and how each start was served.
        "spare_spawned",
        "spare_ready",
        "spare_lost",
        "spare_stopped",
        # Observability: an alert hook that failed, the metrics export that failed.
        "hook_failed",
        "metrics_failed",
        "spare_enabled",
        "spare_disabled",
        "worker_training",
        # GPUs: placement of a game's worker on one GPU, a GPU lost, NVML (un)available.
        "gpu_assigned",
        "gpu_lost",
        "gpu_driver",
        "gpu_moved",  # the policy moved a game off a hot or OOM-prone GPU to a calmer one
        # An auto game that will train on the CPU of a host with a driver (CPU-only torch).
        "device_fallback",
        # A worker's evaluation as its heartbeat reported it (step, mean, episodes, seconds):
        # the curves' evaluation points and the evaluation time of each game's time split.
        "evaluation",
        # A cloud's preemption notice ([preemption]): seen, lapsed, its watcher failing, a
        # worker that died under it, and the next boot's verdict (the machine was taken).
        "preemption_notice",
        "preemption_final_checkpoint",
        "preemption_cleared",
        "preemption_watch_failed",
        "worker_preempted",
        "preempted",
        # The tracking bridge ([tracking]): a sink (MLflow, TensorBoard) that failed (once per
        # outage), that works again, and points it will not send (a resume went back before
        # steps already sent: their new values are skipped).
        "tracking_failed",
        "tracking_ok",
        "tracking_skipped",
        # Sweeps ([games.sweep]): a trial ended (complete, pruned, fail: its value, parameters,
        # runs and why), a study store that failed (once per outage) and works again.
        "sweep_trial",
        "sweep_failed",
        "sweep_ok",
    }
)

_V1 = """
CREATE TABLE boots(boot_id TEXT PRIMARY KEY, boot_time REAL, first_seen REAL NOT NULL,
                   last_seen REAL NOT NULL, clean_stop INTEGER NOT NULL DEFAULT 0);
CREATE TABLE events(id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL, game TEXT,
                    detail TEXT NOT NULL DEFAULT '{}');
CREATE INDEX events_ts ON events(ts);
CREATE INDEX events_kind_ts ON events(kind, ts);
CREATE TABLE workers(game TEXT PRIMARY KEY, state TEXT NOT NULL, pid INTEGER,
                     pid_create_time REAL, mode TEXT, num_envs INTEGER, batch_size INTEGER,
                     restarts INTEGER NOT NULL DEFAULT 0, state_since REAL, reason TEXT,
                     heartbeat TEXT, updated REAL);
CREATE TABLE samples(ts REAL NOT NULL, data TEXT NOT NULL);
CREATE INDEX samples_ts ON samples(ts);
CREATE TABLE desired(scope TEXT PRIMARY KEY, mode TEXT NOT NULL, pinned INTEGER NOT NULL,
                     updated REAL NOT NULL);
CREATE TABLE modes(scope TEXT PRIMARY KEY, mode TEXT NOT NULL, since REAL NOT NULL, reason TEXT);
CREATE TABLE supervisor(id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER,
                        pid_create_time REAL, boot_id TEXT, started REAL, last_tick REAL,
                        config_path TEXT, state TEXT);
"""
# v2: a process is identified by pid + start ticks since boot (/proc/<pid>/stat), which no
# wall-clock step moves; events carry the supervisor's step-free clock (`mono`) for the policy.
# The supervisor records the systemd unit that runs it (if any); `control` carries requests
# from the CLI that are not modes (a stop asked by an operator who may not signal it).
_V2 = """
ALTER TABLE workers ADD COLUMN pid_start_ticks INTEGER;
ALTER TABLE supervisor ADD COLUMN pid_start_ticks INTEGER;
ALTER TABLE supervisor ADD COLUMN systemd_unit TEXT;
ALTER TABLE events ADD COLUMN mono REAL;
CREATE TABLE control(name TEXT PRIMARY KEY, value TEXT, updated REAL NOT NULL);
"""
# v3: the pre-warmed spare worker (one row: its state, identity, why) and, per game, how its
# current worker was started (`last_start`: served spare/cold and the detect -> first step
# breakdown, JSON).
_V3 = """
CREATE TABLE spare(id INTEGER PRIMARY KEY CHECK (id = 1), state TEXT NOT NULL, pid INTEGER,
                   pid_start_ticks INTEGER, device TEXT, since REAL, ready_since REAL,
                   reason TEXT, rss_mb REAL, updated REAL NOT NULL);
ALTER TABLE workers ADD COLUMN last_start TEXT;
"""
# v4: the GPU the game's current worker was placed on ({"index", "uuid"} as JSON, NULL when
# it has no worker or runs unplaced).
_V4 = """
ALTER TABLE workers ADD COLUMN gpu TEXT;
"""
# Forward migrations: MIGRATIONS[i] takes user_version i to i+1. Append, never edit.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4)
SCHEMA_VERSION = len(MIGRATIONS)
