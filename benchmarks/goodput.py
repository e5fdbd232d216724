"""Goodput under the same seeded faults: rlsup against the glue people run (issue 44, part 1).

    .venv/bin/python benchmarks/goodput.py [--quick] [--seed 1] [--fault-every-s 30]

Goodput is the share of the host's up-time that ends as training that counts: the useful agent
steps at the end (the final run's step: steps redone after a resume count once; steps spent
refilling a replay buffer that was not saved count none) against the steps the same learner
makes uninterrupted in the same up-time, measured in the same run (a fault-free baseline).

Contenders, each run for the same wall time under the same fault schedule (drawn from --seed):

  (a) rlsup, built-in learners: a PPO game and a DQN game (replay buffer 10k) in one `rlsup run`;
  (b) rlsup supervising examples/cleanrl_dqn.py (CleanRL-style DQN, through the SDK);
  (c) the seeds' glue (benchmarks/goodput_glue.sh seeds): a `while` restart loop started at
      boot, a watchdog killing the script once its log went quiet, the script's own torch.save
      every N seconds, the replay buffer not saved; the script: benchmarks/goodput_script.py,
      the same DQN as (b) (its network, buffer and update imported from the example);
  (d) the same script under systemd's Restart=always (emulated: restarted 100 ms after any
      exit; no watchdog) with SB3-style periodic checkpoints that include the replay buffer.

CartPole-v1 for both games: on this machine's 2 shared cores an Atari PPO learner would spend
most of a minute-long window starting up, and every contender runs its own window here.

Faults (every `--fault-every-s`, jittered, kinds in a seeded order): an unannounced host reboot
(every process SIGKILLed, a new boot id, the service started again `--boot-delay-s` later), a
worker crash (the training process SIGKILLed), a hang (SIGSTOP), and an announced reboot (a GCE
preemption notice on a loopback metadata service, harness/fake_metadata.py; the kill at its
deadline `--window-s` later; only rlsup watches for it). An OOM kill is not in the schedule.

The rate is compressed: one fault per --fault-every-s instead of the seeds' one per 20 min, a
factor C = 1200 / fault-every-s; every *policy* interval is compressed by the same C
(checkpoint intervals of 300 s, the documented or seeds' default of every contender; rlsup's
hang timeout of 120 s, at least 5 s; the glue watchdog's 5-minute period and silence), while
what a restart costs (processes, imports, checkpoint reads) is real. The loss per fault is read
off each contender's progress trace (heartbeat.json for rlsup, the log for the glue) and, for
(a)/(b), set beside rlsup's own ledger (`rlsup report --json`). The extrapolation to one fault
per 20 minutes takes the measured fixed costs per fault and half the real checkpoint interval
as redone work (goodput_model.extrapolate): it is an extrapolation, and the output says so.

Prints the table and writes benchmarks/results/goodput-<cpu>-<date>.json (with the CPU model).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BENCH = Path(__file__).resolve().parent

import goodput_model as gm  # noqa: E402
from hostinfo import host_facts, host_line  # noqa: E402

from harness.fake_metadata import FakeMetadata  # noqa: E402
from training.protocol import DEFAULT_CHECKPOINT_EVERY_S  # noqa: E402

# Each contender's documented default checkpoint interval: rlsup's checkpoint_every_s (also
# what it sets for a script through the SDK), and the seeds' and SB3-style's 300 s; the second
# extrapolation takes SAME_INTERVAL_S for all, to show what the machinery buys at equal intervals.
RLSUP_INTERVAL_S = DEFAULT_CHECKPOINT_EVERY_S
REAL_INTERVAL_S = 300.0  # the seeds' glue's and the SB3-style checkpoints' here
SAME_INTERVAL_S = REAL_INTERVAL_S
REAL_HANG_S = 120.0  # rlsup's [watchdog] hang_timeout_s default
REAL_WATCHDOG_S = 300.0  # the seeds' watchdog: "checks every 5 minutes"
DQN_ARGS = {"buffer_size": 10_000, "learning_starts": 1_000}
TOTAL = 100_000_000  # none may finish inside the window


@dataclass
class Settings:
    seed: int
    every_s: float
    faults: int
    warmup_s: float
    tail_s: float
    boot_delay_s: float
    window_s: float
    final_lead_s: float

    @property
    def compression(self) -> float:
        return gm.REAL_MTBF_S / self.every_s

    @property
    def wall_s(self) -> float:
        return self.warmup_s + self.faults * self.every_s + self.tail_s

    @property
    def interval_s(self) -> float:
        """The glue's and SB3-style's interval, compressed."""
        return max(1.0, REAL_INTERVAL_S / self.compression)

    @property
    def rlsup_interval_s(self) -> float:
        """rlsup's default interval, compressed (never below a second)."""
        return max(1.0, RLSUP_INTERVAL_S / self.compression)

    @property
    def hang_s(self) -> float:
        return max(5.0, REAL_HANG_S / self.compression)

    @property
    def watchdog_s(self) -> int:
        return max(2, round(REAL_WATCHDOG_S / self.compression))

    @property
    def quiet_s(self) -> int:
        """The glue watchdog's silence threshold: compressed, but never below a restart's
        start-up on a loaded 2-core machine (up to ~15 s here: a real glue's 5 minutes never
        kills a script that is still importing torch, 10 s did)."""
        return max(20, round(REAL_WATCHDOG_S / self.compression))


