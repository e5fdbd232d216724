"""Helpers for the real-systemd tests: a real systemd 252 as PID 1, booted per test by
`systemd-sandbox` (vendored beside this file from the team's shared tools: private
pid/mount/uts/ipc/cgroup namespaces on a copy-on-write overlay of the host root; the host's
files are never written). rlsup is installed inside with
`rlsup install-service`, exactly as an operator would, and driven with systemctl."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TOOL = Path(__file__).resolve().parent / "systemd-sandbox"
RLSUP = Path(sys.executable).parent / "rlsup"

CONFIG = """\
initial_mode = "light"
checkpoint_every_s = 1
stop_grace_s = 20
tick_s = 0.5
[modes.light]
num_envs = 4
batch_size = 64
n_steps = 32
max_concurrent = 2
{games}
[restart]
backoff_base_s = 0.5
backoff_max_s = 2
"""


def game(name: str) -> str:
    return (
        f'[[games]]\nname = "{name}"\nenv_id = "CartPole-v1"\nalgo = "ppo"\n'
        'total_steps = 100000000\ndevice = "cpu"\nargs = { eval_episodes = 0 }\n'
    )


def unavailable() -> str | None:
    """Why a real systemd cannot be booted here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (namespaces, cgroups, an overlay mount)"
    for tool in ("unshare", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/lib/systemd/systemd").exists():
        return "systemd is not installed (/lib/systemd/systemd)"
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        kind = subprocess.run(["stat", "-f", "-c", "%T", root], capture_output=True, text=True)
        if kind.stdout.strip() == "cgroup2fs":
            break
    else:
        return "no cgroup2 hierarchy"
    if not RLSUP.exists():
        return f"no installed `rlsup` console script at {RLSUP} (pip install -e .)"
    return None


class Sandbox:
    """One booted systemd; `upper` is where everything written inside lands on the host."""

    def __init__(self, home: Path, name: str) -> None:
        self.name = name
        self.env = {**os.environ, "SDLAB_NAME": name, "SDLAB_HOME": str(home)}
        # The sandbox mounts a fresh tmpfs on /tmp: a checkout or venv there is shown read-only.
        binds = [p for p in (REPO, Path(sys.prefix)) if str(p).startswith("/tmp/")]
        self.env["SDLAB_RO_BINDS"] = " ".join(str(p) for p in binds)
        self.upper = home / "state" / name / "upper"

    def tool(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TOOL), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def boot(self) -> None:
        done = self.tool("boot", "90")
        assert done.returncode == 0, done.stdout + done.stderr

    def sh(self, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.tool("exec", "bash", "-c", script, timeout=timeout)

    def ok(self, script: str, timeout: float = 120) -> str:
        done = self.sh(script, timeout)
        assert done.returncode == 0, f"{script}: {done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    def push(self, text: str, path: str) -> None:
        src = self.upper.parent / "push.tmp"
        src.write_text(text)
        done = self.tool("push", str(src), path)
        assert done.returncode == 0, done.stderr

    def show(self, prop: str) -> str:
        return self.ok(f"systemctl show -p {prop} --value rlsup").strip()

    def main_pid(self) -> int:
        return int(self.show("MainPID"))

    # ---- what rlsup left in the state dir (read from the host, through the overlay) ----
    @property
    def state(self) -> Path:
        return self.upper / "var/lib/rlsup"

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        db = self.state / "rlsup.db"
        if not db.exists():
            return []
        conn = sqlite3.connect(db, timeout=10)
        try:
            rows = conn.execute("SELECT id, ts, kind, game, detail FROM events ORDER BY id")
            out = [
                {"id": r[0], "ts": r[1], "kind": r[2], "game": r[3], "detail": json.loads(r[4])}
                for r in rows
            ]
        except sqlite3.Error:
            return []
        finally:
            conn.close()
        return [e for e in out if kind is None or e["kind"] == kind]

    def heartbeat(self, game: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(
                (self.state / "runs" / game / "heartbeat.json").read_text()
            )
        except (OSError, ValueError):
            return None
        return data

    def checkpoints(self, game: str) -> list[int]:
        root = self.state / "runs" / game / "checkpoints"
        if not root.is_dir():
            return []
        return sorted(
            int(p.name[5:]) for p in root.glob("ckpt-*") if (p / "MANIFEST.json").exists()
        )

    def workers(self, game: str) -> list[int]:
        out = self.sh(f"pgrep -f 'training.worker .*--run-dir /var/lib/rlsup/runs/{game} '").stdout
        return [int(x) for x in out.split()]

    def training(
        self, game: str, not_pid: int | None = None, above: int = 0
    ) -> dict[str, Any] | None:
        hb = self.heartbeat(game)
        if hb and hb["phase"] == "training" and hb["pid"] != not_pid and hb["global_step"] > above:
            return hb
        return None


def wait_for(pred: Callable[[], Any], timeout: float, what: str, poll: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# The sandbox gives each boot a fresh boot id by bind-mounting a file over the kernel's; the
# unit's ProtectKernelTunables= remounts /proc/sys and shows the host's again. A host's own boot
# id needs no such help: this drop-in only hands the sandbox's to the service.
BOOT_ID_DROPIN = """\
[Service]
RuntimeDirectory=rlsup-sdlab
Environment=RLSUP_BOOT_ID_PATH=/run/rlsup-sdlab/boot_id
ExecStartPre=+/bin/sh -c 'install -m 0644 /proc/sys/kernel/random/boot_id /run/rlsup-sdlab/boot_id'
"""


def prepare(box: Sandbox, games: str) -> None:
    """The operator's configuration in /root/rlsup.toml, and the sandbox's boot-id drop-in."""
    box.push(CONFIG.format(games=games), "/root/rlsup.toml")
    box.push(BOOT_ID_DROPIN, "/etc/systemd/system/rlsup.service.d/sdlab-boot-id.conf")


def wait_training(box: Sandbox, games: str) -> None:
    for name in [line.split('"')[1] for line in games.splitlines() if line.startswith("name")]:
        wait_for(lambda n=name: box.training(n, above=0), 120, f"{name} training")


def install(box: Sandbox, games: str, *flags: str) -> None:
    """rlsup installed as a service the way an operator would: `rlsup install-service` from
    this checkout's environment; where it refuses (a checkout under /tmp, which the unit's
    PrivateTmp hides), the way out it prints, followed."""
    prepare(box, games)
    extra = "".join(f" {flag}" for flag in flags)
    command = f"{RLSUP} install-service --config /root/rlsup.toml{extra}"
    done = box.sh(command, timeout=180)
    if done.returncode != 0 and "the way out" in done.stderr:
        command = follow_the_way_out(box, done.stderr) + extra
        done = box.sh(command, timeout=180)
    assert done.returncode == 0, f"{command}: {done.returncode}\n{done.stdout}{done.stderr}"
    wait_training(box, games)


HOST_VENV = "/opt/rlsup-host-venv"  # this checkout's venv, shown where the service can read it
SOURCE_COPY = "/root/rlsup-source"  # pip builds in the source tree: a writable copy


def follow_the_way_out(box: Sandbox, refusal: str) -> str:
    """Run the commands a refused `install-service` printed (`PYTHON -m venv VENV && VENV/bin/pip
    install SOURCE && VENV/bin/rlsup install-service --config FILE`) inside the sandbox, and
    return the last one, for the caller to run. Tests have no network: pip installs rlsup
    itself from a copy of SOURCE with this checkout's pip, and its dependencies come from this
    checkout's venv (a .pth naming its site-packages) instead of a download."""
    found = re.search(
        r"the way out: install rlsup where the service can read it: `([^`]+)`", refusal
    )
    assert found, refusal
    make_venv, pip_install, install_service = found.group(1).split(" && ")
    python, venv = re.fullmatch(r"(\S+) -m venv (\S+)", make_venv).groups()  # type: ignore[union-attr]
    assert pip_install.startswith(f"{venv}/bin/pip install "), pip_install
    assert install_service.startswith(f"{venv}/bin/rlsup install-service "), install_service
    source = shlex.split(pip_install)[-1]
    box.ok(f"{python} -m venv --without-pip {venv}")
    # In fstab, so that it is there again after the sandbox reboots.
    box.ok(
        f"mkdir -p {HOST_VENV} && echo '{sys.prefix} {HOST_VENV} none bind,ro 0 0' >> /etc/fstab"
        f" && systemctl daemon-reload && mount {HOST_VENV}"
    )
    site = box.ok(
        f"{venv}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'"
    )
    host_site = Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix)
    # addsitedir: that venv's own .pth files count too (its packages may come from another).
    box.ok(
        f"echo 'import site; site.addsitedir(\"{HOST_VENV}/{host_site}\")' "
        f"> {site.strip()}/zz-rlsup-dependencies.pth"
    )
    box.ok(
        f"mkdir -p {SOURCE_COPY} && tar -C {source} --exclude=./.venv --exclude=./.git "
        f"--exclude=./build -cf - . | tar -C {SOURCE_COPY} -xf - && "
        f"{venv}/bin/python -m pip install -q --no-index --no-deps --no-build-isolation "
        f"--ignore-installed {SOURCE_COPY}",
        timeout=300,
    )
    return install_service
