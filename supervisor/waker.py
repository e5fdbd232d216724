"""How the tick loop sleeps: until a worker exits (its pidfd turns readable), a signal arrives
(the self-pipe of `signal.set_wakeup_fd`), or the timeout. Signal handlers only set flags;
the loop decides (tini's and supervisord's shape)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
from dataclasses import dataclass
from typing import Any


@dataclass
class Flags:
    stop: bool = False
    reload: bool = False


class Waker:
    def __init__(self) -> None:
        self.flags = Flags()
        self.selector = selectors.DefaultSelector()
        self._r = self._w = -1

    def install(self) -> None:
        """SIGTERM/SIGINT set flags.stop, SIGHUP flags.reload; each wakes wait()."""
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self.selector.register(self._r, selectors.EVENT_READ, None)

        def on_stop(signum: int, frame: Any) -> None:
            self.flags.stop = True

        def on_hup(signum: int, frame: Any) -> None:
            self.flags.reload = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)

    def watch(self, pidfd: int, name: str) -> None:
        """Wake on this process's exit (raises OSError/ValueError if it cannot be watched)."""
        self.selector.register(pidfd, selectors.EVENT_READ, name)

    def unwatch(self, pidfd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(pidfd)

    def wait(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.fd == self._r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._r, 512):
                        pass

    def close(self) -> None:
        with contextlib.suppress(Exception):
            signal.set_wakeup_fd(-1)
        for fd in (self._r, self._w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._r = self._w = -1
        self.selector.close()
