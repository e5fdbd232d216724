"""The time split of a game's life from the ledger: every second in one category, the parts
summing to the wall time; money shared among the games alive at each instant."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.ledger.accounting import CATEGORIES, account, split_game

pytestmark = pytest.mark.e2e


def ev(ts: float, kind: str, game: str | None = "g", **detail: Any) -> dict[str, Any]:
    return {"ts": ts, "kind": kind, "game": game, "detail": detail}


LIFE = [
    ev(0, "supervisor_start", None, after="first", downtime_s=None),
    ev(10, "worker_start"),  # 10 s queued before: not part of its life
    ev(12, "worker_training"),  # 2 s starting
    ev(40, "evaluation", step=1000, mean=5.0, seconds=4.0, time=40.0),
    # killed by a signal at step 3000 with the last checkpoint at 2000: 1000 steps redone
    ev(62, "worker_exit", exit="killed_by_signal", global_step=3000, last_checkpoint_step=2000),
    ev(62, "backoff"),
    ev(65, "restart"),  # 3 s backoff
    ev(66, "worker_training"),  # 1 s starting
    # the same evaluation reported again by the resumed worker: counted once
    ev(67, "evaluation", step=1000, mean=5.0, seconds=4.0, time=40.0),
    ev(90, "supervisor_stop", None, clean=True),  # (its worker stopped cleanly just before)
    ev(89, "worker_exit", exit="stopped", global_step=4400, last_checkpoint_step=4400),
    ev(130, "supervisor_start", None, after="clean_stop", downtime_s=40.0),
    ev(131, "worker_start"),
    ev(132, "worker_training"),
    ev(150, "worker_exit", exit="done", global_step=5000, last_checkpoint_step=5000),
    ev(150, "game_done"),
]


def test_every_second_of_a_life_falls_in_one_category() -> None:
    events = sorted(LIFE, key=lambda e: e["ts"])
    t = split_game(events, "g", now=500.0)
    s = t.seconds
    assert t.first == 10 and t.end == 150
    assert t.wall_s == pytest.approx(140.0)  # 10 -> 150, nothing after game_done
    assert s["setup"] == pytest.approx(2)  # the first start: any run pays it
    assert s["starting"] == pytest.approx(1 + 1)  # the restarts'
    assert t.as_json(False)["lost_s"] == pytest.approx(s["redone"] + 2 + 3)
    assert s["backoff"] == pytest.approx(3)
    assert s["paused"] == pytest.approx(40)  # 90 -> 130: the operator's clean stop
    assert s["down"] == 0
    assert s["waiting"] == pytest.approx(1 + 1)  # exit 89 -> stop 90; start 130 -> 131
    assert s["evaluation"] == pytest.approx(4.0)  # once, though reported twice
    running = (62 - 12) + (89 - 66) + (150 - 132)
    assert t.redone_steps == 1000
    # 1000 redone steps at the game's own speed: 6000 steps (5000 + 1000 redone) in the
    # running time less evaluation
    speed = 6000 / (running - 4.0)
    assert s["redone"] == pytest.approx(1000 / speed)
    assert s["training"] == pytest.approx(running - 4.0 - 1000 / speed)
    assert sum(s.values()) == pytest.approx(t.wall_s)


def test_a_supervisor_crash_counts_its_measured_downtime_as_down() -> None:
    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(1, "worker_start"),
        ev(2, "worker_training"),
        # the supervisor died at ~30 (no stop event); the next one measured 20 s of downtime
        ev(50, "supervisor_start", None, after="supervisor_crash", downtime_s=20.0),
        ev(51, "worker_start"),
        ev(52, "worker_training"),
    ]
    t = split_game(events, "g", now=60.0)
    assert t.seconds["down"] == pytest.approx(20.0)
    assert t.seconds["training"] == pytest.approx((30 - 2) + (60 - 52))
    assert t.wall_s == pytest.approx(59.0)


def test_a_game_not_started_yet_has_no_time() -> None:
    t = split_game([ev(0, "supervisor_start", None)], "g", now=100.0)
    assert t.first is None and t.wall_s == 0.0


def test_money_is_shared_among_the_games_alive() -> None:
    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(0, "worker_start", "a"),
        ev(0, "worker_training", "a"),
        ev(1800, "worker_start", "b"),
        ev(1800, "worker_training", "b"),
        ev(3600, "worker_exit", "a", exit="done", global_step=10, last_checkpoint_step=10),
        ev(3600, "game_done", "a"),
    ]
    out = account(events, ["a", "b"], now=5400.0, per_hour=2.0)
    a, b = sum(out["a"].money.values()), sum(out["b"].money.values())
    # 0-0.5 h: a alone ($1); 0.5-1 h: shared ($0.5 each); 1-1.5 h: b alone ($1)
    assert a == pytest.approx(1.5) and b == pytest.approx(1.5)
    assert a + b == pytest.approx(2.0 * 1.5)  # the host's whole bill, no more, no less
    assert set(out["a"].money) == set(CATEGORIES)
    doc = out["a"].as_json(priced=True)
    assert doc["money"] == pytest.approx(1.5) and doc["money_lost"] == 0.0
    assert doc["wall_s"] == pytest.approx(3600.0)


def test_buckets_get_the_seconds_and_money_that_fall_in_them() -> None:
    from supervisor.ledger.accounting import Bucket

    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(0, "worker_start", "a"),
        ev(0, "worker_training", "a"),
        ev(1800, "worker_start", "b"),
        ev(1800, "worker_training", "b"),
        ev(3600, "supervisor_stop", None, clean=True),
        ev(5400, "supervisor_start", None, after="clean_stop"),
        ev(5400, "worker_start", "a"),
    ]
    days = [Bucket("one", 0, 3600), Bucket("two", 3600, 7200)]
    times = account(events, ["a", "b"], now=7200.0, per_hour=3.6, buckets=days)  # 0.001/s
    one, two = days
    assert sum(one.seconds.values()) == pytest.approx(3600 + 1800)  # a all hour, b half
    assert one.seconds["paused"] == 0 and two.seconds["paused"] == pytest.approx(2 * 1800)
    assert sum(one.money.values()) == pytest.approx(3.6)  # the host's hour, whole
    assert sum(two.money.values()) == pytest.approx(3.6)
    total = sum(sum(t.money.values()) for t in times.values())
    assert total == pytest.approx(sum(sum(b.money.values()) for b in days))
    assert two.money["paused"] == pytest.approx(1.8)  # 1800 s paused shared by both games


def test_the_gpus_share_is_paid_by_the_games_on_each_gpu_and_idle_gpus_by_all() -> None:
    """2 GPUs, 80 % of 3.6/h theirs: a on GPU 0 and b on GPU 1 for an hour, c on the CPU."""

    def gpu(i: int) -> dict[str, Any]:
        return {"gpu": {"index": i, "uuid": f"GPU-{i}"}}

    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(0, "worker_start", "a", **gpu(0)),
        ev(0, "worker_training", "a"),
        ev(0, "worker_start", "b", **gpu(1)),
        ev(0, "worker_training", "b"),
        ev(0, "worker_start", "c"),
        ev(0, "worker_training", "c"),
        # b ends at 30 min: GPU 1 idle for the second half hour, paid by a and c
        ev(1800, "worker_exit", "b", exit="done", global_step=1, last_checkpoint_step=1),
        ev(1800, "game_done", "b"),
    ]
    out = account(events, ["a", "b", "c"], now=3600.0, per_hour=3.6, gpu_share=0.8, gpus=2)
    money = {n: sum(t.money.values()) for n, t in out.items()}
    assert sum(money.values()) == pytest.approx(3.6)  # the whole bill, no more, no less
    # first half hour: rest 0.36 / 3 each; GPU 0 (0.72) to a, GPU 1 (0.72) to b
    # second: rest 0.36 / 2 each; GPU 0 to a; idle GPU 1's 0.72 shared by a and c
    assert money["b"] == pytest.approx(0.12 + 0.72)
    assert money["a"] == pytest.approx(0.12 + 0.72 + 0.18 + 0.72 + 0.36)
    assert money["c"] == pytest.approx(0.12 + 0.18 + 0.36)


def test_a_snapshot_carried_on_to_now_is_the_replay_at_now() -> None:
    """`rlsup status` reads the supervisor's snapshot and carries each game's current part on:
    with no event in between, that is what a replay at `now` gives."""
    from supervisor.ledger.accounting import Fold, carried, rows_of, snapshot

    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(0, "worker_start", "a"),
        ev(5, "worker_training", "a"),
        ev(0, "worker_start", "b"),
        ev(3, "worker_training", "b"),
        ev(
            100,
            "worker_exit",
            "b",
            exit="killed_by_signal",
            global_step=500,
            last_checkpoint_step=400,
        ),
        ev(100, "backoff", "b"),
    ]
    fold = Fold(["a", "b"])
    fold.feed(rows_of(events))
    then = fold.result(200.0, 7.2)
    snap = snapshot(then, 200.0, 7.2, 0.0, fold.money_rates(7.2, 0.0), fold)
    assert snap["fold"]["last_id"] == len(events)
    assert snap["games"]["a"]["open"] == "running" and snap["games"]["b"]["open"] == "backoff"
    later = account(events, ["a", "b"], now=260.0, per_hour=7.2)
    for name in ("a", "b"):
        entry = snap["games"][name]
        got = carried(entry, 60.0, entry["open"])
        want = later[name].as_json(True)
        for key in ("wall_s", "setup_s", "backoff_s", "lost_s", "money", "money_lost"):
            assert got[key] == pytest.approx(want[key], abs=0.05), (name, key)
    # a has trained on: its redone/training split moves with the speed; their sum does not
    a = carried(snap["games"]["a"], 60.0, "running")
    assert a["training_s"] == pytest.approx(later["a"].seconds["training"], abs=0.05)
    # the supervisor stopped: the open parts go on as "down"
    down = carried(snap["games"]["a"], 60.0, "down")
    assert down["down_s"] == pytest.approx(60.0) and down["lost_s"] == pytest.approx(60.0)


# ---- an operator's pause, the clock, a command game (issue 40) -----------------------------


def test_an_operators_stop_then_a_later_run_is_paused_never_lost() -> None:
    """`rlsup stop` (a clean supervisor_stop) and a `rlsup run` later: its own part."""
    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(0, "worker_start"),
        ev(10, "worker_training"),
        ev(100, "worker_exit", exit="stopped", global_step=900, last_checkpoint_step=900),
        ev(100, "supervisor_stop", None, clean=True),
        ev(3700, "supervisor_start", None, after="supervisor_restart", downtime_s=None),
        ev(3700, "worker_start"),
        ev(3705, "worker_training"),
    ]
    t = split_game(events, "g", now=3800.0)
    doc = t.as_json(False)
    assert t.seconds["paused"] == pytest.approx(3600.0)
    assert t.seconds["down"] == 0.0
    assert doc["lost_s"] == pytest.approx(5.0)  # the restart's start-up, nothing of the pause
    assert doc["paused_s"] == pytest.approx(3600.0) and doc["wall_s"] == pytest.approx(3800.0)
    # the host rebooted cleanly while it was stopped (measured downtime): still the pause
    events[5] = ev(3700, "supervisor_start", None, after="reboot", downtime_s=3000.0)
    assert split_game(events, "g", now=3800.0).seconds["paused"] == pytest.approx(3600.0)


@pytest.mark.parametrize("after", ["host_reboot", "preempted"])
def test_a_host_that_went_away_after_a_stop_is_down_not_paused(after: str) -> None:
    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(0, "worker_start"),
        ev(10, "worker_training"),
        ev(100, "supervisor_stop", None, clean=True),
        ev(400, "supervisor_start", None, after=after, downtime_s=300.0),
    ]
    t = split_game(events, "g", now=400.0)
    assert t.seconds["down"] == pytest.approx(300.0) and t.seconds["paused"] == 0.0


def test_an_unexpected_reboot_is_down() -> None:
    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(0, "worker_start"),
        ev(10, "worker_training"),
        ev(500, "supervisor_start", None, after="host_reboot", downtime_s=200.0),
    ]
    t = split_game(events, "g", now=500.0)
    assert t.seconds["down"] == pytest.approx(200.0) and t.seconds["paused"] == 0.0
    assert t.seconds["training"] == pytest.approx(290.0)


def at(ts: float, mono: float, kind: str, game: str | None = "g", **detail: Any) -> dict[str, Any]:
    return {"ts": ts, "mono": mono, "kind": kind, "game": game, "detail": detail}


def test_a_backward_clock_step_within_a_life_loses_no_time() -> None:
    """The wall clock steps back 600 s at ~1000 s (NTP, a VM resumed): the events' wall `ts`
    run backwards, their `mono` (the supervisor's step-free clock) does not."""
    step = -600.0
    events = [
        at(0, 0, "supervisor_start", None, after="first"),
        at(0, 0, "worker_start"),
        at(10, 10, "worker_training"),
        at(2000 + step, 2000, "evaluation", step=1000, time=2000 + step, seconds=5.0),
        at(
            3000 + step,
            3000,
            "worker_exit",
            exit="done",
            global_step=5000,
            last_checkpoint_step=5000,
        ),
        at(3000 + step, 3000, "game_done"),
    ]
    t = split_game(events, "g", now=3100.0 + step)
    assert t.wall_s == pytest.approx(3000.0)  # wall ts says 2400: 20 % lost
    assert t.seconds["setup"] == pytest.approx(10.0)
    assert t.seconds["training"] + t.seconds["evaluation"] == pytest.approx(2990.0)


def test_across_lives_the_wall_clock_measures_the_gap() -> None:
    """Each life's `mono` has its own origin: the gap between two lives is wall time."""
    events = [
        at(0, 5000, "supervisor_start", None, after="first"),
        at(0, 5000, "worker_start"),
        at(10, 5010, "worker_training"),
        at(100, 5100, "supervisor_stop", None, clean=True),
        # the next life: its mono starts elsewhere (the step-free clock of another process)
        at(160, 90000, "supervisor_start", None, after="supervisor_restart"),
        at(160, 90000, "worker_start"),
        at(170, 90010, "worker_training"),
    ]
    t = split_game(events, "g", now=200.0)
    assert t.seconds["paused"] == pytest.approx(60.0)
    assert t.wall_s == pytest.approx(200.0)


def test_no_money_is_attributed_once_every_game_is_done() -> None:
    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(0, "worker_start", "a"),
        ev(0, "worker_training", "a"),
        ev(3600, "worker_exit", "a", exit="done", global_step=10, last_checkpoint_step=10),
        ev(3600, "game_done", "a"),
    ]
    one = account(events, ["a"], now=3600.0, per_hour=2.0)
    later = account(events, ["a"], now=30 * 86400.0, per_hour=2.0)
    assert sum(one["a"].money.values()) == pytest.approx(2.0)
    assert sum(later["a"].money.values()) == pytest.approx(2.0)


