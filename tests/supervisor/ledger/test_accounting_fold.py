"""The time ledger folded incrementally (issue 40): the fold brought up to date from the events
after the last one folded equals a replay of the whole ledger, whatever the split; after the
first snapshot a tick reads only the new rows; the fold persisted in accounting.json survives a
restart, and one that does not validate is rebuilt, never trusted. Real SQLite throughout."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from supervisor.ledger import accounting, db
from supervisor.ledger.fold import Fold, Row
from supervisor.ledger.fold_state import dump, load

GAMES = ["a", "b", "c"]
EXITS = ["done", "stopped", "killed_by_signal", "crash", "oom"]


def random_ledger(seed: int, n: int = 600) -> list[Row]:
    """A plausible ledger: supervisor lives (clean stops, crashes, reboots, preemptions),
    games spawned, training, evaluating (some reported twice), exiting, backing off, done;
    GPUs; the wall clock stepping back and forth within lives."""
    rng = random.Random(seed)
    rows: list[Row] = []
    wall, step_off = 1.7e9, 0.0
    mono = wall
    state = dict.fromkeys(GAMES, "off")
    evals: dict[str, list[tuple[int, float, float]]] = {g: [] for g in GAMES}

    def add(kind: str, game: str | None, **detail: Any) -> None:
        rows.append(Row(len(rows) + 1, wall + step_off, mono, kind, game, detail))

    pid = 100
    add("supervisor_start", None, after="first", downtime_s=None, pid=pid)
    while len(rows) < n:
        dt = rng.expovariate(1 / 30.0)
        wall += dt
        mono += dt
        if rng.random() < 0.02:  # a wall-clock step (NTP, a resumed VM): mono does not see it
            step_off += rng.choice([-900.0, -60.0, 45.0, 3600.0])
        r = rng.random()
        if r < 0.04:  # the life ends
            if rng.random() < 0.6:
                add("supervisor_stop", None, clean=True)
            gap = rng.expovariate(1 / 600.0)
            wall += gap
            mono = rng.uniform(0, 1e6)  # another process: another origin
            pid += 1
            after = rng.choice(["supervisor_restart", "supervisor_crash", "reboot",
                                "host_reboot", "preempted"])  # fmt: skip
            down = rng.choice([None, gap * rng.uniform(0.2, 1.2)])
            add("supervisor_start", None, after=after, downtime_s=down, pid=pid)
            for g in GAMES:
                state[g] = "off" if state[g] == "ended" else "waiting"
            continue
        g = rng.choice(GAMES)
        s = state[g]
        if s in ("off", "waiting", "backoff") and rng.random() < 0.7:
            gpu = rng.choice([None, 0, 1, 2])
            kind = "restart" if s == "backoff" else "worker_start"
            add(kind, g, **({} if gpu is None else {"gpu_index": gpu}))
            state[g] = "starting"
        elif s == "starting":
            add("worker_training", g)
            state[g] = "running"
        elif s == "running" and r < 0.5:
            if evals[g] and rng.random() < 0.3:
                st, tm, secs = rng.choice(evals[g])  # reported again by a resumed worker
            else:
                st, tm, secs = rng.randrange(10**6), wall, rng.uniform(0.5, 40)
                evals[g].append((st, tm, secs))
            add("evaluation", g, step=st, time=tm, seconds=secs)
        elif s == "running":
            step = rng.randrange(10**6)
            ex = rng.choice(EXITS)
            add("worker_exit", g, exit=ex, global_step=step,
                last_checkpoint_step=max(0, step - rng.randrange(5000)),
                returncode=0 if ex == "done" else 1)  # fmt: skip
            if ex == "done":
                add("game_done", g)
                state[g] = "ended"
            elif ex == "stopped":
                state[g] = "waiting"
            elif rng.random() < 0.1:
                add("fatal", g)
                state[g] = "ended"
            else:
                add("backoff", g)
                state[g] = "backoff"
        elif s == "ended" and rng.random() < 0.05:
            add("worker_start", g)  # a finished game started again (a reset)
            state[g] = "starting"
    return rows


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for name in GAMES:
        x, y = a[name], b[name]
        assert x.seconds == pytest.approx(y.seconds, rel=1e-9, abs=1e-6), name
        assert x.money == pytest.approx(y.money, rel=1e-9, abs=1e-9), name
        assert (x.first, x.end, x.open, x.redone_steps) == (y.first, y.end, y.open, y.redone_steps)


@pytest.mark.parametrize("seed", range(25))
def test_the_incremental_fold_equals_the_full_replay(seed: int) -> None:
    """Split at random points, the fold's state through JSON (as accounting.json keeps it)
    between any two pieces: the same split and money as one fold of the whole ledger."""
    rows = random_ledger(seed)
    rng = random.Random(1000 + seed)
    now = rows[-1].ts + rng.uniform(0, 900)
    steps = {g: rng.randrange(10**6) for g in GAMES}
    full = Fold(GAMES, gpus=2)
    full.feed(rows)
    cuts = sorted(rng.sample(range(1, len(rows)), k=rng.randint(1, 12)))
    fold = Fold(GAMES, gpus=2)
    for lo, hi in zip([0, *cuts], [*cuts, len(rows)], strict=True):
        fold.feed(rows[lo:hi])
        fold = load(json.loads(json.dumps(dump(fold), allow_nan=False)))
    assert fold.last_id == full.last_id == rows[-1].id
    for per_hour, share in ((0.0, 0.0), (3.6, 0.0), (7.2, 0.8)):
        same(fold.result(now, per_hour, share, steps), full.result(now, per_hour, share, steps))
    whole = full.result(now, 3.6, 0.8, steps)
    for t in whole.values():  # and the parts still sum to the wall time
        assert sum(t.seconds.values()) == pytest.approx(t.wall_s)


def test_the_whole_bill_is_paid_once_whatever_the_split() -> None:
    rows = random_ledger(7, n=2000)
    fold = Fold(GAMES, gpus=3)
    fold.feed(rows)
    now = rows[-1].ts
    out = fold.result(now, 3.6, 0.5)
    alive_s = out  # every instant with at least one game alive is paid exactly once
    paid = sum(sum(t.money.values()) for t in alive_s.values())
    assert paid > 0
    # 3.6/h = 0.001/s: the money is the seconds during which some game was alive
    assert paid <= 0.001 * (fold.t_at(now) - rows[0].ts) + 1e-6


# ---- the supervisor's ledger: real SQLite ---------------------------------------------------


def config(tmp_path: Path, games: list[str] = GAMES, cost: float = 3.6) -> Any:
    from supervisor.config import load_config

    text = f'state_dir = "state"\ncost_per_hour = {cost}\n'
    text += "[modes.light]\nnum_envs = 1\nbatch_size = 1\nn_steps = 1\nmax_concurrent = 1\n"
    for g in games:
        text += (
            f'[[games]]\nname = "{g}"\nenv_id = "CartPole-v1"\ntotal_steps = 1000\ndevice = "cpu"\n'
        )
    path = tmp_path / "rlsup.toml"
    path.write_text(text)
    return load_config(path)


def names(cfg: Any) -> list[str]:
    return [g.name for g in cfg.games]


def write_rows(conn: sqlite3.Connection, rows: list[Row]) -> None:
    with db.transaction(conn):
        for r in rows:
            detail = dict(r.detail)
            if "gpu_index" in detail:
                detail["gpu"] = {"index": detail.pop("gpu_index"), "uuid": "GPU-x"}
            db._add_event(conn, r.kind, r.game, detail, r.ts, r.mono)


def ledger(
    tmp_path: Path, seed: int = 3, n: int = 800
) -> tuple[Any, sqlite3.Connection, list[Row]]:
    cfg = config(tmp_path)
    conn = db.connect(cfg.state_dir)
    rows = random_ledger(seed, n)
    return cfg, conn, rows


def test_after_the_first_snapshot_a_tick_reads_only_the_new_rows(tmp_path: Path) -> None:
    from supervisor.participants import TimeLedger

    cfg, conn, rows = ledger(tmp_path)
    write_rows(conn, rows[:500])
    tl = TimeLedger(cfg)
    tl.write()
    assert tl.rows_read == 500  # the first: the whole ledger (the accounting kinds of it)
    tl.write()
    assert tl.rows_read == 0
    db._add_event(conn, "mode_pinned", None, {})  # not an accounting kind: not read
    write_rows(conn, rows[500:537])
    tl.write()
    assert tl.rows_read == 37
    snap = json.loads((cfg.state_dir / accounting.SNAPSHOT_FILE).read_text())
    assert snap["fold"]["last_id"] == 538
    # the snapshot is the full replay's
    want = accounting.account_db(conn, names(cfg), snap["upto"], 3.6)
    for name in names(cfg):
        got = snap["games"].get(name)
        if want[name].first is None:
            assert got is None
            continue
        assert got["time"]["wall_s"] == pytest.approx(want[name].wall_s, abs=0.01)
        assert got["time"]["money"] == pytest.approx(sum(want[name].money.values()), abs=1e-3)


def test_a_restart_folds_only_the_tail_from_accounting_json(tmp_path: Path) -> None:
    from supervisor.participants import TimeLedger

    cfg, conn, rows = ledger(tmp_path)
    write_rows(conn, rows[:700])
    TimeLedger(cfg).close()  # the snapshot at the supervisor's exit
    write_rows(conn, rows[700:710])
    again = TimeLedger(cfg)
    again.write()
    assert again.rows_read == 10


def _corrupt(kind: str) -> Any:
    def edit(snap: dict[str, Any]) -> None:
        fold = snap["fold"]
        if kind == "nan":
            fold["cum"][0] = float("nan")
        elif kind == "text-seconds":
            fold["game"]["a"]["seconds"]["running"] = "abc"
        elif kind == "game-text":
            fold["game"]["b"] = "x"
        elif kind == "missing-key":
            del fold["game"]["c"]["share"]
        elif kind == "not-this-ledger":  # a database replaced under the same state dir
            fold["ts"] = fold["ts"] - 3600.0  # not the wall time of the event at last_id
        elif kind == "ahead":
            fold["last_id"] = 10**6
        elif kind == "fold-text":
            snap["fold"] = "fold"

    return edit


CORRUPTIONS = ["nan", "text-seconds", "game-text", "missing-key", "not-this-ledger", "ahead",
               "fold-text"]  # fmt: skip


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_a_persisted_fold_that_does_not_validate_is_rebuilt(tmp_path: Path, kind: str) -> None:
    from supervisor.participants import TimeLedger

    cfg, conn, rows = ledger(tmp_path)
    write_rows(conn, rows[:600])
    TimeLedger(cfg).close()
    path = cfg.state_dir / accounting.SNAPSHOT_FILE
    snap = json.loads(path.read_text())
    _corrupt(kind)(snap)
    path.write_text(json.dumps(snap))
    again = TimeLedger(cfg)
    again.write()
    assert again.rows_read == 600  # folded again from the start
    fresh = json.loads(path.read_text())
    want = accounting.account_db(conn, names(cfg), fresh["upto"], 3.6)
    for name, entry in fresh["games"].items():
        assert entry["time"]["wall_s"] == pytest.approx(want[name].wall_s, abs=0.01)


def test_status_folds_the_tail_of_the_ledger_never_the_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot too old to carry on while the supervisor runs: status brings the persisted
    fold up to date with the rows after it, no more."""
    from supervisor.observe import status
    from supervisor.participants import TimeLedger

    cfg, conn, rows = ledger(tmp_path)
    write_rows(conn, rows[:600])
    TimeLedger(cfg).close()
    write_rows(conn, rows[600:625])
    read: list[int] = []
    real = accounting.read_rows

    def counted(*a: Any, **k: Any) -> list[Row]:
        out = real(*a, **k)
        read.append(len(out))
        return out

    monkeypatch.setattr(accounting, "read_rows", counted)
    games: list[Any] = [{"name": g, "global_step": 0} for g in names(cfg)]
    upto = json.loads((cfg.state_dir / accounting.SNAPSHOT_FILE).read_text())["upto"]
    now = upto + 10 * accounting.SNAPSHOT_STALE_S
    status._times(conn, cfg, games, now, running=True)
    assert sum(read) == 25
    want = accounting.account_db(conn, names(cfg), now, 3.6)
    for g in games:
        if g["time"] is not None:
            assert g["time"]["wall_s"] == pytest.approx(want[g["name"]].wall_s, abs=0.01)


