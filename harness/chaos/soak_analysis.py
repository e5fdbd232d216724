"""The soak's judgement: what must hold after each fault (its kind's invariants and the
events it must have made, per soak_kinds.KINDS) and after the whole run (nothing lost: every
game done at total_steps, one worker per game and one supervisor at a time, no verified
checkpoint quarantined or deleted but by retention, a sound database); then the figures.

`EventLog` answers the event questions for one fault. `Analyst` is a mixin of
`soak_engine.Soak`, reading what the monitor saw and what the injector did.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import sqlite3
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from checkpoints import CheckpointError, CheckpointRef, CheckpointStore
from checkpoints.names import CORRUPT_PREFIX, ckpt_name, corrupt_step
from harness.chaos.soak_config import LIGHT_ENVS, MEDIUM_ENVS, SoakSettings
from harness.chaos.soak_faults import Fault
from harness.chaos.soak_monitor import Monitor, WorkerLife


class KindRules(Protocol):
    """What the analysis asks of a fault kind (soak_kinds.FaultKind answers it; named here so
    the table imports the analysis, never the other way round)."""

    invariants: Callable[[Analyst, Fault], None]
    expect: Callable[[EventLog], list[tuple[str, bool]]]
    forbid: tuple[str, ...]


Event = dict[str, Any]


class EventLog:
    """The state database's events, asked about one fault."""

    def __init__(self, events: list[Event], fault: Fault, since: float) -> None:
        self.events, self.fault, self.since = events, fault, since
        self.game = fault.games[0] if fault.games else None

    def has(self, kind: str, game: str | None, pred: Callable[[Event], bool] | None = None) -> bool:
        """An event of `kind` (of `game`; None: any) since the fault that satisfies `pred`."""
        return any(
            e["kind"] == kind
            and e["ts"] >= self.since
            and (game is None or e["game"] == game)
            and (pred is None or pred(e))
            for e in self.events
        )

    def during(self, kinds: tuple[str, ...]) -> list[str]:
        """Events of these kinds written while the fault lasted (by id: a clock step makes
        their times useless for this)."""
        lo, hi = self.fault.event_ids or (0, 0)
        return [f"{e['kind']} {e['game']}" for e in self.events if lo < e["id"] <= hi
                and e["kind"] in kinds]  # fmt: skip

    def exits_of(self, pid: int | None) -> list[Event]:
        return [
            e for e in self.events if e["kind"] == "worker_exit" and e["detail"].get("pid") == pid
        ]

    def crash_of_victim(self, kinds: tuple[str, ...]) -> bool:
        """The victim's worker_exit (by pid) with SIGKILL, then its crash event."""
        f, g = self.fault, self.game
        vpid = f.victims.get(g or "")
        exits = self.exits_of(vpid)
        if not exits:  # a leftover of a killed supervisor: its successor stopped it
            return any(
                vpid in (e["detail"].get("leftover_workers_stopped") or [])
                for e in self.events
                if e["kind"] == "supervisor_start"
            )
        ex = exits[0]
        mode_change = ex["detail"].get("returncode") == 75 and any(
            e["kind"] in ("scale_down", "scale_up") and abs(e["ts"] - ex["ts"]) < 15
            for e in self.events
        )
        if mode_change:
            # The policy restarted it at another mode (exit 75, checkpointed) just as the
            # fault struck: an overlap the schedule cannot avoid, recorded, not a failure.
            f.note += " (overlapped by a policy mode change: the victim exited 75)"
            return True
        if ex["detail"].get("returncode") != -9:
            f.problems.append(f"victim pid {vpid} exited {ex['detail'].get('returncode')}")
        if ex["detail"].get("from") == "stopping":
            return True  # already being stopped (hang, mode change): the exit records it
        return any(
            e["kind"] in kinds and e["game"] == g and ex["id"] < e["id"] <= ex["id"] + 3
            for e in self.events
        )

    def damaged(self, when: str) -> Callable[[Event], bool]:
        """A replay_damaged event's test: found `when`, naming the chunk file the soak flipped."""
        return lambda e: (
            e["detail"].get("when") == when
            and self.fault.damaged_file in (e["detail"].get("files") or [])
        )

    def storm_crashes(self) -> bool:
        """Every storm victim exited by its signal, and each exit made a worker_crash."""
        for pid, sig in self.fault.storm.items():
            exits = self.exits_of(pid)
            if not exits or exits[0]["detail"].get("returncode") != -sig:
                self.fault.problems.append(
                    f"storm victim pid {pid}: exit {exits[:1]} (want -{sig})"
                )
                return False
            if not any(
                e["kind"] == "worker_crash" and exits[0]["id"] < e["id"] <= exits[0]["id"] + 3
                for e in self.events
            ):
                return False
        return True


