"""The pure part of benchmarks/goodput.py: the seeded fault schedule, the per-fault losses read
off a progress trace, goodput, and the extrapolation to one fault per 20 minutes. No process,
no clock, no torch: tests/test_bench_goodput.py checks it on recorded traces and logs.

A *trace* is what the driver sampled every ~0.2 s while a contender ran: (t, pid, step,
started) rows, t in seconds since the contender's service first started, pid the training
process that reported `step` (rlsup's heartbeat.json, the glue's log line), `started` that
process's start time on the same clock. A *fault* is what the driver did and when (`t`: the
moment work stops, i.e. the kill; for a hang the SIGSTOP; for an announced reboot the kill at the
notice's deadline), which process it hit and the newest checkpoint step on disk at that moment
(the step a resume goes back to).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import random
import re
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("host_reboot", "worker_crash", "hang", "announced_reboot")
REBOOTS = ("host_reboot", "announced_reboot")
REAL_MTBF_S = 20 * 60.0  # the seeds' hosts: a reboot every 15-20 min under load


@dataclass(frozen=True)
class Sample:
    t: float
    pid: int
    step: int
    started: float  # the process's start, on the trace's clock


@dataclass
class Fault:
    kind: str
    t: float  # when work stopped (kill / SIGSTOP / the notice's deadline)
    victim: int | None = None  # the training pid hit (None: nothing was training)
    step: int = 0  # the victim's last reported step
    committed: int = -1  # the newest checkpoint on disk then (-1: none: back to step 0)
    boot_delay_s: float = 0.0  # reboots: the host is down this long (not up-time)
    gone_t: float | None = None  # when the victim was seen gone (a hang: its detection)


@dataclass
class FaultLoss:
    kind: str
    t: float
    recovered: bool  # a new process stepped before the next fault (or the end)
    detect_s: float = 0.0  # hit -> the victim gone (a hang's detection; a crash's ~0)
    restart_s: float = 0.0  # gone (a reboot: the service's start) -> the new process
    start_s: float = 0.0  # the new process (a spare: the hand-over) -> its first step
    redone_steps: int = 0
    redone_s: float = 0.0
    refill_steps: int = 0  # a replay buffer refilled from empty (no learning meanwhile)
    refill_s: float = 0.0
    host_down_s: float = 0.0  # the boot delay: not up-time, not counted as loss
    # Training slower than the baseline after the first step, beyond the steady slowdown
    # (a spare warming beside it, caches cold), as seconds of training: the run's residual
    # loss shared equally among its recovered faults (split_slowdown). Not in lost_s (not
    # read off the trace); in the extrapolation's fixed cost per fault.
    after_s: float = 0.0

    @property
    def boot_to_step_s(self) -> float:
        """The victim gone (a reboot: the service started) -> the first training step."""
        return self.restart_s + self.start_s

    @property
    def lost_s(self) -> float:
        return self.detect_s + self.restart_s + self.start_s + self.redone_s + self.refill_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lost_s": round(self.lost_s, 3),
                "boot_to_step_s": round(self.boot_to_step_s, 3)}  # fmt: skip


def draw_schedule(
    seed: int, every_s: float, count: int, warmup_s: float, kinds: tuple[str, ...] = KINDS,
    announce_after_s: float = 0.0,
) -> list[tuple[float, str]]:  # fmt: skip
    """`count` faults, one per `every_s` after `warmup_s`, each jittered by up to a quarter of
    the spacing; the kinds a seeded shuffle of `kinds` repeated (every kind once before any
    twice); an announced reboot never before `announce_after_s` (its notice comes a window
    earlier), swapped with a later fault. Same seed, same schedule for every contender."""
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < count:
        batch = list(kinds)
        rng.shuffle(batch)
        order += batch
    order = order[:count]
    times = []
    for i in range(count):
        jitter = rng.uniform(-every_s / 4, every_s / 4)
        times.append(round(warmup_s + i * every_s + every_s / 2 + jitter, 2))
    for i in range(count):
        if order[i] == "announced_reboot" and times[i] < announce_after_s:
            j = next((j for j in range(i + 1, count) if times[j] >= announce_after_s), None)
            if j is not None:
                order[i], order[j] = order[j], order[i]
    return list(zip(times, order, strict=True))


def steps_at(trace: list[Sample], t: float) -> int:
    """The baseline's step at time t (linear between samples; its last beyond them)."""
    if not trace or t <= trace[0].t:
        return 0 if not trace else int(trace[0].step * max(0.0, t) / max(trace[0].t, 1e-9))
    for a, b in itertools.pairwise(trace):
        if a.t <= t <= b.t:
            return int(a.step + (b.step - a.step) * (t - a.t) / max(b.t - a.t, 1e-9))
    last = trace[-1]
    return last.step


