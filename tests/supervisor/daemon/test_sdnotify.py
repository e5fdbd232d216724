"""sd_notify to a real AF_UNIX datagram socket (path and abstract)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from supervisor.sdnotify import Notifier, watchdog_interval_s


def _listen(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(2)
    return sock


def test_messages_reach_a_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    sock = _listen(path)
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.ready("2 running")
    assert sock.recv(1024) == b"READY=1\nSTATUS=2 running"
    assert n.watchdog()
    assert sock.recv(1024) == b"WATCHDOG=1"
    assert n.status("a\nb")
    assert sock.recv(1024) == b"STATUS=a b"
    assert n.stopping()
    assert sock.recv(1024) == b"STOPPING=1"
    n.close()
    sock.close()


def test_abstract_socket_with_at_sign() -> None:
    name = f"rlsup-test-{os.getpid()}"
    sock = _listen("\0" + name)
    n = Notifier({"NOTIFY_SOCKET": "@" + name})
    assert n.ready()
    assert sock.recv(1024) == b"READY=1"
    sock.close()


def test_nothing_is_sent_without_notify_socket() -> None:
    n = Notifier({})
    assert not n.enabled
    assert not n.ready() and not n.watchdog()


def test_a_missing_listener_is_not_an_error(tmp_path: Path) -> None:
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}).ready()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, None),
        ({}, None),
        ({"WATCHDOG_USEC": "x"}, None),
    ],
)
def test_watchdog_pings_at_half_the_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval_s(env) == expected