class Analyst:
    """Invariants and figures over what the run saw."""

    # Provided by soak_engine.Soak.
    s: SoakSettings
    dir: Path
    state: Path
    monitor: Monitor
    faults: list[Fault]
    kinds: Mapping[str, KindRules]
    corrupted: dict[str, set[int]]
    sup: subprocess.Popen[bytes] | None
    sups: list[tuple[subprocess.Popen[bytes], bool]]
    final_rc: int | None
    skipped: dict[str, str]
    game_names: list[str]
    wall_s: float
    t0: float

    if TYPE_CHECKING:  # the engine's own

        def _done(self, game: str) -> bool: ...

    def events(self) -> list[dict[str, Any]]:
        conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute("SELECT * FROM events ORDER BY id").fetchall()
        finally:
            conn.close()
        return [dict(r) | {"detail": json.loads(r["detail"] or "{}")} for r in rows]

    def analyse(self) -> None:
        """Each fault against its kind's invariants and expected events (soak_kinds.KINDS)."""
        events = self.events()
        mono_to_wall = time.time() - time.monotonic()
        for f in self.faults:
            if f.skipped:
                f.survived = False
                continue
            kind = self.kinds[f.kind]
            kind.invariants(self, f)
            log = EventLog(events, f, since=f.t + mono_to_wall - 2.0)  # wall clock, with slop
            for what, ok in kind.expect(log):
                if not ok:
                    f.problems.append(f"no {what} event for {f.kind} on {log.game}")
            if bad := log.during(kind.forbid):
                f.problems.append(f"during the fault: {bad}")
            f.survived = not f.problems

    def _replacement(self, game: str, f: Fault) -> WorkerLife | None:
        victim = f.victims.get(game)
        for life in self.monitor.lives_of(game):
            if (
                life.first_seen > f.t
                and life.pid != victim
                and life.pid not in f.storm  # killed right after its resume by the storm
                and life.pid != f.reporter  # stopped as a leftover once it reported
                and life.pid != f.spare_pid  # the spare killed as it took over: the fault
                and life.first_step is not None
                and not self._cut_short(life, f)
            ):
                return life
        return None

    def _cut_short(self, life: WorkerLife, f: Fault) -> bool:
        """A replacement that never moved a step because a later fault ended it first (a
        supervisor kill stops it as a leftover while it still loads): it trained nothing, so
        nothing it could lose; the game's next worker is the one judged."""
        if life.moving_at is not None:
            return False
        return any(
            g is not f and not g.skipped and life.first_seen <= g.t <= life.last_seen + 1.0
            for g in self.faults
        )

    def _interval_steps(self, game: str, victim: WorkerLife | None, t_fault: float = 0.0) -> int:
        """One checkpoint interval in steps, as the victim trained: the largest gap between its
        consecutive commits, or what it trained in the last interval before the fault (plus
        the heartbeat's one-second granularity) when its rate was higher then."""
        if victim is None:
            return 0
        recent = 0
        since = t_fault - self.s.checkpoint_every_s - 1.0
        before = [st for t, st in victim.steps if t <= since]
        if before:
            recent = victim.max_step - before[-1]
        steps = [
            s
            for s in self.monitor.committed_steps(game)
            if victim.first_step is not None and s > victim.first_step and s <= victim.max_step
        ]
        gaps = [b - a for a, b in itertools.pairwise(steps)]
        # What it trains in one interval at its own rate: the interval is seconds, and a life
        # seen for a moment (a replacement killed two seconds in) shows one short gap between
        # two commits, far below it (CI: 256 steps allowed where 1.5 s trained 6k).
        pts = victim.steps
        timed = 0
        if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
            sps = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
            timed = int(sps * self.s.checkpoint_every_s)
        if gaps:
            return max(*gaps, recent, timed)
        # fewer than two commits: what it trained in one interval (twice: no gap to go by)
        return max(recent, 2 * timed)

    def recovered(self, f: Fault) -> None:
        """Every victim's game trains again in a replacement that resumed from the newest
        checkpoint committed before the fault (or the one before a corrupted newest), redoing
        at most one checkpoint interval and one iteration; the recovery time and redone steps
        are the figures."""
        recoveries: list[float] = []
        redone_total = 0
        for game, vpid in f.victims.items():
            gdef = next(g for g in self.s.games if g.name == game)
            victim = self.monitor.lives.get((game, vpid))
            rep = self._replacement(game, f)
            if rep is None:
                if self._done(game) and any(
                    life.max_step >= gdef.total_steps
                    for life in [victim, *self.monitor.lives_of(game)]
                    if life is not None and (life is victim or life.first_seen > f.t)
                ):
                    continue  # the victim, or a life seen only as it ended, finished
                f.problems.append(f"{game}: no replacement worker ever trained after {f.kind}")
                continue
            loader = self.monitor.lives.get((game, f.reporter or 0)) or rep
            if f.damaged_file is not None and not any(
                d.get("when") == "load" and f.damaged_file in (d.get("files") or [])
                for d in loader.replay_damage
            ):
                f.problems.append(
                    f"{game}: heartbeat replay_damage={loader.replay_damage} does not report "
                    f"{f.damaged_file} dropped at load"
                )
            if rep.moving_at is not None:
                recoveries.append(rep.moving_at - (f.t_storm_end or f.t))
            elif not (rep.first_step is not None and rep.first_step >= gdef.total_steps):
                f.problems.append(f"{game}: replacement pid {rep.pid} never moved global_step")
            resumed = rep.resumed_from_step
            # Committed before the replacement started, or before the fault when it is a
            # spare (its process started long before; it loads when it takes over).
            before = self.monitor.committed_steps(game, before=max(rep.started, f.t))
            valid_before = [s for s in before if s not in self.corrupted[game]]
            committed = valid_before[-1] if valid_before else None
            if game in f.expect_resume:
                want = f.expect_resume[game]
                if resumed != want:
                    f.problems.append(
                        f"{game}: after corrupting ckpt {f.corrupted[game]} the worker resumed "
                        f"from {resumed}, expected the previous checkpoint {want}"
                    )
                corrupt = ckpt_name(f.corrupted[game])
                if not any(corrupt in q for q in rep.quarantined):
                    f.problems.append(
                        f"{game}: heartbeat quarantined={rep.quarantined} does not report {corrupt}"
                    )
                if not any(
                    n.startswith(f"{CORRUPT_PREFIX}{corrupt}")
                    for n in self.monitor.corrupt_dirs[game]
                ):
                    f.problems.append(f"{game}: no {CORRUPT_PREFIX}{corrupt}* dir")
            elif committed is not None and (resumed is None or resumed < committed):
                f.problems.append(
                    f"{game}: resumed from {resumed} but checkpoint {committed} was committed "
                    f"before the fault"
                )
            if resumed is not None and resumed not in self.monitor.committed_steps(game):
                f.problems.append(f"{game}: resumed from step {resumed}, never a committed ckpt")
            if victim is not None and resumed is not None:
                redone = max(0, victim.max_step - resumed)
                redone_total += redone
                interval = self._interval_steps(game, victim, f.t)
                iteration = gdef.iteration_steps(max(victim.num_envs, 1))
                allowed = interval + iteration
                why = f"one checkpoint interval ({interval}) + one iteration ({iteration})"
                if game in f.expect_resume:  # the corrupt one is lost too
                    lost = f.corrupted[game] - f.expect_resume[game]
                    allowed += lost
                    why += f" + the corrupted checkpoint's interval ({lost})"
                if game in f.inflight_from:  # killed mid-write: the steps since its capture
                    inflight = max(0, victim.max_step - f.inflight_from[game]) + iteration
                    allowed += inflight
                    why += f" + trained during the interrupted write (<= {inflight})"
                if interval and redone > allowed:
                    f.problems.append(
                        f"{game}: redid {redone} steps after {f.kind}; allowed {why}; "
                        + self._lives_told(game, f, victim, rep)
                    )
        f.recovery_s = max(recoveries) if recoveries else None
        f.redone_steps = redone_total

    def _lives_told(self, game: str, f: Fault, victim: WorkerLife, rep: WorkerLife) -> str:
        """What a redo violation needs to be read from a CI log alone: both lives, the
        commits seen around them (with when the monitor first saw each, relative to the
        fault) and what the replacement quarantined or dropped."""
        commits = ", ".join(
            f"{s}@{t - f.t:+.1f}s"
            for s, t in sorted(self.monitor.committed[game].items())
            if victim.first_seen - 5 <= t <= (rep.first_seen + 2)
        )
        return (
            f"victim pid {victim.pid} (first seen {victim.first_seen - f.t:+.1f}s, steps "
            f"{victim.first_step}..{victim.max_step}, resumed from {victim.resumed_from_step}, "
            f"{victim.checkpoint_failures} checkpoint failures); "
            f"replacement pid {rep.pid} (process start {rep.started - f.t:+.1f}s, first seen "
            f"{rep.first_seen - f.t:+.1f}s, resumed from {rep.resumed_from_step}, quarantined "
            f"{rep.quarantined}, replay damage {rep.replay_damage}); commits seen: {commits}"
        )

    def scaled(self, f: Fault) -> None:
        """`recovered`, at the sizes of the mode the operator asked for (`auto`: the policy's)."""
        self.recovered(f)
        for game in f.victims:
            rep = self._replacement(game, f)
            if rep is None:
                continue
            want = LIGHT_ENVS if f.kind == "scale_light" else f.auto_envs.get(game, MEDIUM_ENVS)
            if rep.num_envs != want:
                f.problems.append(f"{game}: num_envs {rep.num_envs} after {f.kind}, want {want}")

    def disk_survived(self, f: Fault) -> None:
        """Training went on while its checkpoint disk was full, nothing was committed on it,
        the heartbeat counted the failures, and a checkpoint followed once space returned."""
        game = f.games[0]
        life = self.monitor.lives.get((game, f.victims[game]))
        end = f.t_end or f.t
        if life is None:
            f.problems.append(f"{game}: no worker during disk_full")
            return
        if life.checkpoint_failures < 1:
            f.problems.append(f"{game}: heartbeat checkpoint_failures stayed 0 on a full disk")
        moved = [s for t, s in life.steps if f.t <= t <= end]
        total = next(g.total_steps for g in self.s.games if g.name == game)
        if len(moved) < 2 and life.max_step < total:  # a game that finished has nothing to do
            f.problems.append(f"{game}: training did not go on while the disk was full")
        after = sorted(t for s, t in self.monitor.committed[game].items() if t > end)
        if after:
            f.recovery_s = after[0] - end
        elif not self._done(game):
            f.problems.append(f"{game}: no checkpoint committed after space returned")
        f.redone_steps = 0

    # ---- invariants ----
    def check(self) -> list[str]:
        """Every invariant as (message) for each violation; empty = nothing lost."""
        self.analyse()
        out: list[str] = []
        n = self.injected()
        if n < self.s.min_faults:
            out.append(f"only {n} faults injected (at least {self.s.min_faults} planned)")
        for f in self.faults:
            out += [f"fault [{f.n}] {f.kind} at t={f.t - self.t0:.0f}s: {p}" for p in f.problems]
        if self.final_rc != 0:
            out.append(f"the last `rlsup run --exit-when-done` exited {self.final_rc} (want 0)")
        for proc, killed in self.sups:
            rc = proc.poll()
            if not killed and rc not in (0, None) and proc is not self.sup:
                out.append(f"supervisor pid {proc.pid} crashed with {rc} (not killed by the soak)")
        crashes = self._log_count("tick_failed")
        if crashes:
            out.append(f"the supervisor logged {crashes} tick_failed exceptions")
        conn = sqlite3.connect(self.state / "rlsup.db", timeout=10)
        try:
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            rows = {
                r[0]: (r[1], r[2]) for r in conn.execute("SELECT game, state, reason FROM workers")
            }
        finally:
            conn.close()
        if integrity != "ok":
            out.append(f"PRAGMA integrity_check: {integrity}")
        for g in self.s.games:
            state, reason = rows.get(g.name, ("missing", ""))
            steps = self.monitor.committed_steps(g.name)
            if state != "done":
                out.append(f"{g.name}: state {state} ({reason}), want done")
            if not steps or steps[-1] < g.total_steps:
                out.append(
                    f"{g.name}: newest checkpoint {steps[-1] if steps else None} "
                    f"< total_steps {g.total_steps}"
                )
        for name, most in self.monitor.most_workers.items():
            if most > 1:
                out.append(f"{name}: {most} live workers at once: {self.monitor.duplicates[:3]}")
        if self.monitor.most_supervisors > 1:
            out.append(f"{self.monitor.most_supervisors} supervisors alive at once")
        counts, pids = self.monitor.worker_processes()
        if counts:
            out.append(f"worker processes left running after the end: {pids}")
        left = {g: found for g, found in self.monitor.wrapper_children().items() if found}
        if left:
            out.append(f"a wrapped game's children left running after the end: {left}")
        out += [
            f"a wrapped game's child outlived its life: {d}"
            for d in self.monitor.leaked_children[:3]
        ]
        out += self._verified_checkpoints_kept()
        return out

    def injected(self) -> int:
        return sum(1 for f in self.faults if not f.skipped)

    def _verified_checkpoints_kept(self) -> list[str]:
        """No checkpoint whose bytes verify is ever quarantined, or deleted but by retention
        behind `keep` (3) newer ones."""
        out = []
        for g in self.game_names:
            root = self.monitor.run_dir(g) / "checkpoints"
            store = CheckpointStore(root)
            for path in sorted(root.glob(f"{CORRUPT_PREFIX}ckpt-*")):
                ref = CheckpointRef(path, corrupt_step(path.name) or 0)
                with contextlib.suppress(CheckpointError):
                    store.verify(ref)
                    out.append(f"{g}: {path.name} was quarantined, yet every byte verifies")
            final = self.monitor.present[g]
            seen = self.monitor.committed[g]
            gone = dict(self.monitor.deleted[g])
            for step, t in self.monitor.deleted[g]:
                # Newer checkpoints committed by then (a listing that raced a rename may have
                # missed one: seen within a second) and not themselves gone before it.
                newer = [
                    s for s, first in seen.items()
                    if s > step and first <= t + 1.0 and gone.get(s, math.inf) >= t
                ]  # fmt: skip
                if step not in final and len(newer) < 3:
                    out.append(f"{g}: {ckpt_name(step)} deleted with only {sorted(newer)} newer")
        return out

    def _log_count(self, word: str) -> int:
        try:
            return (self.dir / "supervisor.log").read_text(errors="replace").count(word)
        except OSError:
            return 0

    # ---- figures ----
    def figures(self) -> dict[str, Any]:
        kinds: dict[str, dict[str, Any]] = {}
        for f in self.faults:
            k = kinds.setdefault(
                f.kind, {"injected": 0, "survived": 0, "skipped": 0, "recovery_s": [], "redone": 0}
            )
            if f.skipped:
                k["skipped"] += 1
                continue
            k["injected"] += 1
            k["survived"] += int(f.survived)
            if f.recovery_s is not None:
                k["recovery_s"].append(f.recovery_s)
            k["redone"] += f.redone_steps or 0
        table = {}
        for kind, k in sorted(kinds.items()):
            rec = k.pop("recovery_s")
            table[kind] = {
                **k,
                "recovery_median_s": round(statistics.median(rec), 2) if rec else None,
                "recovery_worst_s": round(max(rec), 2) if rec else None,
            }
        all_rec = [f.recovery_s for f in self.faults if f.recovery_s is not None and not f.skipped]
        return {
            "soak": "rlsup",
            "seed": self.s.seed,
            "faults": sum(k["injected"] for k in table.values()),
            "survived": sum(k["survived"] for k in table.values()),
            "recovery_median_s": round(statistics.median(all_rec), 2) if all_rec else None,
            "recovery_worst_s": round(max(all_rec), 2) if all_rec else None,
            "redone_steps": sum(k["redone"] for k in table.values()),
            "wall_s": round(self.wall_s, 1),
            "monitor_samples": self.monitor.samples,
            "games": {g.name: g.total_steps for g in self.s.games},
            "skipped": self.skipped,
            "by_kind": table,
        }

    def report(self) -> str:
        fig = self.figures()
        lines = [
            f"{'fault':18s} {'injected':>8s} {'survived':>8s} {'skipped':>7s} "
            f"{'rec med s':>9s} {'rec worst s':>11s} {'redone steps':>12s}"
        ]
        for kind, k in fig["by_kind"].items():
            lines.append(
                f"{kind:18s} {k['injected']:8d} {k['survived']:8d} {k['skipped']:7d} "
                f"{_fmt(k['recovery_median_s']):>9s} {_fmt(k['recovery_worst_s']):>11s} "
                f"{k['redone']:12d}"
            )
        lines.append(
            f"{'TOTAL':18s} {fig['faults']:8d} {fig['survived']:8d} {'':7s} "
            f"{_fmt(fig['recovery_median_s']):>9s} {_fmt(fig['recovery_worst_s']):>11s} "
            f"{fig['redone_steps']:12d}"
        )
        lines.append(f"wall time {fig['wall_s']} s; skipped: {fig['skipped'] or 'none'}")
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