def speed(trace: list[Sample], skip_s: float = 0.0) -> float:
    """Steps per second of an uninterrupted trace, from its first step past `skip_s` on."""
    rows = [s for s in trace if s.t >= skip_s]
    if len(rows) < 2 or rows[-1].t <= rows[0].t:
        return 0.0
    return (rows[-1].step - rows[0].step) / (rows[-1].t - rows[0].t)


def fault_losses(
    trace: list[Sample], faults: list[Fault], steps_per_s: float, end_t: float,
    refills: dict[int, int] | None = None,
) -> list[FaultLoss]:  # fmt: skip
    """Each fault's loss, read off the trace. `refills`: pid -> replay steps that process spent
    refilling an emptied buffer (the glue's log says so; rlsup restores its buffer)."""
    refills = refills or {}
    out = []
    for i, f in enumerate(faults):
        until = faults[i + 1].t if i + 1 < len(faults) else end_t
        service_t = f.t + f.boot_delay_s
        new = next((s for s in trace if f.t < s.t <= until and s.pid != f.victim), None)
        loss = FaultLoss(f.kind, f.t, recovered=new is not None, host_down_s=f.boot_delay_s)
        if new is None:
            # Nothing trained again before the next fault (a hang no one detects): all of it
            # is lost; the next fault (the reboot that ends it) carries the redone steps.
            loss.detect_s = max(0.0, until - service_t)
            out.append(loss)
            continue
        gone = service_t if f.kind in REBOOTS or f.gone_t is None else max(f.gone_t, f.t)
        gone = min(gone, new.t)
        started = min(max(new.started, gone), new.t)  # a spare was there before: 0
        loss.detect_s = max(0.0, gone - service_t) if f.kind not in REBOOTS else 0.0
        loss.restart_s = max(0.0, started - gone)
        loss.start_s = max(0.0, new.t - started)
        if f.victim is not None:
            loss.redone_steps = max(0, f.step - max(f.committed, 0))
        loss.refill_steps = refills.get(new.pid, 0)
        if steps_per_s > 0:
            loss.redone_s = loss.redone_steps / steps_per_s
            loss.refill_s = loss.refill_steps / steps_per_s
        out.append(loss)
    # A hang nobody detected: its victim's steps are redone after the fault that ends it.
    for i, f in enumerate(faults[:-1]):
        nxt = faults[i + 1]
        if not out[i].recovered and f.victim is not None and nxt.victim == f.victim:
            out[i + 1].redone_steps = max(0, f.step - max(f.committed, 0))
            if steps_per_s > 0:
                out[i + 1].redone_s = out[i + 1].redone_steps / steps_per_s
    return out


def window_speed(trace: list[Sample], t0: float, t1: float) -> float:
    """Steps per second of the process training at t1, over [t0, t1] (0.0: too few samples)."""
    rows = [s for s in trace if t0 <= s.t <= t1]
    rows = [s for s in rows if rows and s.pid == rows[-1].pid]
    if len(rows) < 2 or rows[-1].t <= rows[0].t:
        return 0.0
    return (rows[-1].step - rows[0].step) / (rows[-1].t - rows[0].t)


def split_slowdown(
    trace: list[Sample], base: list[Sample], first_fault_t: float, settle_s: float = 2.0
) -> float:
    """The steady slowdown: how much slower the contender trained than its baseline in the same
    fault-free window (from its first step + `settle_s` to the first fault): what it pays all
    the time (checkpoints, supervision). The rest of a run's residual slowdown comes with its
    faults (FaultLoss.after_s) and scales with their rate, not with time."""
    if not trace:
        return 0.0
    t0 = trace[0].t + settle_s
    if first_fault_t <= t0:
        return 0.0
    mine = window_speed(trace, t0, first_fault_t)
    theirs = (steps_at(base, first_fault_t) - steps_at(base, t0)) / (first_fault_t - t0)
    if mine <= 0 or theirs <= 0:
        return 0.0
    return max(0.0, 1.0 - mine / theirs)


def steady_window(
    trace: list[Sample], base: list[Sample], settle_s: float
) -> dict[str, float] | None:
    """A fault-free run beside its baseline, both from the later first step + `settle_s` to
    the earlier last sample: how much slower the contender trained (negative: faster; the
    noise of two services sharing the cores), with both speeds and the window's length.
    None when the window is too short to say."""
    if len(trace) < 2 or len(base) < 2:
        return None
    t0 = max(trace[0].t, base[0].t) + settle_s
    t1 = min(trace[-1].t, base[-1].t)
    if t1 - t0 < 5.0:
        return None
    if len({x.pid for x in trace}) > 1 or len({x.pid for x in base}) > 1:
        return None  # not fault-free: a restart inside the window
    mine = (steps_at(trace, t1) - steps_at(trace, t0)) / (t1 - t0)
    theirs = (steps_at(base, t1) - steps_at(base, t0)) / (t1 - t0)
    if mine <= 0 or theirs <= 0:
        return None
    return {"slowdown": round(1.0 - mine / theirs, 4), "sps": round(mine, 1),
            "baseline_sps": round(theirs, 1), "window_s": round(t1 - t0, 1)}  # fmt: skip


