"""Operator metrics for Prometheus (`[metrics]`): a node_exporter textfile and/or /metrics.

One owner per fact: the numbers are the `rlsup status --json` document's (`status.collect`,
reading the state database read-only and the workers' heartbeats), mapped to `rlsup_*`
metric families. A background thread recomputes them every `interval_s` and rewrites the
textfile atomically; the optional HTTP endpoint (prometheus_client's server, bound to
127.0.0.1 unless the configuration names another address) serves the latest snapshot. Neither
runs on the tick loop; failures come back through `drain()` and become `metrics_failed` events.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import structlog
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.config import Config, MetricsConfig
from supervisor.ledger import accounting, db
from supervisor.lifecycle.states import WorkerState
from supervisor.observe import readonly
from supervisor.observe.status import collect  # the status document: one owner

log = structlog.get_logger("rlsup.supervisor")

GAME_STATES = (*(str(s) for s in WorkerState), "not_started")
POLICY_KINDS = readonly.MODE_EVENT_KINDS  # scale_down, scale_up, mode_pinned
TEXTFILE_MODE = 0o644  # node_exporter runs as its own user; the file says nothing secret


def families(doc: dict[str, Any], decisions: dict[str, int]) -> list[Metric]:
    """The metric families of one status document (see docs/observability.md's table)."""
    out: list[Metric] = []

    def gauge(name: str, doc_: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
        m = GaugeMetricFamily(name, doc_, labels=list(labels))
        out.append(m)
        return m

    def counter(name: str, doc_: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
        m = CounterMetricFamily(name, doc_, labels=list(labels))
        out.append(m)
        return m

    sup = doc["supervisor"]
    up = gauge("rlsup_supervisor_up", "1 while the supervisor runs and ticks")
    up.add_metric([], 1.0 if sup["state"] == "running" else 0.0)
    gauge(
        "rlsup_metrics_updated_timestamp_seconds",
        "when the supervisor last wrote these metrics (Unix seconds): old means it is dead",
    ).add_metric([], float(doc["generated_at"]))
    if sup.get("started"):
        started = gauge("rlsup_supervisor_start_time_seconds", "when it started (Unix seconds)")
        started.add_metric([], float(sup["started"]))

    state = gauge("rlsup_game_state", "1 for the state each game is in", ["game", "state"])
    info = gauge("rlsup_game_info", "each game's task, algorithm, device and mode",
                 ["game", "env_id", "algo", "device", "mode"])  # fmt: skip
    restarts = counter("rlsup_game_restarts", "worker restarts of each game", ["game"])
    per_game: dict[str, tuple[str, str]] = {
        "global_step": ("rlsup_game_steps", "agent steps trained (the newest heartbeat)"),
        "total_steps": ("rlsup_game_total_steps", "agent steps the game trains for"),
        "sps": ("rlsup_game_steps_per_second", "agent steps per second (running games)"),
        "mean_return": ("rlsup_game_mean_return", "mean training episode return"),
        "eval_return": ("rlsup_game_eval_return", "mean return of the last evaluation"),
        "last_checkpoint_age_s": (
            "rlsup_game_last_checkpoint_age_seconds",
            "seconds since the newest committed checkpoint",
        ),
        "heartbeat_age_s": ("rlsup_game_heartbeat_age_seconds", "seconds since the heartbeat"),
    }
    values = {key: gauge(name, text, ["game"]) for key, (name, text) in per_game.items()}
    spent = counter(
        "rlsup_game_seconds",
        "seconds of each game's life by part (training, evaluation, redone, setup, starting, "
        "waiting, backoff, down, paused: they sum to its wall time)",
        ["game", "part"],
    )
    money = counter("rlsup_game_cost", "money each game accrued (cost_per_hour shared)", ["game"])
    lost = counter("rlsup_game_cost_lost", "of it, lost to instability", ["game"])
    for g in doc["games"]:
        t = g.get("time")
        if not t:
            continue
        for part in accounting.CATEGORIES:
            spent.add_metric([g["name"], part], float(t[f"{part}_s"]))
        if t.get("money") is not None:
            money.add_metric([g["name"]], float(t["money"]))
            lost.add_metric([g["name"]], float(t["money_lost"]))
    for g in doc["games"]:
        name = g["name"]
        for s in GAME_STATES:
            state.add_metric([name, s], 1.0 if g["state"] == s else 0.0)
        info.add_metric(
            [name, g["env_id"] or "", g["algo"] or "", g.get("device") or "", g["mode"] or ""],
            1.0,
        )
        restarts.add_metric([name], float(g["restarts"]))
        for key, family in values.items():
            v = g.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool):
                family.add_metric([name], float(v))

    h = doc["host"]
    counter(
        "rlsup_host_unexpected_reboots", "unexpected host reboots the ledger recorded"
    ).add_metric([], float(h["unexpected_reboots_total"]))
    host_values = {
        "mtbf_s": ("rlsup_host_mtbf_seconds", "mean time between failures (reboots, crashes)"),
        "uptime_s": ("rlsup_host_uptime_seconds", "seconds since the host booted"),
        "uptime_fraction_7d": ("rlsup_host_uptime_ratio_7d", "fraction of 7 days the host was up"),
        "cpu_pct": ("rlsup_host_cpu_percent", "CPU busy, percent"),
        "ram_available_pct": ("rlsup_host_ram_available_percent", "RAM available, percent"),
    }
    for key, (name, text) in host_values.items():
        if isinstance(h.get(key), int | float):
            gauge(name, text).add_metric([], float(h[key]))
    gpu_values = {
        "mem_used_mb": ("rlsup_host_gpu_memory_used_bytes", "GPU memory used", 2**20),
        "mem_total_mb": ("rlsup_host_gpu_memory_total_bytes", "GPU memory", 2**20),
        "util_pct": ("rlsup_host_gpu_utilization_percent", "GPU utilisation, percent", 1),
        "temp_c": ("rlsup_host_gpu_temperature_celsius", "GPU temperature", 1),
    }
    gpus = {key: gauge(name, text, ["gpu"]) for key, (name, text, _) in gpu_values.items()}
    for gpu in h.get("gpus") or []:
        for key, (_, _, scale) in gpu_values.items():
            if isinstance(gpu.get(key), int | float):
                gpus[key].add_metric([str(gpu.get("index", "?"))], float(gpu[key]) * scale)

    mode = gauge("rlsup_mode", "the mode each scope runs (1), pinned or not", ["scope", "mode"])
    pinned = gauge("rlsup_mode_pinned", "1 where an operator pinned the mode", ["scope"])
    for s in doc["mode"]["scopes"]:
        mode.add_metric([s["scope"], s["mode"]], 1.0)
        pinned.add_metric([s["scope"]], 1.0 if s["pinned"] else 0.0)
    dec = counter("rlsup_policy_decisions", "mode changes, by kind", ["kind"])
    for kind in POLICY_KINDS:
        dec.add_metric([kind], float(decisions.get(kind, 0)))

    spare = doc.get("spare")
    # Several hosts: the row has no pid (the spares run on the hosts), its state says.
    ready = bool(spare and spare["state"] == "ready" and (spare["alive"] or spare["pid"] is None))
    gauge("rlsup_spare_ready", "1 while a pre-warmed spare worker is ready").add_metric(
        [], 1.0 if ready else 0.0
    )
    return out


# What the last textfile says when even the status document cannot be read at a stop.
_DOWN_DOC: dict[str, Any] = {
    "supervisor": {"state": "stopped"},
    "games": [],
    "host": {"unexpected_reboots_total": 0},
    "mode": {"scopes": []},
}


class _Snapshot(Collector):
    def __init__(self) -> None:
        self.metrics: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics  # a reference swap per refresh: no lock needed


class MetricsExporter:
    """The background thread: refresh, rewrite the textfile; and the optional endpoint."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.registry = CollectorRegistry(auto_describe=False)
        self._snapshot = _Snapshot()
        self.registry.register(self._snapshot)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: BoundedMetricsServer | None = None
        self._lock = threading.Lock()
        self._failures: list[dict[str, Any]] = []
        self._failing: set[str] = set()  # what is failing now: reported once, until it heals
        self._publish_lock = threading.Lock()  # one writer of the snapshot and the textfile
        self._final = False  # the supervisor's last word (up 0) is written: nothing after it
        self.address: tuple[str, int] | None = None  # where the endpoint listens

    def start(self) -> None:
        m = self.cfg.metrics
        self.refresh()  # the first snapshot before anyone can scrape
        if m.listen_host:
            try:
                self._server = start_bounded_server(m.listen_host, m.listen_port, self.registry)
                host, port = self._server.server_address[:2]
                self.address = (str(host), int(port))
                log.info("metrics_listening", address=f"{m.listen_host}:{port}")
            except OSError as exc:
                self._fail(
                    "listen",
                    f"cannot listen on {m.listen_host}:{m.listen_port}: {exc.strerror or exc}; "
                    "the textfile (if any) is still written",
                )
        self._thread = threading.Thread(target=self._loop, name="rlsup-metrics", daemon=True)
        self._thread.start()

    def stop(self, *, replaced_by: MetricsConfig | None = None) -> None:
        """The supervisor stops (`replaced_by` None): the textfile's last version says
        `rlsup_supervisor_up 0`, so that node_exporter's alerts see it down. A reload
        (`replaced_by` the new [metrics]) writes nothing, and removes a textfile that the
        new configuration no longer writes (it would only go stale)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        if self._server is not None:
            self._server.stop()
            self._server = None
        own = self.cfg.metrics.textfile
        if replaced_by is None:
            self.refresh(stopping=True)
        elif own is not None and replaced_by.textfile != own:
            with contextlib.suppress(OSError):
                os.unlink(own)

    def drain(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self._failures = self._failures, []
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.metrics.interval_s):
            self.refresh()

    def refresh(self, *, stopping: bool = False) -> None:
        """Recompute the snapshot and rewrite the textfile; `stopping`: the last time, with
        the supervisor down (whatever its row still says) and the games as recorded.

        Whatever one collection raises is reported (once, until it heals) and the previous
        snapshot stays: the files it reads are other processes', and neither the supervisor's
        start-up nor this thread may end on one of them (a thread that died would leave the
        textfile to go stale unnoticed)."""
        try:
            metrics = self._collect(stopping)
            self._healed("collect")
        except Exception as exc:  # any kind: see above (reported, never fatal)
            self._fail("collect", f"cannot collect the metrics: {type(exc).__name__}: {exc}")
            if not stopping:
                return
            metrics = families(_DOWN_DOC | {"generated_at": time.time()}, {})
        with self._publish_lock:  # a late refresh of the thread never overwrites the last word
            if self._final:
                return
            self._final = stopping
            self._snapshot.metrics = metrics
            self._write_textfile()

    def _collect(self, stopping: bool) -> list[Metric]:
        doc: dict[str, Any] = dict(collect(self.cfg, time.time()))
        if stopping:
            doc["supervisor"] = {**doc["supervisor"], "state": "stopped"}
        with readonly.open_db_readonly(self.cfg.db_path) as conn:
            decisions = db.event_counts(conn, POLICY_KINDS) if conn is not None else {}
        return families(doc, decisions)

    def _write_textfile(self) -> None:
        if self.cfg.metrics.textfile is not None:
            try:
                write_textfile(self.cfg.metrics.textfile, self.registry)
                self._healed("textfile")
            except OSError as exc:
                self._fail(
                    "textfile",
                    f"cannot write {self.cfg.metrics.textfile}: {exc.strerror or exc}",
                )

    def _fail(self, what: str, message: str) -> None:
        with self._lock:
            if what in self._failing:
                return
            self._failing.add(what)
            self._failures.append({"what": what, "message": message})
        log.error("metrics_failed", what=what, message=message)

    def _healed(self, what: str) -> None:
        if what in self._failing:
            with self._lock:
                self._failing.discard(what)
            log.info("metrics_recovered", what=what)


def write_textfile(path: os.PathLike[str] | str, registry: CollectorRegistry) -> None:
    """prometheus_client's write_to_textfile, with the mode node_exporter needs to read it:
    a temporary file beside it, then rename(2), so a reader never sees half a file.

    The temporary name is unpredictable and created with O_EXCL | O_NOFOLLOW: the collector's
    directory may be writable by others, and a name planted there (a symlink to a file the
    supervisor's user can write) is never opened, truncated or chmod-ed."""
    data = generate_latest(registry)
    target = os.fspath(path)
    folder, name = os.path.split(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")  # not *.prom: not read
    fd = os.open(tmp, flags, TEXTFILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), TEXTFILE_MODE)  # whatever the umask took away; by fd
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---- the /metrics endpoint: bounded, so that no client can take the supervisor's descriptors ---

MAX_CONNECTIONS = 8  # connections served at once (Prometheus holds one per scrape)
IDLE_TIMEOUT_S = 5.0  # a connection that sends (or reads) nothing this long is closed
CONNECTION_DEADLINE_S = 10.0  # and none is kept longer, however slowly it trickles
LISTEN_BACKLOG = 64


class _MetricsRequestHandler(WSGIRequestHandler):
    """prometheus_client's WSGI app behind a socket timeout; requests are not logged."""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(IDLE_TIMEOUT_S)  # the module's value at each connection

    def log_message(self, format: str, *args: Any) -> None:
        pass


class BoundedMetricsServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, as prometheus_client's own server, but at most
    MAX_CONNECTIONS of them: a new connection past that closes the oldest one (an idle
    client never locks a scrape out), idle ones close after IDLE_TIMEOUT_S, and none lives
    past CONNECTION_DEADLINE_S. So a flood of local connections costs a few descriptors and
    threads, never the ones the supervisor needs to restart a worker."""

    daemon_threads = True
    block_on_close = False  # stop() cuts the connections; nothing to wait for
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int]) -> None:
        self._open: dict[socket.socket, float] = {}  # connection -> accepted (monotonic)
        self._cut: set[socket.socket] = set()  # shut down, its thread finishing
        self._conns_lock = threading.Lock()
        super().__init__(address, _MetricsRequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            if len(self._open) >= MAX_CONNECTIONS:
                self._cut_locked(min(self._open, key=self._open.__getitem__))
            if len(self._cut) >= MAX_CONNECTIONS:  # cut ones not gone yet: refuse, bounded
                refused = True
            else:
                refused = False
                self._open[request] = time.monotonic()
        if refused:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._open.pop(request, None)
            self._cut.discard(request)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """serve_forever() calls this between polls (every 0.5 s): cut what outlived its
        deadline, whatever its thread is blocked on."""
        too_old = time.monotonic() - CONNECTION_DEADLINE_S
        with self._conns_lock:
            for conn in [c for c, t in self._open.items() if t < too_old]:
                self._cut_locked(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out or went away: nothing to report, the connection is closed.
        log.debug("metrics_connection_error", client=str(client_address))

    def stop(self) -> None:
        self.shutdown()  # the accept loop ends
        with self._conns_lock:
            for conn in list(self._open):
                self._cut_locked(conn)
        self.server_close()

    @property
    def connections(self) -> int:
        with self._conns_lock:
            return len(self._open) + len(self._cut)

    def _cut_locked(self, conn: socket.socket) -> None:
        """Wake the connection's thread (its recv/send returns) so that it closes it."""
        self._open.pop(conn, None)
        self._cut.add(conn)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)


def start_bounded_server(host: str, port: int, registry: CollectorRegistry) -> BoundedMetricsServer:
    """Listen on host:port (IPv4 or IPv6, as the address says) and serve the registry's
    /metrics from a daemon thread; OSError if the address cannot be bound."""
    return start_bounded_wsgi(host, port, make_wsgi_app(registry), "rlsup-metrics-http")


def start_bounded_wsgi(
    host: str, port: int, app: Any, thread_name: str = "rlsup-http"
) -> BoundedMetricsServer:
    """The same bounded server for any WSGI app (`rlsup dashboard` serves its page with it)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(BoundedMetricsServer):
        address_family = family

    server = Server((host, port))
    server.set_app(app)
    threading.Thread(target=server.serve_forever, name=thread_name, daemon=True).start()
    return server