def now_epoch_offset(t0_mono: float) -> float:
    """The Unix time at the trace's zero."""
    return time.time() - (time.monotonic() - t0_mono)


@dataclass
class Game:
    name: str
    run_dir: Path
    trace: list[gm.Sample] = field(default_factory=list)
    faults: list[gm.Fault] = field(default_factory=list)
    stopped: set[int] = field(default_factory=set)


class Contender:
    """A service on a host that reboots: boot() starts it, take_machine() is the host going."""

    label = ""
    watches_notices = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self.games: list[Game] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.boot_n = 0
        root.mkdir(parents=True, exist_ok=True)
        (root / "boot_id").write_text("boot-0\n")

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(REPO),
               "RLSUP_BOOT_ID_PATH": str(self.root / "boot_id")}  # fmt: skip
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "RLSUP_CONFIG"):
            env.pop(key, None)
        return env

    def argv(self) -> list[str]:
        raise NotImplementedError

    def boot(self) -> None:
        log = (self.root / "service.log").open("ab")
        self.proc = subprocess.Popen(self.argv(), env=self.env(), cwd=REPO, stdout=log,
                                     stderr=log, start_new_session=True)  # fmt: skip
        log.close()

    def take_machine(self) -> None:
        """Every process of the service SIGKILLed at once (its descendants in any session)."""
        if self.proc is None:
            return
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        self.proc.wait(10)
        psutil.wait_procs(procs, timeout=10)
        self.proc = None
        self.boot_n += 1
        (self.root / "boot_id").write_text(f"boot-{self.boot_n}\n")

    def probe(self, game: Game) -> tuple[int, int] | None:
        """(pid, step) of the process training the game now, None when none reports."""
        raise NotImplementedError

    def committed(self, game: Game) -> int:
        raise NotImplementedError

    def notice(self, window_s: float) -> None:
        """A preemption notice: only a contender that watches for one sees it."""

    def calm(self) -> None:
        """The new machine has no notice."""

    def refills(self, game: Game) -> dict[int, int]:
        return {}

    def stalls_ms(self, game: Game) -> list[float]:
        return []

    def close(self) -> None:
        self.take_machine()


class Rlsup(Contender):
    watches_notices = True

    def __init__(
        self, root: Path, s: Settings, games: dict[str, str], faults: bool,
        interval_s: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__(root)
        self.meta = FakeMetadata("gcp")
        self.closed = False
        every = s.rlsup_interval_s if interval_s is None else interval_s
        cfg = (
            f'state_dir = "state"\ncheckpoint_every_s = {every:g}\nstop_grace_s = 10\n'
            # The compressed interval stands for the policy's; Young's rule on the real MTBF
            # is applied in the extrapolation (gm.adaptive_interval).
            "adaptive_checkpoints = false\n"
            "[modes.light]\nnum_envs = 4\nbatch_size = 128\nn_steps = 64\n"
            f"max_concurrent = {len(games)}\n" + "".join(games.values())
            + "[restart]\nbackoff_base_s = 1\nbackoff_max_s = 10\nbudget = 1000\n"
            f"[watchdog]\nhang_timeout_s = {s.hang_s:g}\n"
            f'[preemption]\nprovider = "{"gcp" if faults else "none"}"\n'
            f'endpoint = "{self.meta.url}"\npoll_s = 1\nfinal_checkpoint_s = {s.final_lead_s:g}\n'
        )  # fmt: skip
        self.config = root / "rlsup.toml"
        self.config.write_text(cfg)
        self.games = [Game(n, root / "state" / "runs" / n) for n in games]

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "supervisor.cli", "run", "--config", str(self.config)]

    def probe(self, game: Game) -> tuple[int, int] | None:
        try:
            hb = json.loads((game.run_dir / "heartbeat.json").read_text())
        except (OSError, ValueError):
            return None
        if hb.get("phase") != "training" or not hb.get("pid"):
            return None
        return int(hb["pid"]), int(hb.get("global_step") or 0)

    def committed(self, game: Game) -> int:
        ckpts = game.run_dir / "checkpoints"
        steps = [int(p.name[5:]) for p in (ckpts.iterdir() if ckpts.is_dir() else [])
                 if p.name.startswith("ckpt-") and (p / "MANIFEST.json").exists()]  # fmt: skip
        return max(steps, default=-1)

    def notice(self, window_s: float) -> None:
        self.meta.post_notice(window_s)

    def calm(self) -> None:
        self.meta.mode = "calm"

    def report(self) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "supervisor.cli", "report", "--json", "--config",
             str(self.config)], env=self.env(), cwd=REPO, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        try:
            doc = json.loads(out.stdout)
        except ValueError:
            return {"error": out.stderr[-500:]}
        return {"totals": doc.get("totals"), "host": doc.get("host"),
                "games": {g["name"]: g for g in doc.get("games") or []}}  # fmt: skip

    def close(self) -> None:
        super().close()
        if not self.closed:
            self.closed = True
            self.meta.close()