def _started_command_game(tmp_path: Any, heartbeat: bool) -> tuple[Any, Any]:
    """A command game's lifecycle with its worker just spawned (no process: the lifecycle
    touches none)."""
    import subprocess
    import sys

    from supervisor.config import load_config
    from supervisor.launch.spawn import WorkerProcess
    from supervisor.lifecycle.game import Lifecycle

    config = tmp_path / "rlsup.toml"
    config.write_text(
        'state_dir = "state"\n[modes.light]\nnum_envs = 1\nbatch_size = 1\nn_steps = 1\n'
        "max_concurrent = 1\n"
        f'[[games]]\nname = "mine"\ncommand = ["{sys.executable}", "train.py"]\n'
        f'device = "cpu"\nheartbeat = {"true" if heartbeat else "false"}\n'
    )
    cfg = load_config(config)
    life = Lifecycle(cfg, wall=lambda: 1000.0)
    rt = life.games["mine"]
    life.queue_new()
    popen = subprocess.Popen.__new__(subprocess.Popen)
    popen.pid = 4242
    proc = WorkerProcess(popen=popen, pidfd=-1, create_time=1000.0, started_mono=0.0)
    life.started(rt, proc, cfg.modes[0], now=0.0, spawned_at=0.0, threads=1)
    life.drain()
    return life, rt


