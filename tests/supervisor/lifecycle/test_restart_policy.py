"""Exit classification, backoff and the windowed budget: pure functions, fake clock."""

from __future__ import annotations

import pytest

from supervisor.lifecycle.restart import (
    ExitKind,
    backoff_delay_s,
    budget_exhausted,
    classify_exit,
    consecutive_after_exit,
    failures_in_window,
)


@pytest.mark.parametrize(
    ("code", "kind", "failure"),
    [
        (0, ExitKind.DONE, False),
        (75, ExitKind.STOPPED, False),
        (76, ExitKind.OOM, True),
        (78, ExitKind.CONFIG, False),
        (1, ExitKind.CRASH, True),
        (139, ExitKind.CRASH, True),
        (-9, ExitKind.SIGNALED, True),
        (-15, ExitKind.SIGNALED, True),
    ],
)
def test_exit_codes_are_classified(code: int, kind: ExitKind, failure: bool) -> None:
    info = classify_exit(code)
    assert info.kind is kind and info.is_failure is failure and info.returncode == code


def test_signal_exit_names_the_signal() -> None:
    assert "SIGKILL" in classify_exit(-9).description


def test_backoff_doubles_until_the_cap() -> None:
    delays = [backoff_delay_s(n, 1.0, 300.0, jitter=1.0) for n in range(2, 13)]
    assert delays[:5] == [1, 2, 4, 8, 16]
    assert max(delays) == 300 and delays[-1] == 300


@pytest.mark.parametrize("jitter", [0.0, 0.5, 0.999])
def test_the_first_restart_in_a_row_is_immediate(jitter: float) -> None:
    assert backoff_delay_s(1, 5.0, 300.0, jitter) == 0.0
    assert backoff_delay_s(2, 5.0, 300.0, jitter) >= 2.5


@pytest.mark.parametrize("jitter", [0.0, 0.25, 0.999])
def test_jitter_stays_within_half_to_full_delay(jitter: float) -> None:
    d = backoff_delay_s(5, 1.0, 300.0, jitter)
    assert 4.0 <= d <= 8.0


def test_budget_allows_k_failures_per_window() -> None:
    t = [100.0, 110.0, 120.0]
    assert not budget_exhausted(t, now=120.0, window_s=60, budget=3)
    assert budget_exhausted([*t, 130.0], now=130.0, window_s=60, budget=3)


def test_budget_refills_as_failures_age_out() -> None:
    t = [0.0, 10.0, 20.0, 30.0]
    assert budget_exhausted(t, now=30.0, window_s=60, budget=3)
    assert not budget_exhausted(t, now=61.0, window_s=60, budget=3)
    assert failures_in_window(t, now=75.0, window_s=60) == [20.0, 30.0]


def test_backoff_resets_after_a_stable_run() -> None:
    assert consecutive_after_exit(5, uptime_s=10, stable_after_s=60) == 6
    assert consecutive_after_exit(5, uptime_s=60, stable_after_s=60) == 1
