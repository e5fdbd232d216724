"""A loopback cloud metadata service that speaks one provider's preemption endpoints as each
documents them (AWS IMDSv2: a token PUT, then the spot instance-action with the token; GCE:
`instance/preempted`, 403 without `Metadata-Flavor: Google`; Azure: scheduled events, 400
without `Metadata: true`), and can be told to post a notice, hang, answer garbage or 500, or
trickle a whole answer one byte every `trickle_s` (each read well within a socket timeout)."""

from __future__ import annotations

import contextlib
import email.utils
import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "fake-imds-token"


class FakeMetadata:
    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.mode = "calm"  # calm | notice | hang | garbage | error | trickle
        self.deadline: float | None = None
        self.aws_time: str | None = None  # AWS's `time` as written, instead of the deadline's
        self.trickle_s = 0.5
        self.requests: list[tuple[str, str]] = []
        self.release = threading.Event()  # ends the hanging answers
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                fake.requests.append(("PUT", self.path))
                if fake.provider != "aws" or self.path != "/latest/api/token":
                    return self._send(404, b"")
                if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400, b"")
                self._send(200, TOKEN.encode())

            def do_GET(self) -> None:
                fake.requests.append(("GET", self.path))
                # The watcher ends a poll at its deadline: a trickled answer meets a closed
                # socket, which is the point, not a server error to print.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    fake.answer(self)

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.handler = Handler
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def post_notice(self, in_s: float = 120.0) -> float:
        """Post a notice whose deadline is `in_s` from now (whole seconds, as AWS writes)."""
        self.deadline = float(int(time.time() + in_s))
        self.mode = "notice"
        return self.deadline

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    # ---- the answers ----------------------------------------------------------------------

    def answer(self, h: Any) -> None:
        body = self._answer(h)
        if body is None:
            return
        code, data = body
        if self.mode == "trickle":
            return self._trickle(h, code, data)
        h._send(code, data)

    def _trickle(self, h: Any, code: int, data: bytes) -> None:
        raw = b"HTTP/1.0 %d OK\r\nContent-Length: %d\r\n\r\n%s" % (code, len(data), data)
        for i in range(len(raw)):
            if self.release.wait(self.trickle_s):
                return
            try:
                h.wfile.write(raw[i : i + 1])
                h.wfile.flush()
            except OSError:  # the client gave up
                return

    def _answer(self, h: Any) -> tuple[int, bytes] | None:
        path, hd = h.path, h.headers
        if self.provider == "aws" and path == "/latest/meta-data/spot/instance-action":
            if hd.get("X-aws-ec2-metadata-token") != TOKEN:
                return 401, b""
            return self._faults() or self._aws()
        if self.provider == "gcp" and path == "/computeMetadata/v1/instance/preempted":
            if hd.get("Metadata-Flavor") != "Google":
                return 403, b""
            return self._faults() or (200, b"TRUE" if self.mode == "notice" else b"FALSE")
        if self.provider == "azure" and path.startswith("/metadata/scheduledevents"):
            if hd.get("Metadata") != "true" or "api-version=" not in path:
                return 400, b""
            return self._faults() or self._azure()
        return 404, b""

    def _faults(self) -> tuple[int, bytes] | None:
        if self.mode == "hang":
            self.release.wait(30)
            return None
        if self.mode == "garbage":
            return 200, b"\x00\xffnot{json"
        if self.mode == "error":
            return 500, b"internal error"
        return None

    def _aws(self) -> tuple[int, bytes]:
        if self.mode != "notice" or self.deadline is None:
            return 404, b""
        when = self.aws_time or datetime.fromtimestamp(self.deadline, UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        return 200, json.dumps({"action": "terminate", "time": when}).encode()

    def _azure(self) -> tuple[int, bytes]:
        events = []
        if self.mode == "notice" and self.deadline is not None:
            events.append({
                "EventId": "A123BC45-1234-5678-AB90-ABCDEF123456",
                "EventStatus": "Scheduled",
                "EventType": "Preempt",
                "ResourceType": "VirtualMachine",
                "Resources": ["vm1"],
                "NotBefore": email.utils.formatdate(self.deadline, usegmt=True),
                "Description": "Virtual machine is being preempted.",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            })  # fmt: skip
        return 200, json.dumps({"DocumentIncarnation": 1, "Events": events}).encode()
