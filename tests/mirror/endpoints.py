"""Endpoints that are not S3, for the mirror's failure paths: one that surely refuses (a port
this process holds bound but never listens on, so nothing else can take it for the test's
duration) and local HTTP servers that answer something else than S3 (a web page, garbage, XML
that is almost a listing)."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator

# What a server that is not S3 may answer to every request: (status, content type, body).
NOT_S3 = {
    # A web server: valid XML to a lenient parser, with nothing of a bucket listing in it.
    "html": (200, "text/html", b"<html><body><h1>It works!</h1>\n<p>hello</p></body></html>"),
    "garbage": (200, "application/octet-stream", b"\x00\xff\xfe garbage \x01\n"),
    "json": (200, "application/json", b'{"Path": "/rlsup-test", "Entries": null}'),
    # XML close enough to a listing that botocore parses it, then chokes on its values.
    "bad-count": (
        200,
        "application/xml",
        b"<ListBucketResult><KeyCount>abc</KeyCount></ListBucketResult>",
    ),
    "no-key": (
        200,
        "application/xml",
        b"<ListBucketResult><Contents><Size>3</Size></Contents></ListBucketResult>",
    ),
    "bad-time": (
        200,
        "application/xml",
        b"<ListBucketResult><Contents><Key>p/manifests/g/ckpt-000000000001.json</Key>"
        b"<LastModified>yesterday</LastModified></Contents></ListBucketResult>",
    ),
    "teapot": (418, "text/html", b"<html><body>I'm a teapot</body></html>"),
}


@contextlib.contextmanager
def closed_endpoint() -> Iterator[str]:
    """`http://127.0.0.1:<port>` where a connection is refused: the port is bound by this
    process (never listening) until the block ends, so no other process can answer there."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@contextlib.contextmanager
def not_s3_endpoint(kind: str) -> Iterator[str]:
    """A local HTTP server answering every request with NOT_S3[kind]."""
    status, ctype, body = NOT_S3[kind]

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
