"""benchmarks/goodput.py's arithmetic on recorded traces and logs (goodput_model.py): the seeded
schedule, the loss per fault read off a progress trace, goodput, the extrapolation to one fault
per 20 minutes, and the glue log's parsing. No process, no clock, except the one e2e test of the
glue's script (it resumes from its own torch.save with the replay buffer empty, and says so)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks_import import BENCH, benchmark_module


@pytest.fixture(scope="module")
def gm() -> Iterator[ModuleType]:
    with benchmark_module("goodput_model.py", "bench_goodput_model") as module:
        yield module


def test_the_schedule_is_the_seeds_and_every_kind_comes_once_before_any_twice(
    gm: ModuleType,
) -> None:
    a = gm.draw_schedule(7, 30.0, 4, 15.0, announce_after_s=35.0)
    assert a == gm.draw_schedule(7, 30.0, 4, 15.0, announce_after_s=35.0)
    assert a != gm.draw_schedule(8, 30.0, 4, 15.0, announce_after_s=35.0)
    assert sorted(k for _, k in a) == sorted(gm.KINDS)
    times = [t for t, _ in a]
    assert times == sorted(times)
    for i, t in enumerate(times):  # one per 30 s after the warm-up, jittered by <= 7.5 s
        assert abs(t - (15 + 30 * i + 15)) <= 7.5
    for seed in range(40):  # the notice comes a window earlier: never before the run
        for t, k in gm.draw_schedule(seed, 30.0, 4, 15.0, announce_after_s=35.0):
            assert k != "announced_reboot" or t >= 35.0


def trace(gm: ModuleType, rows: list[tuple[float, int, int, float]]) -> list[object]:
    return [gm.Sample(t, pid, step, started) for t, pid, step, started in rows]


# 100 steps/s. pid 1 trains from t=1; a crash at t=10.0 (step 900, newest checkpoint 700);
# pid 2 starts at 11.0 and reports its first step at 12.5 (from 700); a host reboot at 20.0
# (step 1450, checkpoint 1400) with a 5 s boot delay: the service starts at 25.0, pid 3 at
# 26.0, stepping at 28.0 from 1400 with its replay buffer refilled for 300 steps (the glue).
RECORDED = [
    (1.0, 1, 0, 0.5), (5.0, 1, 400, 0.5), (9.9, 1, 890, 0.5),
    (10.2, 1, 900, 0.5),  # the dead process's heartbeat, still on disk: same pid, ignored
    (12.5, 2, 700, 11.0), (19.9, 2, 1440, 11.0),
    (28.0, 3, 1400, 26.0), (40.0, 3, 2600, 26.0),
]  # fmt: skip


def test_each_faults_loss_is_read_off_the_trace(gm: ModuleType) -> None:
    faults = [
        gm.Fault("worker_crash", 10.0, victim=1, step=900, committed=700),
        gm.Fault("host_reboot", 20.0, victim=2, step=1450, committed=1400, boot_delay_s=5.0),
    ]
    losses = gm.fault_losses(trace(gm, RECORDED), faults, 100.0, 40.0, refills={3: 300})
    crash, reboot = losses
    assert crash.recovered and reboot.recovered
    assert (crash.detect_s, crash.restart_s, crash.start_s) == (0.0, 1.0, 1.5)  # -> pid 2 -> step
    assert (crash.redone_steps, crash.redone_s, crash.refill_steps) == (200, 2.0, 0)
    assert crash.lost_s == pytest.approx(4.5)
    # The reboot: the boot delay is the host down (not up-time, not a loss); boot to the first
    # step is the service's start (25.0) -> pid 3 (26.0) -> its first step (28.0).
    assert reboot.host_down_s == 5.0
    assert (reboot.restart_s, reboot.start_s, reboot.boot_to_step_s) == (1.0, 2.0, 3.0)
    assert (reboot.redone_steps, reboot.refill_steps, reboot.refill_s) == (50, 300, 3.0)
    assert reboot.lost_s == pytest.approx(3.0 + 0.5 + 3.0)
    assert gm.useful_steps(trace(gm, RECORDED), {3: 300}) == 2300
    assert gm.goodput(2300, 3000) == pytest.approx(2300 / 3000)
    assert gm.goodput(10, 0) is None


def test_a_hang_nobody_detects_is_lost_until_the_fault_that_ends_it(gm: ModuleType) -> None:
    """Restart=always sees no hang: pid 1 is stopped at t=10 (step 900, checkpoint 800) and
    stays so until the reboot at 30 kills it; the reboot carries the redone steps."""
    rows = [(1.0, 1, 0, 0.5), (9.9, 1, 890, 0.5), (10.1, 1, 900, 0.5), (29.9, 1, 900, 0.5),
            (38.0, 2, 800, 36.0), (40.0, 2, 1000, 36.0)]  # fmt: skip
    faults = [
        gm.Fault("hang", 10.0, victim=1, step=900, committed=800),
        gm.Fault("host_reboot", 30.0, victim=1, step=900, committed=800, boot_delay_s=5.0),
    ]
    hang, reboot = gm.fault_losses(trace(gm, rows), faults, 100.0, 40.0)
    assert not hang.recovered and hang.detect_s == 20.0 and hang.redone_steps == 0
    assert reboot.recovered and reboot.redone_steps == 100
    assert (reboot.detect_s, reboot.restart_s, reboot.start_s) == (0.0, 1.0, 2.0)


def test_a_detected_hang_splits_into_detection_and_the_spares_hand_over(gm: ModuleType) -> None:
    """rlsup's watchdog kills the stopped pid 1 at 15.2 (seen gone then); its spare, pid 2,
    started long before, reports its first step at 15.5: restart 0, start 0.3."""
    rows = [(1.0, 1, 0, 0.5), (9.9, 1, 890, 0.5), (15.0, 1, 900, 0.5), (15.5, 2, 850, 2.0)]
    fault = gm.Fault("hang", 10.0, victim=1, step=900, committed=850, gone_t=15.2)
    (loss,) = gm.fault_losses(trace(gm, rows), [fault], 100.0, 20.0)
    assert loss.recovered and loss.detect_s == pytest.approx(5.2)
    assert (loss.restart_s, loss.start_s) == (0.0, pytest.approx(0.3))
    assert (loss.redone_steps, loss.lost_s) == (50, pytest.approx(5.2 + 0.3 + 0.5))


def test_a_fault_that_finds_nothing_training_redoes_nothing(gm: ModuleType) -> None:
    rows = [(1.0, 1, 0, 0.5), (12.0, 2, 500, 11.0)]
    fault = gm.Fault("worker_crash", 10.0, victim=None, committed=500)
    (loss,) = gm.fault_losses(trace(gm, rows), [fault], 100.0, 20.0)
    assert loss.redone_steps == 0 and loss.recovered and (loss.restart_s, loss.start_s) == (1, 1)


def test_the_extrapolation_scales_back_only_what_was_compressed(gm: ModuleType) -> None:
    losses = [
        gm.FaultLoss("host_reboot", 0, True, restart_s=1.0, start_s=2.0, redone_s=3.0),
        gm.FaultLoss("host_reboot", 0, True, restart_s=3.0, start_s=2.0, redone_s=1.0),
        gm.FaultLoss("hang", 0, True, detect_s=5.0, start_s=2.0, redone_s=1.0),
        gm.FaultLoss("announced_reboot", 0, True, restart_s=1.0, start_s=2.0, redone_s=4.0),
        gm.FaultLoss("worker_crash", 0, False, detect_s=20.0),
    ]
    ex = gm.extrapolate(losses, 300.0, 0.01, compression=40.0, hang_detect_scale=24.0)
    # reboot: the mean measured start-up (4 s) + half the real interval (150 s)
    assert ex.per_kind_lost_s["host_reboot"] == pytest.approx(154.0)
    assert ex.goodput["host_reboot"] == pytest.approx((1 - 154 / 1200) * 0.99, abs=1e-4)
    # hang: detection 5 s x 24 (the real timeout / the compressed one) + 2 + 150
    assert ex.per_kind_lost_s["hang"] == pytest.approx(272.0)
    # announced: its redone steps as measured (the notice's checkpoint does not scale)
    assert ex.per_kind_lost_s["announced_reboot"] == pytest.approx(7.0)
    # a crash not recovered before the next fault: its measured wait, not scaled (only a hang
    # nobody detects lasts until the next fault)
    assert ex.per_kind_lost_s["worker_crash"] == pytest.approx(170.0)
    undetected = [gm.FaultLoss("hang", 0, False, detect_s=20.0)]
    never = gm.extrapolate(undetected, 300.0, 0.0, compression=40.0, hang_detect_scale=1.0)
    assert never.per_kind_lost_s["hang"] == pytest.approx(20 * 40 + 150)
    blind = gm.extrapolate(losses, 300.0, 0.0, 40.0, 24.0, honours_notice=False)
    assert blind.per_kind_lost_s["announced_reboot"] == pytest.approx(153.0)  # as a reboot
    negative = gm.extrapolate(losses[:1], 300.0, -0.05, compression=40.0, hang_detect_scale=1)
    assert negative.slowdown == 0.0  # a baseline slower than the run: no bonus


def test_the_slowdown_splits_into_what_time_costs_and_what_faults_cost(gm: ModuleType) -> None:
    """A slowdown measured at 40x the fault rate mixed both: extrapolated as if it were all
    steady, it cost rlsup's PPO a third of its goodput at a fault per 20 minutes (a spare
    warming beside each restarted worker is paid per fault, not per hour)."""
    base = trace(gm, [(1.0, 9, 0, 0.0), (11.0, 9, 1000, 0.0), (21.0, 9, 2000, 0.0)])
    # the contender: 90 steps/s before the first fault at 11 s (after 2 s to settle)
    mine = trace(gm, [(1.0, 1, 0, 0.5), (3.0, 1, 180, 0.5), (11.0, 1, 900, 0.5)])
    assert gm.split_slowdown(mine, base, 11.0) == pytest.approx(0.1)
    assert gm.split_slowdown(mine, base, 2.0) == 0.0  # no window before the fault: none
    assert gm.split_slowdown([], base, 11.0) == 0.0
    # a new life inside the window: only the process training at its end is measured
    lives = trace(gm, [(3.0, 1, 0, 0.5), (5.0, 2, 0, 4.5), (11.0, 2, 600, 4.5)])
    assert gm.split_slowdown(lives, base, 11.0) == pytest.approx(0.0)
    losses = [
        gm.FaultLoss("host_reboot", 0, True, restart_s=1.0, start_s=2.0),
        gm.FaultLoss("worker_crash", 0, True, start_s=1.0),
        gm.FaultLoss("hang", 0, False, detect_s=20.0),
    ]
    gm.share_residual(losses, 8.0)
    assert [x.after_s for x in losses] == [4.0, 4.0, 0.0]  # only the recovered ones
    ex = gm.extrapolate(losses, 15.0, 0.02, compression=40.0, hang_detect_scale=1.0)
    assert ex.per_kind_lost_s["host_reboot"] == pytest.approx(1 + 2 + 4 + 7.5)
    assert ex.goodput["host_reboot"] == pytest.approx((1 - 14.5 / 1200) * 0.98, abs=1e-4)
    assert "after_s" in losses[0].as_dict() and losses[0].lost_s == 3.0  # not read off a trace


def test_the_steady_cost_is_measured_at_the_real_interval_or_scaled_by_the_rate(
    gm: ModuleType,
) -> None:
    """The compressed run checkpoints 15x as often as the real interval: its steady slowdown is
    an upper bound. A fault-free window at the real interval beside a baseline measures it;
    without one, an overhead that is all checkpointing scales with their rate."""
    base = trace(gm, [(1.0, 9, 0, 0.0), (31.0, 9, 3000, 0.0), (61.0, 9, 6000, 0.0)])
    mine = trace(gm, [(2.0, 1, 0, 0.5), (32.0, 1, 2970, 0.5), (60.0, 1, 5742, 0.5)])
    w = gm.steady_window(mine, base, settle_s=20.0)
    assert w is not None and w["window_s"] == pytest.approx(38.0)  # from 2 + 20 s to 60 s
    assert w["slowdown"] == pytest.approx(0.01, abs=1e-3)
    assert w["sps"] == pytest.approx(99.0, abs=0.1) and w["baseline_sps"] == 100.0
    assert gm.steady_window(mine, base, settle_s=55.0) is None  # too short a window to say
    assert gm.steady_window(mine[:1], base, settle_s=0.0) is None
    # the windows' mean, noise below zero kept in it (then floored at 0) ...
    windows = [{"slowdown": 0.02}, {"slowdown": -0.01}]
    got, source = gm.steady_at_real_interval(windows, 0.09, 1.0, 15.0)
    assert got == pytest.approx(0.005) and "measured" in source
    assert gm.steady_at_real_interval([{"slowdown": -0.03}], 0.09, 1.0, 15.0)[0] == 0.0
    # ... else the compressed run's, scaled by the checkpoint rate
    got, source = gm.steady_at_real_interval([], 0.09, 1.0, 15.0)
    assert got == pytest.approx(0.006) and "scaled" in source


WORKER_LOG = """\
{"event": "worker_start", "timestamp": "2026-11-29T07:00:00Z"}
{"pause_s": 0.002, "cpu_s": 0.018, "event": "checkpoint", "timestamp": "2026-11-29T07:00:01Z"}
{"pause_s": 0.004, "cpu_s": 0.026, "event": "checkpoint", "timestamp": "2026-11-29T07:00:16Z"}
{"step": 300, "pause_s": 0.003, "event": "checkpoint", "timestamp": "2026-11-29T07:00:31Z"}
{"step": 300, "event": "checkpoint_failed", "timestamp": "2026-11-29T07:00:40Z"}
{"step": 400, "pause_s": 0.00
"""


def test_what_checkpoints_cost_is_read_off_the_workers_own_log(gm: ModuleType) -> None:
    """Pause + writer CPU per checkpoint over the time between two: three checkpoints 15 s
    apart (the cut last line and the failure are not checkpoints; an older log without cpu_s
    counts the pause alone)."""
    cost = gm.checkpoint_cost(WORKER_LOG)
    assert cost is not None and cost["n"] == 3 and cost["interval_s"] == 15.0
    assert cost["cost_ms_mean"] == pytest.approx((20 + 30 + 3) / 3, abs=0.01)
    assert cost["cost_ms_max"] == 30.0
    assert cost["share"] == pytest.approx(0.053 / 3 / 15, abs=1e-5)
    assert gm.checkpoint_cost(WORKER_LOG.splitlines()[1]) is None  # one: no interval
    windows = [{"slowdown": -0.1, "checkpoint_share": 0.002}, {"slowdown": 0.05}]
    got, source = gm.steady_at_real_interval(windows, 0.09, 1.0, 15.0)
    assert got == pytest.approx(0.002) and "writer CPU" in source


def test_the_adaptive_interval_is_youngs_rule_on_the_logged_cost(gm: ModuleType) -> None:
    """rlsup's default (adaptive_checkpoints) under one failure per 20 min: sqrt(2 x cost x
    1200 s) for the mean cost per checkpoint the worker logged, and the steady cost at it."""
    windows = [
        {"checkpoint_cost": {"cost_ms_mean": 6.0}},
        {"checkpoint_cost": {"cost_ms_mean": 8.0}},
        {"slowdown": 0.05},
    ]
    interval, steady = gm.adaptive_interval(windows, 15.0)
    assert interval == pytest.approx((2 * 0.007 * 1200) ** 0.5, abs=1e-3)  # 4.10 s
    assert steady == pytest.approx(0.007 / interval)
    # A calm host: the configured interval; a dear checkpoint: never above it either.
    assert gm.adaptive_interval(windows, 15.0, mtbf_s=7 * 86400)[0] == 15.0
    assert gm.adaptive_interval([{"checkpoint_cost": {"cost_ms_mean": 500.0}}], 15.0)[0] == 15.0
    assert gm.adaptive_interval([{"slowdown": 0.01}], 15.0) is None  # nothing logged


GLUE_LOG = """\
resume step=0 pid=41 refill=0 replay=empty
progress step=1 pid=41 t=100.000
progress step=1200 pid=41 t=100.500
saved step=1800 pid=41 stall_ms=7.5
progress step=2400 pid=41 t=101.0
progress step=26
glue: training exited (-9), restarting in 5 s
Traceback (most recent call last):
watchdog: log quiet 12 s, restarting 41
resume step=1800 pid=57 refill=1000 replay=empty
progress step=1801 pid=57 t=107.250
saved step=2900 pid=57 stall_ms=9.0
resume step=2900 pid=60 refill=0 replay=saved
progress step=2950 pid=60 t=109.125
"""


def test_the_glue_log_is_parsed_and_a_line_cut_by_a_kill_is_skipped(gm: ModuleType) -> None:
    log = gm.parse_glue_log(GLUE_LOG)
    assert log.last == (2950, 60, 109.125)
    assert log.refills == {57: 1000}
    assert log.resumes == [(41, 0), (57, 1800), (60, 2900)]
    assert log.stalls_ms == [7.5, 9.0] and log.saved == [(41, 1800), (57, 2900)]
    assert gm.parse_glue_log("progress step=26").last is None
    assert gm.percentile([9.0, 7.5, 30.0], 0.5) == 9.0 and gm.percentile([], 0.5) is None


def test_steps_at_and_speed_of_a_baseline(gm: ModuleType) -> None:
    base = trace(gm, [(2.0, 1, 100, 0.0), (4.0, 1, 300, 0.0), (6.0, 1, 500, 0.0)])
    assert gm.steps_at(base, 5.0) == 400
    assert gm.steps_at(base, 60.0) == 500  # past its end: its last
    assert gm.steps_at(base, 1.0) == 50
    assert gm.speed(base) == 100.0 and gm.speed(base[:1]) == 0.0


@pytest.mark.e2e
def test_the_glue_script_resumes_from_its_torch_save_with_an_empty_buffer(
    gm: ModuleType, tmp_path: Path
) -> None:
    """The script of contenders (c)/(d), killed after a checkpoint and started again: its log
    says where it resumed and that the buffer refills, as goodput.py reads it."""
    argv = [sys.executable, str(BENCH / "goodput_script.py"), "--dir", str(tmp_path),
            "--save-every-s", "1", "--learning-starts", "500"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}
    log = tmp_path / "train.log"
    with log.open("ab") as out:
        first = subprocess.Popen(argv, stdout=out, stderr=out, env=env)
        try:
            deadline = time.monotonic() + 120
            while not gm.parse_glue_log(log.read_text()).saved:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        second = subprocess.Popen(argv, stdout=out, stderr=out, env=env)
        try:
            deadline = time.monotonic() + 120
            while len(gm.parse_glue_log(log.read_text()).resumes) < 2:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
        finally:
            second.send_signal(signal.SIGKILL)
            second.wait(10)
    parsed = gm.parse_glue_log(log.read_text())
    (pid0, step0), (pid1, step1) = parsed.resumes[:2]
    assert (pid0, step0) == (first.pid, 0) and pid1 == second.pid
    assert step1 == max(s for p, s in parsed.saved if p == first.pid)  # its newest checkpoint
    assert parsed.refills == {second.pid: 500}
