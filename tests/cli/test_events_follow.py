"""`rlsup events -f`: events streamed as they are recorded, filtered, as JSON Lines."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from follow import Follow

from harness.state_fixture import SCHEMA, StateFixture

pytestmark = pytest.mark.e2e


def follow_events(state: StateFixture, *args: str) -> Follow:
    argv = [sys.executable, "-m", "supervisor.cli", "events", "-f", "--config", str(state.config)]
    return Follow([*argv, *args], state.env())


def record(db: Path, kind: str, game: str | None, **detail: object) -> None:
    """One event, as the supervisor writes it (its own transaction, committed)."""
    conn = sqlite3.connect(db, timeout=10)
    with conn:
        conn.execute(
            "INSERT INTO events(ts, kind, game, detail) VALUES (?, ?, ?, ?)",
            (time.time(), kind, game, json.dumps(detail)),
        )
    conn.close()


def record_until_seen(f: Follow, db: Path, kind: str, game: str | None) -> list[int]:
    """Record numbered events until the follower prints one (it takes its starting point on
    its first poll, at a moment the test cannot see); the numbers recorded."""
    seqs: list[int] = []
    deadline = time.monotonic() + 30
    while not f.lines():
        assert time.monotonic() < deadline, "the follower printed nothing"
        seqs.append(len(seqs))
        record(db, kind, game, seq=seqs[-1])
        f.check_alive()
        time.sleep(0.3)
    return seqs


def test_follow_json_prints_each_new_event_once_as_a_json_line(state: StateFixture) -> None:
    f = follow_events(state, "--json")
    try:
        seqs = record_until_seen(f, state.db, "worker_crash", "pong")
        record(state.db, "restart", "pong", seq=len(seqs))
        got = [json.loads(ln) for ln in f.wait_for(lambda got: got[-1:] and '"restart"' in got[-1])]
    finally:
        assert f.interrupt() == 0
    assert all(set(e) == {"ts", "kind", "game", "detail"} for e in got)
    printed = [e["detail"]["seq"] for e in got]
    # None of the fixture's 2,000 older events; from the first new one seen, every one, once.
    assert printed == list(range(printed[0], len(seqs) + 1))
    assert got[-1]["kind"] == "restart" and got[-1]["game"] == "pong"


def test_follow_respects_game_and_kind(state: StateFixture) -> None:
    f = follow_events(state, "--json", "--game", "pong", "--kind", "restart")
    try:
        seqs = record_until_seen(f, state.db, "restart", "pong")
        record(state.db, "restart", "breakout", seq=-1)
        record(state.db, "worker_crash", "pong", seq=-2)
        record(state.db, "restart", "pong", seq=len(seqs))
        last = len(seqs)
        got = f.wait_for(lambda got: json.loads(got[-1])["detail"]["seq"] == last)
    finally:
        assert f.interrupt() == 0
    events = [json.loads(ln) for ln in got]
    assert {(e["kind"], e["game"]) for e in events} == {("restart", "pong")}
    assert all(e["detail"]["seq"] >= 0 for e in events)


def test_follow_waits_for_the_database_then_prints_all_its_events(tmp_path: Path) -> None:
    from harness.state_fixture import build_state

    state = build_state(tmp_path / "site", n_games=2, with_db=False)  # never run yet
    f = follow_events(state)
    try:
        f.wait_stderr("waiting for")
        conn = sqlite3.connect(state.db)
        conn.executescript(SCHEMA)
        conn.close()
        game = state.games[0].name
        record(state.db, "supervisor_start", None, after="first_start")
        record(state.db, "worker_start", game, pid=4242)
        got = f.wait_for(lambda got: len(got) >= 2)
    finally:
        assert f.interrupt() == 0
    assert "supervisor_start" in got[0] and "after=first_start" in got[0]
    assert got[0][:4].isdigit()  # a readable local time first
    assert "worker_start" in got[1] and game in got[1] and "pid=4242" in got[1]


def test_follow_with_since_starts_with_the_history(state: StateFixture) -> None:
    f = follow_events(state, "--json", "--since", "8d", "--kind", "host_reboot")
    try:
        got = f.wait_for(lambda got: got)
    finally:
        assert f.interrupt() == 0
    assert [json.loads(ln)["kind"] for ln in got] == ["host_reboot"]
