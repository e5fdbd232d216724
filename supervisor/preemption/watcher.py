"""The cloud's preemption notice, read from its metadata service by a background thread.

A cloud warns before it takes a spot machine: AWS posts a spot `instance-action` two minutes
ahead (IMDSv2: a token PUT, then GET /latest/meta-data/spot/instance-action; 404 = none), GCE
turns /computeMetadata/v1/instance/preempted TRUE about 30 s before an ACPI soft off, Azure
posts a `Preempt` scheduled event (>= 30 s ahead). `PreemptionWatcher` polls the provider's
endpoint every `poll_s`, each poll bounded by `timeout_s` in all (stdlib http.client, no
proxies: the service is link-local), and queues what it learns; the tick drains the queue and
never waits on the network. A metadata service that hangs, trickles, errs or talks nonsense
costs one `failed` item per failure streak, never a blocked tick.

A posted deadline is believed only as far as the provider's longest notice from when this
watcher first saw it (`notice.new_notice`). Times without a zone are UTC, as AWS documents them.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import json
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from supervisor.config import PREEMPTION_PROVIDERS, PreemptionConfig
from supervisor.preemption.notice import MAX_NOTICE_S, Notice, new_notice

log = structlog.get_logger("rlsup.preemption")

AWS_TOKEN_PATH = "/latest/api/token"
AWS_TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
AWS_TOKEN_TTL_S = 21600
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
GCP_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
GCP_HEADERS = {"Metadata-Flavor": "Google"}
AZURE_EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_HEADERS = {"Metadata": "true"}
MAX_BODY = 1 << 16  # a metadata answer is small; more is nonsense


class WatchError(Exception):
    """The metadata service did not give a readable answer (a timeout, a 5xx, garbage)."""


def _utc(when: datetime) -> float:
    """Unix seconds; a time without a zone is UTC (as the providers write theirs), never the
    host's local time."""
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


# ---- HTTP -----------------------------------------------------------------------------------


class _Cutoff:
    """Ends one request at its deadline, whatever the service does: a timer shuts the socket
    down (a read blocked on it returns at once), so a service that trickles its answer a byte
    at a time, each within the socket timeout, still cannot hold the poll past the deadline."""

    def __init__(self, conn: http.client.HTTPConnection, left_s: float) -> None:
        self.conn, self.fired = conn, False
        self._timer = threading.Timer(left_s, self._cut)
        self._timer.daemon = True

    def _cut(self) -> None:
        self.fired = True
        if (sock := self.conn.sock) is not None:
            with contextlib.suppress(OSError):  # the base class's: also under TLS, no unwrap
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self._timer.start()
        try:
            yield
        finally:
            self._timer.cancel()
            self._timer.join()  # no thread outlives its request


def _http(
    method: str, url: str, headers: dict[str, str], timeout_s: float, deadline: float | None = None
) -> tuple[int, bytes]:
    """(status, body), all of it (connect, headers, body) by `deadline` (monotonic; default:
    timeout_s from now). 4xx answers are answers. Raises WatchError for anything else.
    http.client, not urllib: no proxy from the service's environment may route a link-local
    request elsewhere, and no redirect is followed."""
    deadline = time.monotonic() + timeout_s if deadline is None else deadline
    left = deadline - time.monotonic()
    if left <= 0:
        raise WatchError(f"{url}: timed out (the poll's {timeout_s:g} s were spent)")
    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = cls(parts.hostname or "", parts.port, timeout=left)
    cutoff = _Cutoff(conn, left)
    try:
        with cutoff.running():
            conn.request(method, path, headers=headers)
            resp = conn.getresponse()
            status, body = int(resp.status), resp.read(MAX_BODY)
    except (OSError, http.client.HTTPException, ValueError) as exc:  # timeouts, refusals, resets
        raise WatchError(f"{url}: {'timed out' if cutoff.fired else exc}") from None
    finally:
        conn.close()
    if cutoff.fired:  # cut mid-body: what arrived is not the answer
        raise WatchError(f"{url}: timed out after {timeout_s:g} s in all")
    if 400 <= status < 500:
        return status, b""
    if not 200 <= status < 300:
        raise WatchError(f"HTTP {status} from {url}")
    return status, body