def builtin_games() -> dict[str, str]:
    dqn_args = ", ".join(f"{k} = {v}" for k, v in DQN_ARGS.items())
    return {
        name: f'[[games]]\nname = "{name}"\nenv_id = "CartPole-v1"\nalgo = "{algo}"\n'
        f'total_steps = {TOTAL}\nseed = 1\ndevice = "cpu"\nargs = {{ eval_episodes = 0{extra} }}\n'
        for name, algo, extra in (("ppo", "ppo", ""), ("dqn", "dqn", f", {dqn_args}"))
    }


def sdk_game() -> dict[str, str]:
    return {"cleanrl-dqn": (
        f'[[games]]\nname = "cleanrl-dqn"\ncommand = ["{sys.executable}", '
        f'"{REPO / "examples" / "cleanrl_dqn.py"}", "--buffer-size", "{DQN_ARGS["buffer_size"]}",'
        f' "--learning-starts", "{DQN_ARGS["learning_starts"]}"]\ncwd = "{REPO}"\n'
        f'heartbeat = true\ntotal_steps = {TOTAL}\nseed = 1\ndevice = "cpu"\n'
    )}  # fmt: skip


class Glue(Contender):
    """(c) the seeds' glue, (d) restart-always with SB3-style checkpoints, or the script alone
    (mode None: the fault-free baseline, no checkpoints)."""

    def __init__(self, root: Path, s: Settings, mode: str | None) -> None:
        super().__init__(root)
        self.mode, self.s = mode, s
        self.games = [Game("cleanrl-dqn", root / "run")]
        self._offset = 0

    def script(self) -> list[str]:
        save = self.s.interval_s if self.mode else 0
        run_dir = str(self.games[0].run_dir)
        argv = [sys.executable, str(BENCH / "goodput_script.py"), "--dir", run_dir,
                "--total-steps", str(TOTAL), "--save-every-s", f"{save:g}",
                "--buffer-size", str(DQN_ARGS["buffer_size"]),
                "--learning-starts", str(DQN_ARGS["learning_starts"])]  # fmt: skip
        return argv + (["--save-replay"] if self.mode == "restart-always" else [])

    def argv(self) -> list[str]:
        if self.mode is None:
            return ["bash", "-c", 'mkdir -p "$0" && exec "$@" >> "$0/train.log" 2>&1',
                    str(self.games[0].run_dir), *self.script()]  # fmt: skip
        return ["bash", str(BENCH / "goodput_glue.sh"), self.mode, str(self.games[0].run_dir),
                "--", *self.script()]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {**super().env(), "WATCHDOG_EVERY_S": str(self.s.watchdog_s),
                "QUIET_S": str(self.s.quiet_s)}  # fmt: skip

    def log(self) -> gm.GlueLog:
        try:
            return gm.parse_glue_log((self.games[0].run_dir / "train.log").read_text())
        except OSError:
            return gm.GlueLog()

    def probe(self, game: Game) -> tuple[int, int] | None:
        path = game.run_dir / "train.log"
        try:
            with path.open("rb") as f:
                f.seek(max(0, path.stat().st_size - 4096))
                tail = f.read().decode(errors="replace")
        except OSError:
            return None
        last = gm.parse_glue_log(tail.split("\n", 1)[-1]).last
        if last is None:
            return None
        step, pid, _ = last
        return pid, step

    def committed(self, game: Game) -> int:
        steps = [int(p.stem[len("checkpoint_step"):])
                 for p in game.run_dir.glob("checkpoint_step*.pt")]  # fmt: skip
        return max(steps, default=-1)

    def refills(self, game: Game) -> dict[int, int]:
        return self.log().refills

    def stalls_ms(self, game: Game) -> list[float]:
        return self.log().stalls_ms