def test_status_spends_no_money_once_every_game_is_done(tmp_path: Path) -> None:
    """`cost.spent` is the games' money: it stops when the last game ends (the host's idle
    time after is nobody's cost), and it does not grow while status is asked days later."""
    from supervisor.observe.status import collect

    cfg = config(tmp_path, ["solo"])
    conn = db.connect(cfg.state_dir)
    t0 = 1.7e9
    db.record_boot(conn, "boot-1", t0)
    ledger: list[tuple[float, str, str | None, dict[str, Any]]] = [
        (t0, "supervisor_start", None, {"after": "first", "pid": 1}),
        (t0, "worker_start", "solo", {}),
        (t0 + 10, "worker_training", "solo", {}),
        (t0 + 3600, "worker_exit", "solo", {"exit": "done", "global_step": 10}),
        (t0 + 3600, "game_done", "solo", {}),
        (t0 + 3601, "supervisor_stop", None, {"clean": True}),
    ]
    for ts, kind, game, detail in ledger:
        db._add_event(conn, kind, game, detail, ts, ts)
    conn.close()
    one = collect(cfg, t0 + 3700)["cost"]
    later = collect(cfg, t0 + 5 * 86400)["cost"]
    assert one is not None and later is not None
    assert one["spent"] == pytest.approx(3.6, abs=0.01)
    assert later["spent"] == one["spent"]


