"""An iteration cut short (`learner.interrupt`): what each learner keeps and gives up, and that
the state it leaves round-trips and trains on (CartPole, CPU, in process)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from test_algos_support import assert_same, config, learner, round_trip

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PPO = {"algo": "ppo", "num_envs": 4, "n_steps": 64, "batch_size": 64, "epochs": 2}
PQN = {"algo": "pqn", "num_envs": 4, "n_steps": 32, "batch_size": 32, "epochs": 2}
DQN = {
    "algo": "dqn",
    "num_envs": 1,
    "batch_size": 32,
    "buffer_size": 2_000,
    "learning_starts": 32,
    "train_frequency": 1,
    "gradient_steps": 8,
    "total_steps": 10_000,
}


# The paths a cut must hold on: eager, the graphed step (uncaptured on the CPU) and, for the
# rollout learners, the envs in halves.
MODES = [{}, {"cuda_graphs": "on"}, {"env_overlap": "on"}]
MODE_IDS = ["eager", "graphs", "halves"]


def after_asks(n: int) -> Callable[[], bool]:
    """An `interrupt` that says yes from its (n+1)-th question on."""
    asked = [0]

    def interrupt() -> bool:
        asked[0] += 1
        return asked[0] > n

    return interrupt


def _resumes(lrn: Any, cfg: Any) -> None:
    """The state it left loads into a fresh learner, which trains on from it."""
    fresh = learner(cfg, torch_seed=99)
    fresh.load_state_dict(round_trip(lrn.state_dict()))
    assert_same(lrn.state_dict(), fresh.state_dict())
    before = fresh.global_step
    fresh.iterate()
    assert fresh.interrupted is None and fresh.global_step > before
    fresh.close()


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("layout", [PPO, PQN], ids=["ppo", "pqn"])
def test_a_rollout_cut_short_is_forgotten_as_if_it_never_began(
    layout: dict[str, Any], mode: dict[str, str]
) -> None:
    cfg = config(**layout, **mode)
    lrn = learner(cfg)
    lrn.iterate()
    step, tracker, updates = lrn.global_step, lrn.tracker.state_dict(), lrn.updates
    lrn.interrupt = after_asks(10)  # the 11th rollout step
    lrn.iterate()
    assert lrn.interrupted == "rollout"
    assert lrn.global_step == step and lrn.updates == updates
    assert lrn.tracker.state_dict() == tracker
    _resumes(lrn, cfg)
    lrn.interrupt = after_asks(10**9)
    lrn.iterate()  # the envs restart, a whole iteration follows
    assert lrn.interrupted is None and lrn.global_step == 2 * step
    lrn.close()


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("layout", [PPO, PQN], ids=["ppo", "pqn"])
def test_an_update_cut_short_keeps_the_rollout_and_the_minibatches_taken(
    layout: dict[str, Any], mode: dict[str, str]
) -> None:
    cfg = config(**layout, **mode)
    lrn = learner(cfg)
    lrn.interrupt = after_asks(cfg.n_steps + 2)  # the whole rollout, then three minibatches
    lrn.iterate()
    assert lrn.interrupted == "update"
    assert lrn.global_step == cfg.rollout_size()  # learned from: counted
    assert lrn.updates == 3 < cfg.epochs * cfg.rollout_size() // cfg.minibatch_size()
    _resumes(lrn, cfg)
    lrn.close()


@pytest.mark.parametrize("mode", MODES[:2], ids=MODE_IDS[:2])
def test_dqn_cut_between_gradient_steps_catches_up_after_the_next_env_step(
    mode: dict[str, str],
) -> None:
    cfg = config(**DQN, **mode)
    lrn = learner(cfg)
    lrn.interrupt = after_asks(100)
    lrn.iterate()
    assert lrn.interrupted == "gradient_steps"
    assert lrn.updates < lrn._updates_due(lrn.global_step)  # type: ignore[attr-defined]
    _resumes(lrn, cfg)
    lrn.interrupt = after_asks(10**9)
    lrn.iterate()
    assert lrn.interrupted is None
    assert lrn.updates == lrn._updates_due(lrn.global_step)  # type: ignore[attr-defined]
    lrn.close()
