"""The `[metrics] listen` endpoint under a flood of idle connections (issue 24, defect 2).

The exporter runs in its own process with a small descriptor limit (as a supervisor near its
limit would be); the test floods it with idle local connections and checks that the process
can still open descriptors and spawn a program (a worker restart), that a real scrape still
answers, that the listener holds a bounded number of connections, and that it closes idle ones.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.state_fixture import StateFixture

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
FLOOD = 400  # idle connections: well above the 256 descriptors the exporter's process has
FD_LIMIT = 256

EXPORTER = f"""\
import dataclasses, os, resource, subprocess, sys
from supervisor.observe import metrics
from supervisor.config import MetricsConfig, load_config

metrics.IDLE_TIMEOUT_S = 1.0  # the test's patience, not the product's
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, hard))
cfg = load_config(sys.argv[1])
m = MetricsConfig(listen_host="127.0.0.1", listen_port=0, interval_s=60)
ex = metrics.MetricsExporter(dataclasses.replace(cfg, metrics=m))
ex.start()
print("=", ex.address[1], flush=True)
for line in sys.stdin:
    if line.strip() == "fds":
        print("=", len(os.listdir("/proc/self/fd")), flush=True)
    elif line.strip() == "spawn":  # what a worker restart needs: pipes and a fork/exec
        try:
            pipes = [os.pipe() for _ in range(40)]
            subprocess.run(["/bin/true"], check=True)
            for a, b in pipes:
                os.close(a)
                os.close(b)
            print("=", "ok", flush=True)
        except OSError as exc:
            print("=", "failed", exc, flush=True)
ex.stop()
"""


@pytest.fixture
def exporter(state: StateFixture) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", EXPORTER, str(state.config)],
        cwd=REPO,
        env=state.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc, int(answer(proc))
    finally:
        proc.kill()
        proc.wait(10)


_unread: dict[int, bytes] = {}  # per exporter pid: bytes read past the last answer


def answer(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> str:
    """The next line the script printed for the test ("= ..."; its log lines are skipped).
    Read from the descriptor with our own buffer: a text stream's readline after select()
    left a second line in Python's buffer, unseen by select(), when two came in one chunk."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = _unread.pop(proc.pid, b"")
    deadline = time.monotonic() + timeout_s
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"= "):
                _unread[proc.pid] = buf
                return line[2:].decode().strip()
        assert time.monotonic() < deadline, f"the exporter did not answer in {timeout_s:.0f} s"
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk or proc.poll() is None, "the exporter's process ended"
            buf += chunk


def ask(proc: subprocess.Popen[str], what: str) -> str:
    assert proc.stdin is not None
    proc.stdin.write(what + "\n")
    proc.stdin.flush()
    return answer(proc)


def flood(port: int, n: int, within_s: float = 15.0) -> list[socket.socket]:
    """`n` idle connections (none sends a byte), connecting all at once; those connected
    within `within_s` (a listener may leave some in its backlog: the kernel retries them)."""
    pending: list[socket.socket] = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        pending.append(s)
    connected: list[socket.socket] = []
    deadline = time.monotonic() + within_s
    while pending and time.monotonic() < deadline:
        _, writable, _ = select.select([], pending, [], 0.5)
        for s in writable:
            pending.remove(s)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                s.setblocking(True)
                connected.append(s)
            else:
                s.close()
    for s in pending:
        s.close()
    return connected


def closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def test_idle_connections_never_starve_the_process_and_are_closed(
    exporter: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = exporter
    baseline = int(ask(proc, "fds"))
    clients: list[socket.socket] = []
    try:
        for _ in range(FLOOD // 25):
            clients += flood(port, 25)
            # A real scrape answers through it; and once it has, the listener has accepted
            # every connection queued before it (its backlog is FIFO).
            assert "rlsup_supervisor_up" in scrape(port), f"after {len(clients)} clients"
        assert len(clients) >= FLOOD // 2, f"only {len(clients)} of {FLOOD} connected"
        assert ask(proc, "spawn") == "ok"  # the process still has descriptors to spare
        held = int(ask(proc, "fds")) - baseline
        assert held <= 64, f"the listener holds {held} descriptors for {len(clients)} clients"
        deadline = time.monotonic() + 15.0
        still_open = [c for c in clients if not closed_by_peer(c, deadline)]
        assert not still_open, f"{len(still_open)} idle connections still open after 15 s"
    finally:
        for c in clients:
            c.close()
    assert "rlsup_game_steps" in scrape(port)


def test_a_request_trickled_byte_by_byte_is_cut_at_the_connection_deadline(
    exporter: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = exporter
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as slow:
        t0 = time.monotonic()
        cut = False
        for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 200:
            if time.monotonic() - t0 > 40:
                break
            try:
                slow.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            # Each byte comes well within the idle timeout: only a whole-connection deadline
            # ends it. Read what the server may have sent (nothing, or its close).
            ready, _, _ = select.select([slow], [], [], 0.4)
            if ready:
                try:
                    cut = slow.recv(4096) == b""
                except ConnectionResetError:
                    cut = True
                if cut:
                    break
        assert cut, "a trickling client kept its connection for 40 s"
    assert ask(proc, "spawn") == "ok"