def checkpoint_cost(log_text: str) -> dict[str, float] | None:
    """What a built-in worker's checkpoints took from training, from its own log's `checkpoint`
    lines (JSON): the pause of the loop plus the writer thread's CPU time (on a host whose cores
    all train, CPU the writer takes is CPU training lacks), per checkpoint, over the mean time
    between two: the share of training time they cost. None with fewer than two."""
    rows: list[tuple[float, float]] = []
    for line in log_text.splitlines():
        if '"checkpoint"' not in line:
            continue
        try:
            rec = json.loads(line)
            if rec.get("event") != "checkpoint":
                continue
            when = dt.datetime.fromisoformat(str(rec["timestamp"]).replace("Z", "+00:00"))
            cost = float(rec["pause_s"]) + float(rec.get("cpu_s", 0.0))
        except (ValueError, KeyError, TypeError):
            continue
        rows.append((when.timestamp(), cost))
    if len(rows) < 2 or rows[-1][0] <= rows[0][0]:
        return None
    interval = (rows[-1][0] - rows[0][0]) / (len(rows) - 1)
    costs = [c for _, c in rows]
    mean = sum(costs) / len(costs)
    return {"n": len(rows), "cost_ms_mean": round(1000 * mean, 2),
            "cost_ms_max": round(1000 * max(costs), 2), "interval_s": round(interval, 2),
            "share": round(mean / interval, 5)}  # fmt: skip


def steady_at_real_interval(
    windows: list[dict[str, float]], compressed: float, compressed_interval_s: float,
    real_interval_s: float,
) -> tuple[float, str]:  # fmt: skip
    """The steady slowdown to extrapolate with, and where it came from. Best: what the
    checkpoints cost by the worker's own account at the real interval (`checkpoint_share` in
    the windows: pause + the writer's CPU, over the interval), the one difference between a
    contender and its baseline without checkpoints, measured to a fraction of a percent where
    two services side by side on 2 cores differ by up to 10 % from window to window. Else the
    mean of the fault-free windows (negative ones count: they are the noise, and dropping them
    would bias the mean up; floored at 0). Else the compressed run's, scaled by the checkpoint
    rate (an overhead that is all checkpointing, as the glue's is)."""
    shares = [w["checkpoint_share"] for w in windows if w.get("checkpoint_share") is not None]
    if shares:
        return sum(shares) / len(shares), (
            f"checkpoint pause + writer CPU over the interval, by the worker's log "
            f"({len(shares)} windows at the real interval)"
        )
    if windows:
        mean = sum(w["slowdown"] for w in windows) / len(windows)
        return max(0.0, mean), f"measured at the real interval ({len(windows)} windows)"
    scaled = max(0.0, compressed) * compressed_interval_s / real_interval_s
    return scaled, "the compressed run's, scaled by the checkpoint rate"


def adaptive_interval(
    windows: list[dict[str, Any]], every_s: float, mtbf_s: float = REAL_MTBF_S
) -> tuple[float, float] | None:
    """rlsup's checkpoint interval on a host failing every `mtbf_s` (adaptive_checkpoints, the
    default: training.protocol's Young's rule on the checkpoint's cost, at most `every_s`) and
    the steady slowdown at it, from the cost per checkpoint the worker logged in the fault-free
    windows (pause + the writer's CPU). None when no window has it."""
    from training.protocol import checkpoint_interval_s  # the worker's own rule

    costs = [w["checkpoint_cost"]["cost_ms_mean"] / 1000 for w in windows
             if w.get("checkpoint_cost")]  # fmt: skip
    if not costs:
        return None
    cost = sum(costs) / len(costs)
    interval = checkpoint_interval_s(every_s, cost_s=cost, mtbf_s=mtbf_s)
    return interval, cost / interval


def share_residual(losses: list[FaultLoss], residual_s: float) -> None:
    """`residual_s` seconds of training lost beyond the faults' own losses and the steady
    slowdown, shared equally among the recovered faults as after_s."""
    recovered = [x for x in losses if x.recovered]
    for x in recovered:
        x.after_s = max(0.0, residual_s) / len(recovered)