def run_contender(
    c: Contender, base: Contender, s: Settings, schedule: list[tuple[float, str]]
) -> float:
    """Boot `c` and its fault-free baseline `base` side by side (the same wall time, the same
    load from whatever else runs on the machine), inject `schedule` into `c` alone, sample every
    game's progress; returns `c`'s host up-time."""
    events: list[tuple[float, str]] = []
    for t, kind in schedule:
        if kind == "announced_reboot":
            events.append((t - s.window_s, "notice"))
        events.append((t, kind))
    events.sort()
    t0 = time.monotonic()
    epoch0 = now_epoch_offset(t0)
    started: dict[int, float] = {}
    boot_at: float | None = None
    down_s = 0.0
    c.boot()
    base.boot()

    def sample(c: Contender, t: float) -> None:
        for g in c.games:
            got = c.probe(g)
            if got is None:
                continue
            pid, step = got
            if not psutil.pid_exists(pid):
                continue  # a dead process's last word: nothing trains now
            if pid not in started:
                try:
                    started[pid] = psutil.Process(pid).create_time() - epoch0
                except psutil.NoSuchProcess:
                    started[pid] = t
            g.trace.append(gm.Sample(round(t, 3), pid, step, round(started[pid], 3)))

    def hit(kind: str, t: float, boot_delay: float) -> None:
        for g in c.games:
            got = c.probe(g)
            alive = got is not None and psutil.pid_exists(got[0])
            g.faults.append(gm.Fault(
                kind, round(t, 3), victim=got[0] if alive and got else None,
                step=got[1] if alive and got else 0, committed=c.committed(g),
                boot_delay_s=boot_delay))  # fmt: skip

    while True:
        t = time.monotonic() - t0
        if t >= s.wall_s:
            break
        if boot_at is not None and t >= boot_at:
            boot_at = None
            c.calm()
            c.boot()
        while events and events[0][0] <= t:
            _, what = events.pop(0)
            if what == "notice":
                c.notice(s.window_s)
            elif what in gm.REBOOTS:
                if boot_at is not None:  # down already: the fault finds nothing to take
                    continue
                hit(what, t, s.boot_delay_s)
                c.take_machine()
                for g in c.games:
                    g.stopped.clear()
                boot_at = t + s.boot_delay_s
                down_s += s.boot_delay_s
            else:
                hit(what, t, 0.0)
                sig = signal.SIGKILL if what == "worker_crash" else signal.SIGSTOP
                for g in c.games:
                    victim = g.faults[-1].victim
                    if victim is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(victim, sig)
                        if sig == signal.SIGSTOP:
                            g.stopped.add(victim)
        sample(c, t)
        sample(base, t)
        for g in c.games:  # when each victim went: a hang's detection, a crash's reaping
            for f in g.faults:
                if f.gone_t is None and (f.victim is None or not alive(f.victim)):
                    f.gone_t = round(t, 3)
        time.sleep(0.2)
    if boot_at is not None:  # the run ends while the host is down: only the part that passed
        down_s -= max(0.0, boot_at - s.wall_s)
    return s.wall_s - down_s


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def training_now(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def extrapolation(
    losses: list[gm.FaultLoss],
    s: Settings,
    slowdown: float,
    rlsup: bool,
    interval_s: float | None = None,
) -> dict[str, Any]:
    """To one fault per 20 min (goodput_model.extrapolate): a hang's detection scaled back to
    rlsup's real hang timeout, or to the glue watchdog's real period and silence; redone work
    half of `interval_s` (default: the contender's own default interval)."""
    if interval_s is None:
        interval_s = RLSUP_INTERVAL_S if rlsup else REAL_INTERVAL_S
    hang_scale = (
        REAL_HANG_S / s.hang_s
        if rlsup
        else (REAL_WATCHDOG_S * 1.5) / (s.quiet_s + s.watchdog_s / 2)
    )
    ex = gm.extrapolate(losses, interval_s, slowdown, s.compression, hang_scale,
                        honours_notice=rlsup)  # fmt: skip
    return {"per_kind_lost_s": ex.per_kind_lost_s, "goodput": ex.goodput,
            "interval_s": ex.interval_s, "slowdown": ex.slowdown}  # fmt: skip


def reextrapolate(doc: dict[str, Any], s: Settings) -> None:
    """The extrapolations, from the measured per-fault losses and the steady slowdown: the one
    measured fault-free at the real interval (`doc["steady"]`, run_steady) where there is one,
    else the compressed run's scaled by the checkpoint rate (gm.steady_at_real_interval)."""
    names = {f.name for f in dataclasses.fields(gm.FaultLoss)}
    for r in doc["rows"]:
        losses = [gm.FaultLoss(**{k: v for k, v in f.items() if k in names}) for f in r["faults"]]
        rlsup = r["contender"] in "ab"
        compressed = r.get("steady_slowdown", r["slowdown"])  # older results: all of it
        windows = [w for w in doc.get("steady") or []
                   if w["contender"] == r["contender"] and w["game"] == r["game"]]  # fmt: skip
        run_every = s.rlsup_interval_s if rlsup else s.interval_s
        own = RLSUP_INTERVAL_S if rlsup else REAL_INTERVAL_S
        steady, source = gm.steady_at_real_interval(windows, compressed, run_every, own)
        interval = None
        if r["contender"] == "a" and (adapt := gm.adaptive_interval(windows, own)) is not None:
            # The default adaptive_checkpoints: the interval Young's rule gives at one failure
            # per 20 min for the cost the worker logged, and what checkpoints cost at it. The
            # fixed 15 s beside it, for what the rule buys.
            r["extrapolated_20min_fixed"] = extrapolation(losses, s, steady, rlsup)
            interval, steady = adapt
            source = (f"checkpoint pause + writer CPU by the worker's log, at the adaptive "
                      f"interval of {interval:.1f} s")  # fmt: skip
        r["steady_extrapolated"] = {"slowdown": round(steady, 4), "source": source}
        r["extrapolated_20min"] = ex = extrapolation(losses, s, steady, rlsup, interval)
        if (fixed := r.get("extrapolated_20min_fixed")) and "announced_reboot" in fixed["goodput"]:
            # A boot after a preemption notice is `preempted`, not an unexpected failure: the
            # ledger's MTBF does not count it, so where announced reboots are the faults the
            # interval stays checkpoint_every_s and checkpoints cost what they cost there.
            for key in ("goodput", "per_kind_lost_s"):
                ex[key]["announced_reboot"] = fixed[key]["announced_reboot"]
        # At 300 s rlsup's checkpoints cost less than at 15 s: kept as at 15 s (an upper bound).
        r["extrapolated_20min_same"] = extrapolation(losses, s, steady, rlsup, SAME_INTERVAL_S)


NEVER_S = 1e9  # a checkpoint interval no window reaches: the baseline without checkpoints
STEADY_SETTLE_S = 20.0  # from each one's first step: start-up, a replay buffer's first fill


def run_steady(s: Settings, only: set[str], seconds: float, repeats: int) -> list[dict[str, Any]]:
    """rlsup's steady cost at its real 15 s interval: each of (a) and (b) fault-free beside its
    baseline without checkpoints ((a): the same service with checkpoints never due; (b): the
    bare script) for `seconds`, `repeats` times; the slowdown over each window after
    STEADY_SETTLE_S (gm.steady_window). The glue's contenders are not run: their only cost
    beside the bare script is their checkpoints, every 300 s (scaled, reextrapolate)."""
    quiet = dataclasses.replace(s, faults=0, warmup_s=seconds, tail_s=0.0)
    pairs: dict[str, tuple[Callable[[Path], Contender], Callable[[Path], Contender]]] = {
        "a": (lambda r: Rlsup(r, s, builtin_games(), False, RLSUP_INTERVAL_S),
              lambda r: Rlsup(r, s, builtin_games(), False, NEVER_S)),
        "b": (lambda r: Rlsup(r, s, sdk_game(), False, RLSUP_INTERVAL_S),
              lambda r: Glue(r, s, None)),
    }  # fmt: skip
    out: list[dict[str, Any]] = []
    for key, (make, make_base) in pairs.items():
        if key not in only:
            continue
        for rep in range(repeats):
            with tempfile.TemporaryDirectory(prefix=f"goodput-steady-{key}-") as tmp:
                c, base = make(Path(tmp) / "run"), make_base(Path(tmp) / "base")
                try:
                    run_contender(c, base, quiet, [])
                finally:
                    c.close()
                    base.close()
                for g in c.games:
                    b = next((x for x in base.games if x.name == g.name), base.games[0])
                    w = gm.steady_window(g.trace, b.trace, STEADY_SETTLE_S)
                    if w is None:
                        continue
                    row: dict[str, Any] = {"contender": key, "game": g.name, "repeat": rep, **w}
                    if key == "a":  # the built-in worker logs each checkpoint's pause and CPU
                        with contextlib.suppress(OSError):
                            log = (c.root / "state" / "logs" / f"{g.name}.log").read_text()
                            if (cost := gm.checkpoint_cost(log)) is not None:
                                row["checkpoint_share"] = cost.pop("share")
                                row["checkpoint_cost"] = cost
                    out.append(row)
                    share = row.get("checkpoint_share")
                    print(f"  steady ({key}) {g.name} #{rep + 1}: {100 * w['slowdown']:+.1f}%"
                          f" ({w['sps']:.0f} vs {w['baseline_sps']:.0f} steps/s over "
                          f"{w['window_s']:.0f} s)" + ("" if share is None else
                          f"; its checkpoints' pause + writer CPU: {100 * share:.2f}%"),
                          flush=True)  # fmt: skip
    return out


def analyse(c: Contender, base: Game, g: Game, s: Settings, up_s: float) -> dict[str, Any]:
    sps = gm.speed(base.trace, skip_s=base.trace[0].t if base.trace else 0.0)
    refills = c.refills(g)
    last_alive = bool(g.trace) and training_now(g.trace[-1].pid)
    useful = gm.useful_steps(g.trace, refills) if last_alive else max(0, c.committed(g))
    expected = gm.steps_at(base.trace, up_s)
    losses = gm.fault_losses(g.trace, g.faults, sps, s.wall_s, refills)
    lost_steps = sum((x.lost_s) * sps for x in losses)
    slowdown = (expected - useful - lost_steps) / expected if expected else 0.0
    # Of that, the steady part (before any fault, against the baseline in the same window)
    # and the part that came with the faults (after_s each): only the first scales with time.
    first_t = g.faults[0].t if g.faults else s.wall_s
    steady = min(max(0.0, slowdown), gm.split_slowdown(g.trace, base.trace, first_t))
    if sps > 0:
        gm.share_residual(losses, (slowdown - steady) * expected / sps)
    stalls = c.stalls_ms(g)
    return {
        "game": g.name, "useful_steps": useful, "baseline_steps": expected,
        "baseline_sps": round(sps, 1), "up_s": round(up_s, 2),
        "goodput": gm.goodput(useful, expected), "slowdown": round(slowdown, 4),
        "steady_slowdown": round(steady, 4),
        "faults": [x.as_dict() for x in losses],
        "raw_faults": [vars(f) for f in g.faults],
        "checkpoint_stall_ms": {"n": len(stalls), "median": gm.percentile(stalls, 0.5),
                                "p99": gm.percentile(stalls, 0.99)} if stalls else None,
        "trace": [[x.t, x.pid, x.step] for x in g.trace[:: max(1, len(g.trace) // 200)]],
    }  # fmt: skip


def run_all(s: Settings, only: set[str]) -> dict[str, Any]:
    schedule = gm.draw_schedule(s.seed, s.every_s, s.faults, s.warmup_s,
                                announce_after_s=s.window_s + 5)  # fmt: skip
    print(f"schedule (seed {s.seed}): " + ", ".join(f"{k} at {t:.0f} s" for t, k in schedule),
          flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    contenders: list[tuple[str, Any, Any, str]] = [
        ("a", lambda r: Rlsup(r, s, builtin_games(), True),
         lambda r: Rlsup(r, s, builtin_games(), False), "rlsup, built-in learners"),
        ("b", lambda r: Rlsup(r, s, sdk_game(), True), lambda r: Glue(r, s, None),
         "rlsup + CleanRL-style script (SDK)"),
        ("c", lambda r: Glue(r, s, "seeds"), lambda r: Glue(r, s, None), "the seeds' glue"),
        ("d", lambda r: Glue(r, s, "restart-always"), lambda r: Glue(r, s, None),
         "Restart=always + SB3-style ckpts"),
    ]  # fmt: skip
    for key, make, make_base, label in contenders:
        if key not in only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"goodput-{key}-") as tmp:
            c, base = make(Path(tmp) / "run"), make_base(Path(tmp) / "base")
            t = time.monotonic()
            ledger = None
            try:
                up = run_contender(c, base, s, schedule)
                base.close()
                for g in c.games:
                    bgame = next((b for b in base.games if b.name == g.name), base.games[0])
                    row = {"contender": key, "label": label, **analyse(c, bgame, g, s, up)}
                    rows.append(row)
                ledger = c.report() if isinstance(c, Rlsup) else None
            finally:
                c.close()
                base.close()
            for row in rows:
                if row["contender"] == key and ledger is not None:
                    row["ledger"] = ledger.get("games", {}).get(row["game"])
            print(f"  ({key}) {label}: {time.monotonic() - t:.0f} s; " + ", ".join(
                f"{r['game']} {r['useful_steps']} of {r['baseline_steps']} steps"
                for r in rows if r["contender"] == key), flush=True)  # fmt: skip
    return {"schedule": schedule, "rows": rows}


KIND_SHORT = {"host_reboot": "reboot", "worker_crash": "crash", "hang": "hang",
              "announced_reboot": "announced"}  # fmt: skip


def render(doc: dict[str, Any], s: Settings) -> str:
    out = [
        f"goodput at the compressed rate: one fault per {s.every_s:g} s (C = {s.compression:.0f}"
        f" x the seeds' one per 20 min), {s.wall_s:.0f} s per contender, boot delay "
        f"{s.boot_delay_s:g} s (not up-time), checkpoint interval: rlsup {s.rlsup_interval_s:g} s "
        f"(its {RLSUP_INTERVAL_S:g} s default / C, at least 1 s), the others "
        f"{s.interval_s:g} s (= {REAL_INTERVAL_S:g} s / C)",
        f"{'contender':<38}{'game':<13}{'goodput':>8}{'useful':>9}{'baseline':>9}{'slowdown':>9}"
        f"{'steady':>8}",
    ]
    for r in doc["rows"]:
        gp = "-" if r["goodput"] is None else f"{100 * r['goodput']:.1f}%"
        out.append(f"({r['contender']}) {r['label']:<34}{r['game']:<13}{gp:>8}"
                   f"{r['useful_steps']:>9}{r['baseline_steps']:>9}"
                   f"{100 * r['slowdown']:>8.1f}%"
                   f"{100 * r.get('steady_slowdown', r['slowdown']):>7.1f}%")  # fmt: skip
    out.append("slowdown: the steps lost beyond the faults' own losses, as a share of the "
               "baseline's; steady: the part measured before the first fault, against the "
               "baseline in the same window (what is paid all the time); the rest came with "
               "the faults (+after below: slower training after a restart)")  # fmt: skip
    out.append("loss per fault, seconds of training = detect (a hang's) + restart (the victim "
               "gone or the service started -> a new process) + start (-> its first step) + "
               "redone + replay refill (+ after):")  # fmt: skip
    for r in doc["rows"]:
        parts = []
        for f in r["faults"]:
            tag = KIND_SHORT.get(f["kind"], f["kind"])
            if not f["recovered"]:
                parts.append(f"{tag} {f['lost_s']:.1f} (never recovered before the next fault)")
                continue
            parts.append(
                f"{tag} {f['lost_s']:.1f} = {f['detect_s']:.1f}+{f.get('restart_s', 0.0):.1f}"
                f"+{f['start_s']:.1f}+{f['redone_s']:.1f}+{f['refill_s']:.1f}"
                f" (+{f.get('after_s', 0.0):.1f})"
            )
        out.append(f"  ({r['contender']}) {r['game']:<12} " + "; ".join(parts))
    for r in doc["rows"]:
        if led := r.get("ledger"):
            out.append(
                f"  ({r['contender']}) {r['game']:<12} rlsup's own ledger (rlsup report --json): "
                f"training {led['training_s']:.1f} s, redone {led['redone_s']:.1f} s "
                f"({led['redone_steps']} steps), starting {led['starting_s']:.1f} s, backoff "
                f"{led['backoff_s']:.1f} s, down {led['down_s']:.1f} s (with the boot delays): "
                f"lost {led['lost_s']:.1f} s"
            )
    if doc.get("steady"):
        out.append(
            "steady slowdown at rlsup's real 15 s interval, fault-free beside a baseline "
            "without checkpoints (negative: the noise of two services sharing 2 cores):"
        )
        for w in doc["steady"]:
            cost = w.get("checkpoint_cost")
            out.append(f"  ({w['contender']}) {w['game']:<12} #{w['repeat'] + 1}: "
                       f"{100 * w['slowdown']:+.1f}% ({w['sps']:.0f} vs {w['baseline_sps']:.0f} "
                       f"steps/s over {w['window_s']:.0f} s)" + ("" if cost is None else
                       f"; {cost['n']} checkpoints every {cost['interval_s']:.1f} s, pause + "
                       f"writer CPU {cost['cost_ms_mean']:.0f} ms each (at most "
                       f"{cost['cost_ms_max']:.0f}): {100 * w['checkpoint_share']:.2f}%")
                       )  # fmt: skip
    out.append("steady slowdown the extrapolation takes: " + "; ".join(
        f"({r['contender']}) {r['game']} {100 * r['steady_extrapolated']['slowdown']:.2f}% "
        f"({r['steady_extrapolated']['source']})" for r in doc["rows"]
        if "steady_extrapolated" in r))  # fmt: skip
    adaptive = sorted({f"{r['extrapolated_20min']['interval_s']:.1f}" for r in doc["rows"]
                       if "extrapolated_20min_fixed" in r})  # fmt: skip
    rule = f"Young's rule at 20 min: {', '.join(adaptive)} s" if adaptive else "no cost logged"
    for key, what in (
        ("extrapolated_20min", f"each contender's default interval (rlsup's adaptive, {rule}; "
         f"{RLSUP_INTERVAL_S:g} s where the faults are announced reboots, which its MTBF does "
         f"not count; its script through the SDK {RLSUP_INTERVAL_S:g} s, the others "
         f"{REAL_INTERVAL_S:g} s)"),
        ("extrapolated_20min_fixed", f"rlsup's fixed {RLSUP_INTERVAL_S:g} s "
         "(adaptive_checkpoints = false)"),
        ("extrapolated_20min_same", f"the same {SAME_INTERVAL_S:g} s interval for all"),
    ):  # fmt: skip
        out.append(
            "EXTRAPOLATED (not measured) to one fault per 20 min: the measured restart, start, "
            f"refill and after per fault, redone = half of {what} (announced: as measured for "
            "rlsup, which heeds the notice; for the others as a reboot), hang detection scaled "
            "back to the real timeout, the steady slowdown above:"
        )
        out.append(
            f"{'contender':<38}{'game':<13}" + "".join(f"{k:>11}" for k in KIND_SHORT.values())
        )
        for r in doc["rows"]:
            if key not in r:
                continue
            ex = r[key]["goodput"]
            cells = "".join(
                f"{(f'{100 * ex[k]:.1f}%' if k in ex else '-'):>11}" for k in KIND_SHORT
            )
            out.append(f"({r['contender']}) {r['label']:<34}{r['game']:<13}{cells}")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run of about 3 minutes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault-every-s", type=float, default=None)
    p.add_argument("--faults", type=int, default=None)
    p.add_argument("--contenders", default=None, help="default abcd (--quick: ac)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--render", type=Path, default=None, help="print a result file's tables")
    p.add_argument(
        "--steady-s",
        type=float,
        default=None,
        help="each fault-free window at the real interval (default 150; --quick: 0)",
    )
    p.add_argument("--steady-repeats", type=int, default=2)
    p.add_argument(
        "--add-steady",
        type=Path,
        default=None,
        help="run only the steady windows and add them to this result file",
    )
    args = p.parse_args()
    steady_s = args.steady_s if args.steady_s is not None else (0.0 if args.quick else 150.0)
    if (path := args.render or args.add_steady) is not None:
        saved = json.loads(path.read_text())
        names = {f.name for f in dataclasses.fields(Settings)}
        settings = Settings(**{k: v for k, v in saved["settings"].items() if k in names})
        if args.add_steady is not None:
            print(host_line(), flush=True)
            if saved.get("host", {}).get("cpu_model") != host_facts().get("cpu_model"):
                sys.exit(f"{path}: measured on another CPU; steady windows compare within one")
            keys = set(args.contenders or "ab")
            kept = [w for w in saved.get("steady") or [] if w["contender"] not in keys]
            got = run_steady(settings, keys, steady_s or 150.0, args.steady_repeats)
            saved["steady"] = kept + got
            saved["steady_added"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        reextrapolate(saved, settings)
        path.write_text(json.dumps(saved, indent=1) + "\n")
        print(render(saved, settings))
        return
    if args.quick:
        s = Settings(args.seed, args.fault_every_s or 20, args.faults or 2, 6, 10, 3, 8, 4)
    else:
        s = Settings(args.seed, args.fault_every_s or 30, args.faults or 4, 15, 15, 5, 30, 15)
    t0 = time.monotonic()
    print(host_line(), flush=True)
    only = set(args.contenders or ("ac" if args.quick else "abcd"))
    doc = run_all(s, only)
    if steady_s > 0:
        doc["steady"] = run_steady(s, only, steady_s, args.steady_repeats)
    reextrapolate(doc, s)
    minutes = (time.monotonic() - t0) / 60
    print(render(doc, s))
    print(f"{minutes:.1f} min in all")
    facts = host_facts()
    result = {"benchmark": "goodput", "host": facts, "quick": args.quick,
              "settings": {**vars(s), "compression": s.compression, "wall_s": s.wall_s,
                           "interval_s": s.interval_s, "hang_timeout_s": s.hang_s,
                           "watchdog_s": s.watchdog_s, "quiet_s": s.quiet_s,
                           "real_interval_s": REAL_INTERVAL_S,
                           "rlsup_interval_s": s.rlsup_interval_s,
                           "rlsup_real_interval_s": RLSUP_INTERVAL_S},
              "minutes": round(minutes, 2), **doc}  # fmt: skip
    cpu = str(facts.get("cpu_model") or "cpu").split()
    tag = next((w for w in cpu if w.isupper() and len(w) > 2), "cpu")
    name = f"goodput-{tag}-{dt.date.today().isoformat()}{'-quick' if args.quick else ''}.json"
    out = args.out or BENCH / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


if __name__ == "__main__":
    main()
