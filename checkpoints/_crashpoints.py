"""Test seam for the crash-point sweep (tests/checkpoints/test_ckpt_crash.py): a child process
sets `hook` to a function that SIGKILLs itself at one named point of the commit protocol. None
in production."""

from __future__ import annotations

from collections.abc import Callable

hook: Callable[[str], None] | None = None


def crash_point(point: str) -> None:
    current = hook
    if current is not None:
        current(point)