def useful_steps(trace: list[Sample], refills: dict[int, int] | None = None) -> int:
    """The final run's step (none redone: a resumed run counts from its checkpoint), less the
    steps spent refilling a lost replay buffer (collected, never learned from)."""
    if not trace:
        return 0
    return max(0, trace[-1].step - sum((refills or {}).values()))


def goodput(useful: int, baseline_steps: int) -> float | None:
    return useful / baseline_steps if baseline_steps > 0 else None


@dataclass
class Extrapolation:
    """Goodput with one fault of each kind's mean measured loss every `mtbf_s`: the fixed costs
    (detection, restart, boot to first step, refill) as measured, the redone work of an
    unannounced fault taken as half the real checkpoint interval (the compressed run's
    interval is `compression` times shorter), of an announced one as measured (its notice
    checkpoint does not scale), plus the measured slowdown (checkpoint stalls, supervision)."""

    mtbf_s: float
    interval_s: float
    per_kind_lost_s: dict[str, float] = field(default_factory=dict)
    slowdown: float = 0.0
    goodput: dict[str, float] = field(default_factory=dict)


def extrapolate(
    losses: list[FaultLoss], interval_s: float, slowdown: float, compression: float,
    hang_detect_scale: float, mtbf_s: float = REAL_MTBF_S, honours_notice: bool = True,
) -> Extrapolation:  # fmt: skip
    """Per fault kind, the loss of one such fault every `mtbf_s`. Scaled back from the
    compressed run: a hang's detection by `hang_detect_scale` (real timeout / compressed one);
    a hang never detected (lost until the next fault) by `compression`; an unannounced fault's
    redone work taken as half the real `interval_s`. As measured: restart, boot to first step,
    a replay buffer's refill, an announced reboot's redone steps, the slower training after a
    restart (after_s). `slowdown`: the steady fraction of the speed lost while up (checkpoint
    stalls, supervision), as measured before the first fault (its checkpoints were up to
    `compression` times more frequent: an upper bound)."""
    ex = Extrapolation(mtbf_s=mtbf_s, interval_s=interval_s, slowdown=max(0.0, slowdown))
    by_kind: dict[str, list[FaultLoss]] = {}
    for loss in losses:
        by_kind.setdefault(loss.kind, []).append(loss)
    for kind, rows in by_kind.items():
        fixed = []
        for r in rows:
            if not r.recovered:  # a hang nobody detects lasts until the next fault
                fixed.append(r.detect_s * (compression if kind == "hang" else 1.0))
                continue
            detect = r.detect_s * (hang_detect_scale if kind == "hang" else 1.0)
            fixed.append(detect + r.restart_s + r.start_s + r.refill_s + r.after_s)
        # A notice only spares the redone work of a contender that watches for one; to the
        # others an announced reboot is one more unannounced one.
        redone = (
            sum(r.redone_s for r in rows) / len(rows)
            if kind == "announced_reboot" and honours_notice
            else interval_s / 2
        )
        lost = min(sum(fixed) / len(fixed) + redone, mtbf_s)
        ex.per_kind_lost_s[kind] = round(lost, 2)
        ex.goodput[kind] = round((1 - lost / mtbf_s) * (1 - ex.slowdown), 4)
    return ex


# ---- the glue's log (benchmarks/goodput_script.py prints these lines) ------------------------

PROGRESS = re.compile(r"^progress step=(\d+) pid=(\d+) t=([0-9.]+)$")
RESUME = re.compile(r"^resume step=(\d+) pid=(\d+) refill=(\d+)(?: replay=(\w+))?$")
SAVED = re.compile(r"^saved step=(\d+) pid=(\d+) stall_ms=([0-9.]+)$")


@dataclass
class GlueLog:
    last: tuple[int, int, float] | None = None  # (step, pid, t) of the newest progress line
    refills: dict[int, int] = field(default_factory=dict)  # pid -> refill steps
    resumes: list[tuple[int, int]] = field(default_factory=list)  # (pid, step)
    stalls_ms: list[float] = field(default_factory=list)
    saved: list[tuple[int, int]] = field(default_factory=list)  # (pid, step)


def parse_glue_log(text: str) -> GlueLog:
    """The script's lines among whatever else the log holds (tracebacks, the loop's echoes);
    a line cut short by a kill matches nothing."""
    out = GlueLog()
    for line in text.splitlines():
        line = line.strip()
        if m := PROGRESS.match(line):
            out.last = (int(m[1]), int(m[2]), float(m[3]))
        elif m := RESUME.match(line):
            out.resumes.append((int(m[2]), int(m[1])))
            if int(m[3]):
                out.refills[int(m[2])] = int(m[3])
        elif m := SAVED.match(line):
            out.saved.append((int(m[2]), int(m[1])))
            out.stalls_ms.append(float(m[3]))
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]
