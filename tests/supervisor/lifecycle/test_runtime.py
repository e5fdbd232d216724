"""A configuration reload against the runtimes the loop holds: who is new, who must stop, and
a game that keeps (or takes back) its runtime, so its restarts, budget and worker stay one."""

from __future__ import annotations

from typing import Any

from supervisor.config import GameSpec
from supervisor.lifecycle.exits import StopReason
from supervisor.lifecycle.liveness import Liveness
from supervisor.lifecycle.runtime import GameRuntime, WorkerLife, reconcile, summary
from supervisor.lifecycle.states import WorkerState


def spec(name: str, steps: int = 1000) -> GameSpec:
    return GameSpec(name, "CartPole-v1", "ppo", steps, 0, "cpu")


def with_worker(rt: GameRuntime) -> GameRuntime:
    fake_proc: Any = object()  # reconcile never touches the process
    rt.life = WorkerLife(fake_proc, None, Liveness(since=0.0))  # type: ignore[arg-type]
    return rt


def test_reload_adds_keeps_and_stops_in_the_new_order() -> None:
    a, b, c = GameRuntime(spec("a")), with_worker(GameRuntime(spec("b"))), GameRuntime(spec("c"))
    a.restarts = 3
    games = {"a": a, "b": b, "c": c}
    removed: dict[str, GameRuntime] = {}
    change = reconcile(games, removed, [spec("d"), spec("a", 5000)], now_wall=42.0)
    assert list(games) == ["d", "a"]
    assert games["a"] is a and a.restarts == 3 and a.spec.total_steps == 5000
    assert [rt.spec.name for rt in change.added] == ["d"] and games["d"].state_since == 42.0
    assert change.leaving == [b] and removed == {"b": b}, "c had no worker: simply gone"


def test_a_game_readded_while_its_worker_stops_takes_its_runtime_back() -> None:
    b = with_worker(GameRuntime(spec("b")))
    b.restarts = 2
    games: dict[str, GameRuntime] = {}
    removed = {"b": b}
    change = reconcile(games, removed, [spec("b")], now_wall=1.0)
    assert games["b"] is b and b.restarts == 2 and not removed
    assert change.added == [] and change.leaving == []
    assert b.life is not None and b.life.stop_reason is StopReason.READDED


def test_summary_counts_states() -> None:
    a, b, c = GameRuntime(spec("a")), GameRuntime(spec("b")), GameRuntime(spec("c"))
    a.state = c.state = WorkerState.RUNNING
    assert summary([a, b, c]) == "rlsup: 2 running, 1 stopped"