def _heartbeat(step: int) -> Any:
    from training.protocol import Heartbeat

    return Heartbeat(
        seq=step, pid=4242, phase="training", phase_deadline_s=60.0, global_step=step,
        total_steps=10**6, episodes=0, sps=0.0, mean_return=None, last_checkpoint_step=None,
        resumed_from_step=None, num_envs=1, batch_size=1, device="cpu", gpu_mem_mb=None,
        writer="sdk",
    )  # fmt: skip


def test_a_command_game_without_heartbeats_trains_once_started(tmp_path: Any) -> None:
    """A level-0 command game (no heartbeat at all): its running time is training, not
    setup (TRAIN was 0.0 %)."""
    from supervisor.config import WatchdogConfig

    life, rt = _started_command_game(tmp_path, heartbeat=False)
    life.check(rt, rt.life, WatchdogConfig(), now=1.0)
    kinds = [e.kind for e in life.drain() if hasattr(e, "kind")]
    assert "worker_training" in kinds


def test_an_sdk_game_trains_from_its_first_heartbeat_step(tmp_path: Any) -> None:
    """An SDK heartbeat carries no start marks: training counts from its step moving."""
    from supervisor.config import WatchdogConfig

    life, rt = _started_command_game(tmp_path, heartbeat=True)
    wd = WatchdogConfig()
    life.heartbeat(rt, rt.life, _heartbeat(0), now=1.0)
    life.check(rt, rt.life, wd, now=1.0)
    assert "worker_training" not in [getattr(e, "kind", None) for e in life.drain()]
    life.heartbeat(rt, rt.life, _heartbeat(64), now=2.0)
    life.check(rt, rt.life, wd, now=2.0)
    life.heartbeat(rt, rt.life, _heartbeat(128), now=3.0)
    life.check(rt, rt.life, wd, now=3.0)
    kinds = [getattr(e, "kind", None) for e in life.drain()]
    assert kinds.count("worker_training") == 1


def test_a_short_game_s_money_keeps_its_precision() -> None:
    """A game of seconds on a cheap host costs fractions of a cent: its money figures keep
    the precision of its seconds (CI saw money_lost 0.0048 for 4.752 s at 3.6/h, 1 % off)."""
    events = [
        ev(0, "supervisor_start", None, after="first"),
        ev(0, "worker_start", "a"),
        ev(1, "worker_training", "a"),
        ev(5, "worker_exit", "a", exit="stopped", global_step=9, last_checkpoint_step=9),
        ev(5, "supervisor_stop", None, clean=True),
        ev(6, "supervisor_start", None, after="supervisor_restart", downtime_s=None),
        ev(6, "worker_start", "a"),
        ev(10.752, "worker_training", "a"),
    ]
    doc = account(events, ["a"], now=12.0, per_hour=3.6)["a"].as_json(priced=True)
    assert doc["lost_s"] == pytest.approx(4.752)
    assert doc["money"] == pytest.approx(0.001 * doc["wall_s"], rel=1e-3)
    assert doc["money_lost"] == pytest.approx(0.001 * doc["lost_s"], rel=1e-3)
