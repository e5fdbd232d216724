"""systemd's sd_notify protocol without dependencies: datagrams to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    """Sends READY=1 / WATCHDOG=1 / STATUS= / STOPPING=1; a no-op when NOTIFY_SOCKET is unset."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET", "")
        # '@name' is an abstract socket: a leading NUL byte on the wire.
        self.address: str | None = ("\0" + raw[1:]) if raw.startswith("@") else (raw or None)
        self.watchdog_s = watchdog_interval_s(env)
        self._sock: socket.socket | None = None
        self._next_watchdog = 0.0
        self._last_status = ""

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        if self.address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(fields).encode(), self.address)
            return True
        except OSError:
            return False

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify("STATUS=" + text.replace("\n", " "))

    def stopping(self, status: str = "") -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def tick(self, now: float, healthy: bool, status: str) -> None:
        """Once a loop tick: WATCHDOG=1 when due and the tick is healthy (a loop that keeps
        failing lets systemd's watchdog restart it), STATUS= when the text changed."""
        if self.watchdog_s and healthy and now >= self._next_watchdog:
            self.watchdog()
            self._next_watchdog = now + self.watchdog_s
        if status != self._last_status:
            self.status(status)
            self._last_status = status

    def reloading(self) -> bool:
        """A reload starts (`systemctl reload` waits for the READY=1 that ends it)."""
        return self.notify("RELOADING=1", "STATUS=reloading the configuration")

    def extend_timeout(self, seconds: float, status: str = "") -> bool:
        """Ask for more time before READY=1 (e.g. while leftover workers drain)."""
        fields = [f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}"]
        return self.notify(*fields, *([f"STATUS={status}"] if status else []))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def systemd_unit(env: Mapping[str, str]) -> str | None:
    """The systemd unit running this process (from its cgroup), when systemd started it."""
    if not env.get("INVOCATION_ID"):
        return None
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith(".service"):
                return part
    return None


def watchdog_interval_s(env: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC (ping twice per period), or None when no watchdog is for us."""
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None
