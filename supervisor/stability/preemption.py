"""The cloud's preemption notice, read from its metadata service by a background thread.

A cloud warns before it takes a spot machine: AWS posts a spot `instance-action` two minutes
ahead (IMDSv2: a token PUT, then GET /latest/meta-data/spot/instance-action; 404 = none), GCE
turns /computeMetadata/v1/instance/preempted TRUE about 30 s before an ACPI soft off, Azure
posts a `Preempt` scheduled event (>= 30 s ahead). `PreemptionWatcher` polls the provider's
endpoint every `poll_s` with short timeouts (stdlib urllib, proxies bypassed: the service is
link-local) and queues what it learns; the tick drains the queue and never waits on the network.
A metadata service that hangs, errs or talks nonsense costs one `failed` item per failure
streak, never a blocked tick.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import structlog

from supervisor.config import PREEMPTION_GRACE_S, PREEMPTION_PROVIDERS, PreemptionConfig

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


@dataclass(frozen=True)
class Notice:
    """One preemption notice: who, what, and when the machine goes (Unix seconds)."""

    provider: str
    action: str  # "terminate" | "stop" | "hibernate" (AWS); "terminate" (GCE); "preempt"
    deadline: float
    notice_at: float  # when this watcher first saw it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- HTTP -----------------------------------------------------------------------------------

# The metadata service is link-local: an http_proxy in the service's environment must not
# route the requests elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http(method: str, url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
    """(status, body); 4xx answers are answers. Raises WatchError for anything else."""
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500:
            with contextlib.closing(exc):
                return exc.code, b""
        raise WatchError(f"HTTP {exc.code} from {url}") from None
    except (OSError, ValueError) as exc:  # timeouts, refusals, resets, a bad status line
        raise WatchError(f"{url}: {exc}") from None


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
        deadline = datetime.fromisoformat(str(data["time"]).replace("Z", "+00:00")).timestamp()
    except (ValueError, KeyError, TypeError) as exc:
        raise WatchError(f"spot/instance-action: not a notice: {body[:200]!r} ({exc})") from None
    return Notice("aws", action, deadline, now)


def parse_gcp(status: int, body: bytes, now: float) -> Notice | None:
    """instance/preempted: "TRUE" once preempted (the machine goes about 30 s later)."""
    if status != 200:
        raise WatchError(f"instance/preempted: HTTP {status}")
    text = body.strip().upper()
    if text == b"FALSE":
        return None
    if text == b"TRUE":
        return Notice("gcp", "terminate", now + PREEMPTION_GRACE_S["gcp"], now)
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
            deadlines.append(email.utils.parsedate_to_datetime(e.get("NotBefore")).timestamp())
        except (TypeError, ValueError):
            deadlines.append(now + PREEMPTION_GRACE_S["azure"])  # begun, or unreadable
    return Notice("azure", "preempt", min(deadlines), now)


# ---- the clients ------------------------------------------------------------------------------


class MetadataClient:
    """One provider's notice, read with one short request (AWS: two, for the token)."""

    def __init__(self, provider: str, endpoint: str, timeout_s: float) -> None:
        self.provider, self.endpoint, self.timeout_s = provider, endpoint, timeout_s
        self._token: str | None = None
        self._token_until = 0.0

    def read(self, now: float) -> Notice | None:
        """The notice standing now, or None. Raises WatchError."""
        if self.provider == "aws":
            return self._aws(now)
        if self.provider == "gcp":
            status, body = _http("GET", self.endpoint + GCP_PREEMPTED_PATH, GCP_HEADERS,
                                 self.timeout_s)  # fmt: skip
            return parse_gcp(status, body, now)
        status, body = _http("GET", self.endpoint + AZURE_EVENTS_PATH, AZURE_HEADERS,
                             self.timeout_s)  # fmt: skip
        return parse_azure(status, body, now)

    def _aws(self, now: float) -> Notice | None:
        for _ in range(2):  # a token the service no longer takes (401): one fresh one
            token = self._aws_token()
            headers = {AWS_TOKEN_HEADER: token}
            status, body = _http("GET", self.endpoint + AWS_ACTION_PATH, headers, self.timeout_s)
            if status != 401:
                return parse_aws(status, body, now)
            self._token = None
        raise WatchError("spot/instance-action: HTTP 401 with a fresh token")

    def _aws_token(self) -> str:
        if self._token is not None and time.monotonic() < self._token_until:
            return self._token
        headers = {AWS_TOKEN_TTL_HEADER: str(AWS_TOKEN_TTL_S)}
        status, body = _http("PUT", self.endpoint + AWS_TOKEN_PATH, headers, self.timeout_s)
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
        # GCE's TRUE has no time of its own: the first sighting sets the deadline.
        same = standing is not None and notice.deadline == standing.deadline
        if same or (standing is not None and notice.provider == "gcp"):
            return standing
        self.reports.put(Report("notice", notice))
        return notice