def test_a_detail_that_is_not_json_is_read_leniently(tmp_path: Path) -> None:
    _, conn, rows = ledger(tmp_path, n=50)
    write_rows(conn, rows)
    conn.execute("UPDATE events SET detail = 'not json' WHERE id = 3")
    got = accounting.read_rows(conn, 0)
    assert [r.id for r in got] == [r.id for r in rows]
    assert got[2].detail == {} and got[5].detail == accounting.read_rows(conn, 5, 1)[0].detail


@pytest.mark.parametrize("kind", ["nan", "game-text", "games-text"])
def test_status_rebuilds_a_fold_that_does_not_validate_and_says_so_once(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from supervisor.observe import fields, status
    from supervisor.participants import TimeLedger

    cfg, conn, rows = ledger(tmp_path)
    write_rows(conn, rows[:600])
    TimeLedger(cfg).close()
    path = cfg.state_dir / accounting.SNAPSHOT_FILE
    snap = json.loads(path.read_text())
    if kind == "games-text":
        snap["games"] = "x"
    else:
        _corrupt(kind)(snap)
    path.write_text(json.dumps(snap))
    now = snap["upto"] + 10 * accounting.SNAPSHOT_STALE_S
    fields.forget_reported()
    capsys.readouterr()
    for _ in range(3):  # status --watch, the dashboard, the metrics thread
        games: list[Any] = [{"name": g, "global_step": 0} for g in names(cfg)]
        status._times(conn, cfg, games, now, running=True)
    err = [ln for ln in capsys.readouterr().err.splitlines() if "accounting.json" in ln]
    assert len(err) == 1, err
    assert {"nan": "fold.cum", "game-text": "fold.game.b", "games-text": "games"}[kind] in err[0]
    want = accounting.account_db(conn, names(cfg), now, 3.6)
    for g in games:
        if g["time"] is not None:
            assert g["time"]["wall_s"] == pytest.approx(want[g["name"]].wall_s, abs=0.01)
