"""`rlsup join` for real: `--head` starts a Ray head that places nothing, and a host joined with
`--address` carries its name and boot id as node labels (what the Ray backend places by) and
its own RLSUP_NODE_DIR (where its actors run games)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harness.ray_cluster import _ray_processes
from harness.runs import REPO, env_for, rlsup, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("ray", reason="the ray extra (make test installs it)")

NODES = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
@ray.remote(num_cpus=1)
def where():
    import os
    return os.environ.get("RLSUP_NODE_DIR"), os.environ.get("RLSUP_HOST")
alive = [n for n in ray.nodes() if n["Alive"]]
print(json.dumps({"nodes": [{"labels": n["Labels"], "cpus": n["Resources"].get("CPU", 0)}
                            for n in alive], "task": ray.get(where.remote(), timeout=60)}))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(env: dict[str, str], *args: str, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "join", *args, "--block"],
        env=env,
        cwd=REPO,
        stdout=out,
        stderr=out,
        start_new_session=True,
    )


def test_join_starts_a_head_and_labels_a_host(tmp_path: Path) -> None:
    env = env_for(tmp_path, RAY_USAGE_STATS_ENABLED="0")
    before = {p.pid for p in _ray_processes()}
    port = _port()
    procs = []
    try:
        procs.append(_start(env, "--head", "--port", str(port), log=tmp_path / "head.log"))
        address = f"{socket.gethostbyname(socket.gethostname())}:{port}"

        def head_up() -> bool:
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex((address.split(":")[0], port)) == 0

        wait_for(head_up, 120, "the head's port")
        node_dir = tmp_path / "node"
        procs.append(
            _start(env, "--address", address, "--name", "hx", "--node-dir", str(node_dir),
                   "--num-cpus", "1", log=tmp_path / "node.log")
        )  # fmt: skip

        def nodes() -> dict[str, object] | None:
            out = subprocess.run(
                [sys.executable, "-c", NODES, address],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if out.returncode != 0:
                return None
            doc = json.loads(out.stdout.strip().splitlines()[-1])
            return doc if len(doc["nodes"]) == 2 else None

        doc = wait_for(nodes, 150, "the head and the joined host", poll=2)
        boot = (tmp_path / "boot_id").read_text().strip()
        [host] = [n for n in doc["nodes"] if "rlsup-host" in n["labels"]]
        assert host["labels"]["rlsup-host"] == "hx"
        assert host["labels"]["rlsup-boot"] == boot
        assert host["cpus"] == 1
        [head] = [n for n in doc["nodes"] if "rlsup-host" not in n["labels"]]
        assert head["cpus"] == 0, "the head places no game"
        assert doc["task"] == [str(node_dir), "hx"], "work placed there sees the host's dir"
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        for p in _ray_processes():
            if p.pid not in before:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)


def test_join_refuses_a_bad_host_name_and_prints_the_ray_start_command(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    bad = rlsup("join", "--address", "10.0.0.1:6379", "--name", "no/slash", env=env)
    assert bad.returncode == 2 and "no/slash" in bad.stderr
    dry = rlsup(
        "join", "--address", "10.0.0.1:6379", "--name", "gpu-box-2", "--num-gpus", "1",
        "--dry-run", env=env,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    argv = dry.stdout.split()
    assert "--address=10.0.0.1:6379" in argv and "--num-gpus=1" in argv
    boot = (tmp_path / "boot_id").read_text().strip()
    assert f"--labels=rlsup-host=gpu-box-2,rlsup-boot={boot}" in argv


def test_the_node_unit_verifies() -> None:
    import shutil

    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze on this machine")
    out = subprocess.run(
        ["systemd-analyze", "verify", str(REPO / "systemd" / "rlsup-node.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
