"""benchmarks/peers.py reads CleanRL's stdout and rlsup's progress.csv: its parsing, on lines
as the scripts print them (no scratch venv, no process, no timing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks_import import benchmark_module


@pytest.fixture(scope="module")
def peers() -> Iterator[ModuleType]:
    with benchmark_module("peers.py", "bench_peers") as module:
        yield module


def stamped(text: str, dt: float = 1.0) -> list[tuple[float, str]]:
    return [(i * dt, line) for i, line in enumerate(text.strip().splitlines())]


PPO_OUT = """
global_step=992, episodic_return=0.0
SPS: 351
global_step=1208, episodic_return=1.0
global_step=1592, episodic_return=2.0
SPS: 362
global_step=2500, episodic_return=3.0
SPS: 370
"""

DQN_OUT = """
A.L.E: Arcade Learning Environment (version 0.9.1+aff5939)
global_step=286, episodic_return=[4.]
global_step=906, episodic_return=[9.]
SPS: 40
SPS: 34
global_step=1207, episodic_return=[2.]
SPS: 31
"""


def test_ppo_lines_give_the_steps_of_whole_iterations_and_the_returns(peers: ModuleType) -> None:
    lines = stamped(PPO_OUT)
    points = peers.peer_points(lines, peers.iteration_steps(1024))
    assert points == [(1.0, 1024), (4.0, 2048), (6.0, 3072)]
    assert peers.rate(points) == pytest.approx(2048 / 5.0)
    assert peers.episode_returns(lines) == [0.0, 1.0, 2.0, 3.0]


def test_dqn_lines_start_past_learning_starts_every_100_steps(peers: ModuleType) -> None:
    lines = stamped(DQN_OUT)
    points = peers.peer_points(lines, peers.dqn_steps(1000, 4))
    assert [s for _, s in points] == [1100, 1200, 1300]
    assert peers.dqn_steps(80_000, 3)(1) == 80_400  # lcm(100, 3) = 300: 80,100 first
    assert peers.episode_returns(lines) == [4.0, 9.0, 2.0]


def test_last_100_mean_and_no_rate_from_one_point(peers: ModuleType) -> None:
    assert peers.last_100_mean([0.0] * 50 + [1.0] * 100) == 1.0
    assert peers.last_100_mean([]) is None
    assert peers.rate([(0.0, 1024)]) is None


def test_progress_rows_past_the_warmup_once_per_step(peers: ModuleType) -> None:
    rows = [
        {"time": "100.0", "global_step": "512"},
        {"time": "102.0", "global_step": "1024"},
        {"time": "104.0", "global_step": "3072"},
        {"time": "104.5", "global_step": "3072"},  # the row at a stop repeats the step
    ]
    points = peers.progress_points(rows, warmup=1024)
    assert points == [(102.0, 1024), (104.0, 3072)]
    assert peers.rate(points) == pytest.approx(1024.0)


def test_the_vectorized_ratio_needs_both_rlsup_rates(peers: ModuleType) -> None:
    both = {"pqn": {"rlsup": {"sps": 643.0}}, "dqn": {"rlsup": {"sps": 136.0}}}
    assert peers.vectorized_ratio(both) == pytest.approx(643 / 136, abs=1e-3)
    assert peers.vectorized_ratio({"pqn": {"rlsup": {"sps": 643.0}}}) is None
    missing = {"pqn": {"rlsup": {"unavailable": "no pqn"}}, "dqn": {"rlsup": {"sps": 136.0}}}
    assert peers.vectorized_ratio(missing) is None


@pytest.fixture(scope="module")
def learning(peers: ModuleType) -> Iterator[ModuleType]:
    with benchmark_module("learning.py", "bench_learning") as module:
        yield module


def _side(means: list[float]) -> dict[str, float | int]:
    return {"n": len(means), "mean": sum(means) / len(means), "min": min(means), "max": max(means)}


def test_equal_learning_is_rlsups_mean_within_the_peers_spread_or_above(
    learning: ModuleType,
) -> None:
    peer = _side([7.0, 8.0, 9.0])  # mean 8, spread 2
    verdict = learning.equal_learning
    assert "equal learning" in verdict(_side([6.1, 6.0, 6.2]), peer)  # 6.1: 1.9 below
    assert "BELOW" in verdict(_side([5.9, 5.8, 6.0]), peer)  # 5.9: 2.1 below
    assert "equal learning" in verdict(_side([20.0, 21.0, 22.0]), peer)  # above
    assert "needs >= 3 a side" in verdict(_side([8.0, 8.0]), peer)
    assert verdict(_side([8.0]), None) is None


@pytest.mark.parametrize(
    ("algo", "peer_off"), [("ppo", ["--anneal-lr", "False"]), ("pqn", ["--no-anneal-lr"])]
)
def test_the_peer_runs_the_learning_rate_schedule_of_rlsups_row(
    learning: ModuleType, algo: str, peer_off: list[str], tmp_path: Path
) -> None:
    """The learning table compares rlsup's row with CleanRL's at the same settings: the peer
    anneals its learning rate exactly when rlsup's learner at ALGO_ARGS does."""
    import torch

    from training.args import build_parser, config_from_namespace, validate
    from training.registry import make_learner

    argv = ["--algo", algo, "--game", "Breakout-v5", "--run-dir", str(tmp_path), "--threads", "1"]
    cfg = validate(
        config_from_namespace(build_parser().parse_args(argv + learning.ALGO_ARGS[algo]))
    )
    learner = make_learner(cfg, torch.device("cpu"), 1)
    try:
        rlsup_anneals = learner.schedule.kind == "linear"
    finally:
        learner.close()
    args = learning.PEER_ARGS[algo]
    peer_anneals = not any(args[i : i + len(peer_off)] == peer_off for i in range(len(args)))
    assert rlsup_anneals == peer_anneals, (algo, learner.schedule.kind, args)


def test_a_variants_run_reuses_the_earlier_peer_runs_of_the_same_rows(
    peers: ModuleType, tmp_path: Path
) -> None:
    """`--peer-from`: a variant of rlsup's side on a short GPU lease runs only its own side;
    a row measured over other steps, or a run that failed, is run again."""
    import json

    earlier = {
        "benchmark": "peers",
        "rows": {
            "ppo": {"steps": 61440, "peer": {"sps": 1700.0, "runs": [
                {"seed": 1, "repeat": 0, "sps": 1697.2, "mean_last_100": 2.0, "episodes": 40,
                 "steps": 61440, "wall_s": 40.1},
                {"seed": 2, "repeat": 0, "error": "peer exited 1", "wall_s": 3.0},
            ]}},
        },
    }  # fmt: skip
    log = tmp_path / "peers.log"
    log.write_text("ppo seed 1 #0 peer: 1697 steps/s\n" + json.dumps(earlier) + "\n")
    loaded = peers.read_earlier(log)

    def row(steps: int) -> object:
        return peers.Row("ppo", steps, 0, None, [], lambda s: s, [], "settings")

    reused = peers.earlier_peer_run(loaded, row(61440), 1, 0)
    assert reused is not None and reused["sps"] == 1697.2 and reused["reused"] is True
    assert peers.earlier_peer_run(loaded, row(61440), 2, 0) is None  # it failed: run it
    assert peers.earlier_peer_run(loaded, row(61440), 1, 1) is None  # no such repeat
    assert peers.earlier_peer_run(loaded, row(30720), 1, 0) is None  # other steps
    (tmp_path / "other.json").write_text('{"benchmark": "goodput"}\n')
    with pytest.raises(SystemExit, match="not a peers run"):
        peers.read_earlier(tmp_path / "other.json")