# ---- the providers' answers (pure) ----------------------------------------------------------


def parse_aws(status: int, body: bytes, now: float) -> Notice | None:
    """The spot instance-action: 404 = no notice; else {"action": ..., "time": ISO 8601}."""
    if status == 404:
        return None
    if status != 200:
        raise WatchError(f"spot/instance-action: HTTP {status}")
    try:
        data = json.loads(body)
        action = str(data["action"])
        posted = _utc(datetime.fromisoformat(str(data["time"]).replace("Z", "+00:00")))
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        raise WatchError(f"spot/instance-action: not a notice: {body[:200]!r} ({exc})") from None
    return new_notice("aws", action, posted, now)


def parse_gcp(status: int, body: bytes, now: float) -> Notice | None:
    """instance/preempted: "TRUE" once preempted (the machine goes about 30 s later)."""
    if status != 200:
        raise WatchError(f"instance/preempted: HTTP {status}")
    text = body.strip().upper()
    if text == b"FALSE":
        return None
    if text == b"TRUE":
        return new_notice("gcp", "terminate", now + MAX_NOTICE_S["gcp"], now)
    raise WatchError(f"instance/preempted: neither TRUE nor FALSE: {body[:200]!r}")


def parse_azure(status: int, body: bytes, now: float) -> Notice | None:
    """Scheduled events: a `Preempt` event's NotBefore (RFC 1123; empty once it has begun)."""
    if status != 200:
        raise WatchError(f"scheduledevents: HTTP {status}")
    try:
        events = json.loads(body)["Events"]
        preempts = [e for e in events if e.get("EventType") == "Preempt"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WatchError(f"scheduledevents: not a document: {body[:200]!r} ({exc})") from None
    if not preempts:
        return None
    deadlines = []
    for e in preempts:
        try:
            deadlines.append(_utc(email.utils.parsedate_to_datetime(e.get("NotBefore"))))
        except (TypeError, ValueError, OverflowError):
            deadlines.append(now + MAX_NOTICE_S["azure"])  # begun, or unreadable
    return new_notice("azure", "preempt", min(deadlines), now)


# ---- the clients ------------------------------------------------------------------------------


class MetadataClient:
    """One provider's notice, read with one short request (AWS: two, for the token)."""

    def __init__(self, provider: str, endpoint: str, timeout_s: float) -> None:
        self.provider, self.endpoint, self.timeout_s = provider, endpoint, timeout_s
        self._token: str | None = None
        self._token_until = 0.0

    def read(self, now: float) -> Notice | None:
        """The notice standing now, or None, within timeout_s in all (AWS's token and a retry
        included). Raises WatchError."""
        by = time.monotonic() + self.timeout_s
        if self.provider == "aws":
            return self._aws(now, by)
        if self.provider == "gcp":
            status, body = self._get(GCP_PREEMPTED_PATH, GCP_HEADERS, by)
            return parse_gcp(status, body, now)
        status, body = self._get(AZURE_EVENTS_PATH, AZURE_HEADERS, by)
        return parse_azure(status, body, now)

    def _get(self, path: str, headers: dict[str, str], by: float) -> tuple[int, bytes]:
        return _http("GET", self.endpoint + path, headers, self.timeout_s, by)

    def _aws(self, now: float, by: float) -> Notice | None:
        for _ in range(2):  # a token the service no longer takes (401): one fresh one
            token = self._aws_token(by)
            status, body = self._get(AWS_ACTION_PATH, {AWS_TOKEN_HEADER: token}, by)
            if status != 401:
                return parse_aws(status, body, now)
            self._token = None
        raise WatchError("spot/instance-action: HTTP 401 with a fresh token")

    def _aws_token(self, by: float) -> str:
        if self._token is not None and time.monotonic() < self._token_until:
            return self._token
        headers = {AWS_TOKEN_TTL_HEADER: str(AWS_TOKEN_TTL_S)}
        url = self.endpoint + AWS_TOKEN_PATH
        status, body = _http("PUT", url, headers, self.timeout_s, by)
        token = body.decode("ascii", "replace").strip()
        if status != 200 or not token:
            raise WatchError(f"IMDSv2 token: HTTP {status}")
        self._token, self._token_until = token, time.monotonic() + AWS_TOKEN_TTL_S / 2
        return token


def detect(endpoint: str, timeout_s: float) -> str | None:
    """Which provider's metadata service answers at `endpoint` (one short request each);
    None off the clouds (nothing answers, or nothing that speaks one of them)."""
    probes: list[tuple[str, str, str, dict[str, str]]] = [
        ("aws", "PUT", AWS_TOKEN_PATH, {AWS_TOKEN_TTL_HEADER: str(AWS_TOKEN_TTL_S)}),
        ("gcp", "GET", GCP_PREEMPTED_PATH, GCP_HEADERS),
        ("azure", "GET", AZURE_EVENTS_PATH, AZURE_HEADERS),
    ]
    for provider, method, path, headers in probes:
        try:
            status, _ = _http(method, endpoint + path, headers, timeout_s)
        except WatchError as exc:
            if "timed out" in str(exc) or "refused" in str(exc) or "unreachable" in str(exc):
                return None  # nobody there: no point asking twice more
            continue
        if status == 200:
            return provider
    return None


# ---- the watcher thread -----------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """What the watcher thread learned: `notice` (a new notice), `cleared` (the metadata no
    longer says so), `failed` (the first failure of a streak), `recovered` (its end),
    `detected` (auto: which provider answers)."""

    kind: str
    notice: Notice | None = None
    detail: dict[str, Any] | None = None


class PreemptionWatcher:
    """Polls the provider every `poll_s` in a daemon thread; `drain()` hands the tick what it
    learned. One notice per deadline; one `failed` report per failure streak."""

    def __init__(self, cfg: PreemptionConfig, wall: Callable[[], float] = time.time) -> None:
        self.cfg, self.wall = cfg, wall
        self.reports: queue.SimpleQueue[Report] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.provider: str | None = cfg.provider if cfg.provider in PREEMPTION_PROVIDERS else None

    def start(self) -> None:
        if self.cfg.provider == "none" or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="rlsup-preemption", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = 0.0) -> None:
        """Ends the thread at its next wake-up (a request in flight ends within timeout_s)."""
        self._stop.set()
        if self._thread is not None and wait_s > 0:
            self._thread.join(wait_s)

    def drain(self) -> list[Report]:
        out = []
        with contextlib.suppress(queue.Empty):
            while True:
                out.append(self.reports.get_nowait())
        return out

    def _run(self) -> None:
        cfg = self.cfg
        if self.provider is None:  # auto
            self.provider = detect(cfg.endpoint, cfg.timeout_s)
            if self.provider is None:
                log.info("preemption_watch_off", reason="no metadata service", at=cfg.endpoint)
                return
            self.reports.put(Report("detected", detail={"provider": self.provider}))
        client = MetadataClient(self.provider, cfg.endpoint, cfg.timeout_s)
        standing: Notice | None = None
        failures = 0
        while not self._stop.is_set():
            try:
                notice = client.read(self.wall())
            except WatchError as exc:
                failures += 1
                if failures == 1:
                    detail = {"provider": self.provider, "error": str(exc)[:500]}
                    self.reports.put(Report("failed", detail=detail))
            else:
                if failures:
                    self.reports.put(Report("recovered", detail={"failures": failures}))
                    failures = 0
                standing = self._changed(standing, notice)
            self._stop.wait(cfg.poll_s)

    def _changed(self, standing: Notice | None, notice: Notice | None) -> Notice | None:
        if notice is None:
            if standing is not None:
                self.reports.put(Report("cleared", standing))
            return None
        # The same posted deadline is the same notice, clamped as when first seen; GCE's TRUE
        # has no time of its own: the first sighting sets the deadline.
        same = standing is not None and notice.posted == standing.posted
        if same or (standing is not None and notice.provider == "gcp"):
            return standing
        self.reports.put(Report("notice", notice))
        return notice
