"""A following `rlsup` command (`logs -f`, `events -f`) run in the background by a test."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from conftest import REPO


class Follow:
    """`rlsup logs|events ... -f` in the background; its stdout lines as they come.

    Every follower is killed after its test on every path, a failing test included
    (`kill_all`, from the CLI tests' autouse fixture)."""

    live: ClassVar[list[Follow]] = []

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        Follow.live.append(self)
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buf = b""

    def lines(self) -> list[str]:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read(65536):
            self.buf += chunk
        complete = self.buf[: self.buf.rfind(b"\n") + 1]
        return complete.decode("utf-8", "replace").splitlines()

    def wait_for(self, pred: Callable[[list[str]], object], timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.lines()
            if pred(got):
                return got
            self.check_alive()
            time.sleep(0.05)
        raise AssertionError(f"follower printed {self.lines()!r}")

    def check_alive(self) -> None:
        assert self.proc.poll() is None, self.proc.stderr.read()  # type: ignore[union-attr]

    def wait_open(self, path: Path, timeout: float = 30) -> None:
        """Until the follower holds `path` open (it has taken its starting point)."""
        fds = Path(f"/proc/{self.proc.pid}/fd")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for fd in fds.iterdir():
                try:
                    if os.readlink(fd) == str(path):
                        return
                except OSError:
                    continue
            time.sleep(0.02)
        raise AssertionError(f"the follower never opened {path}")

    def wait_stderr(self, text: str, timeout: float = 30) -> None:
        assert self.proc.stderr is not None
        os.set_blocking(self.proc.stderr.fileno(), False)
        err = b""
        deadline = time.monotonic() + timeout
        while text.encode() not in err:
            assert time.monotonic() < deadline, f"stderr: {err!r}"
            err += self.proc.stderr.read() or b""
            time.sleep(0.02)

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(20)
        finally:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    @classmethod
    def kill_all(cls) -> None:
        while cls.live:
            cls.live.pop().kill()
