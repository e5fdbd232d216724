"""`[games.sweep]`: what loads (a trial's runs, its definition), what is refused at load (file,
line and key named, nothing changed), the values a trial's run is started with, and a reload
that changes a sweep."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from supervisor.config import ConfigError, load_config
from supervisor.config.sweep import sweep_reload_refusal
from supervisor.launch.spawn import prepare_worker
from supervisor.observe.params import run_params
from supervisor.sweep.keeper import trial_spec
from tests.supervisor.config.test_config import GOOD
from training import protocol as P
from training.args import WorkerConfig

HEAD = GOOD.split("[[games]]")[0]
BUILTIN = """
[[games]]
name = "cart"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = 4096
seeds = [1, 2]
args = { eval_every_steps = 1024 }
[games.sweep]
trials = 3
"""
SPACE = "params = { learning_rate = { low = 1e-4, high = 1e-2, log = true }, epochs = [2, 4] }\n"
COMMAND = """
[[games]]
name = "mine"
command = ["python", "train.py"]
params = { env_id = "CartPole-v1", lr = 3e-4 }
[games.sweep]
trials = 2
sampler = "random"
pruner = "none"
params = { lr = { low = 1e-4, high = 1e-2, log = true }, width = [64, 128] }
"""


def write(tmp: Path, text: str) -> Path:
    path = tmp / "c.toml"
    path.write_text(HEAD + text)
    return path


def test_a_sweep_expands_into_its_trials_runs(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BUILTIN + SPACE))
    names = [g.name for g in cfg.games]
    assert names == [f"cart/t{t:03d}/s{s}" for t in range(3) for s in (1, 2)]
    game = cfg.game("cart/t001/s2")
    assert game.trial == 1 and game.seed == 2 and game.sweep is not None
    assert game.group == "cart/t001"  # `rlsup results` aggregates a trial over its seeds
    spec = game.sweep
    assert spec.runs_of(1) == ["cart/t001/s1", "cart/t001/s2"]
    assert spec.definition() == {
        "metric": "eval", "direction": "maximize", "sampler": "tpe", "seed": 0, "seeds": [1, 2],
        "kind": "builtin",
        "space": {
            "learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
            "epochs": {"choices": [2, 4]},
        },
    }  # fmt: skip
    # A trial's values reach the worker as its arguments, over the game's own args.
    run = trial_spec(game, {"learning_rate": 5e-4, "epochs": 4})
    argv = prepare_worker(cfg, run, cfg.mode("light"), threads=1).argv
    wcfg = WorkerConfig.from_argv(argv)
    assert (wcfg.learning_rate, wcfg.epochs, wcfg.eval_every_steps) == (5e-4, 4, 1024)


def test_a_command_sweep_reaches_the_program_as_rlsup_params(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, COMMAND))
    game = cfg.game("mine/t001")
    assert [g.name for g in cfg.games] == ["mine/t000", "mine/t001"]
    run = trial_spec(game, {"lr": 1e-3, "width": 128})
    env = prepare_worker(cfg, run, cfg.mode("light"), threads=1).env
    assert json.loads(env[P.PARAMS_ENV]) == {"env_id": "CartPole-v1", "lr": 1e-3, "width": 128}
    # What results and the trackers show: the drawn values (trial.json) over the declared.
    run_dir = cfg.run_dir("mine/t001")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "trial.json").write_text(json.dumps({"params": {"lr": 1e-3, "width": 128}}))
    assert run_params(cfg, "mine/t001") == {"env_id": "CartPole-v1", "lr": 1e-3, "width": 128}
    assert run_params(cfg, "mine/t000") == {"env_id": "CartPole-v1", "lr": 3e-4}


BAD = [
    ("no params", "", ["games[0].sweep.params", "missing"]),
    ("empty params", "params = {}\n", ["games[0].sweep.params", "got {}"]),
    ("inverted", "params = { learning_rate = { low = 1e-2, high = 1e-4 } }\n",
     ["games[0].sweep.params.learning_rate", "low 0.01 is not below high 0.0001"]),
    ("equal ends", "params = { learning_rate = { low = 1e-3, high = 1e-3 } }\n",
     ["empty range"]),
    ("a string end", 'params = { learning_rate = { low = "a", high = 1 } }\n',
     ["games[0].sweep.params.learning_rate.low", "'a'", "a number"]),
    ("a bare number", "params = { learning_rate = 3e-4 }\n",
     ["games[0].sweep.params.learning_rate", "0.0003", "a range"]),
    ("an empty list", "params = { epochs = [] }\n", ["games[0].sweep.params.epochs", "empty"]),
    ("a table in a list", "params = { epochs = [{ a = 1 }] }\n", ["epochs", "{'a': 1}"]),
    ("a supervisor flag", "params = { num_envs = [4, 8] }\n",
     ["games[0].sweep.params.num_envs", "set by the supervisor"]),
    ("an unknown key", "params = { learning_rat = [1e-3] }\n",
     ["games[0].sweep.params.learning_rat", "did you mean learning_rate"]),
    ("a value the worker refuses", "params = { epochs = [0, 4] }\n",
     ["games[0].sweep.params.epochs", "0"]),
    ("a log range through zero", "params = { learning_rate = { low = 0, high = 1, log = true } }\n",
     ["games[0].sweep.params.learning_rate.low", "log range needs low > 0"]),
    ("log and step", "params = { gamma = { low = 0.9, high = 0.99, log = true, step = 0.01 } }\n",
     ["step", "give one of them"]),
    ("an unknown range key", "params = { gamma = { low = 0.9, high = 0.99, lg = true } }\n",
     ["games[0].sweep.params.gamma.lg", "unknown key"]),
    ("a bad sampler", 'sampler = "cmaes"\n' + SPACE,
     ["games[0].sweep.sampler", "'cmaes'", "tpe | random | grid"]),
    ("a bad metric", 'metric = "loss"\n' + SPACE, ["games[0].sweep.metric", "'loss'"]),
    ("a grid over a float range", 'sampler = "grid"\n' + SPACE,
     ["games[0].sweep.params.learning_rate", "grid"]),
    ("a grid too small", 'sampler = "grid"\nparams = { epochs = [2, 4] }\n',
     ["games[0].sweep.trials", "got 3", "at most 2"]),
    ("an unknown sweep key", "tirals = 3\n" + SPACE, ["games[0].sweep.tirals", "unknown key"]),
]  # fmt: skip


@pytest.mark.parametrize(("why", "extra", "needles"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_search_is_refused_naming_the_key(
    tmp_path: Path, why: str, extra: str, needles: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, BUILTIN + extra))
    message = str(err.value)
    assert str(tmp_path / "c.toml") in message and "line " in message, message
    for needle in needles:
        assert needle in message, (why, message)


def test_a_sweep_refuses_variants_zero_trials_and_a_pruner_without_evaluations(
    tmp_path: Path,
) -> None:
    cases = [
        (BUILTIN + SPACE + "[games.variants]\nfast = { learning_rate = 1e-3 }\n",
         ["games[0].variants", "either `variants` or [games.sweep]"]),
        (BUILTIN.replace("trials = 3", "trials = 0") + SPACE, ["games[0].sweep.trials", "got 0"]),
        (BUILTIN.replace("args = { eval_every_steps = 1024 }", "") + SPACE,
         ["games[0].sweep.pruner", "eval_every_steps"]),
        (COMMAND.replace("width = [64, 128]", '"my width" = [1]'),
         ["games[0].sweep.params.my width", "must match"]),
    ]  # fmt: skip
    for text, needles in cases:
        with pytest.raises(ConfigError) as err:
            load_config(write(tmp_path, text))
        for needle in needles:
            assert needle in str(err.value), str(err.value)


def test_a_reload_that_changes_a_sweep_is_refused(tmp_path: Path) -> None:
    old = load_config(write(tmp_path, BUILTIN + SPACE))
    assert sweep_reload_refusal(old, old) is None
    wider = load_config(write(tmp_path, BUILTIN + SPACE.replace("1e-2", "1e-1")))
    refusal = sweep_reload_refusal(old, wider)
    assert refusal is not None and "sweep 'cart' changed (space)" in refusal
    assert "new name" in refusal
    more = load_config(write(tmp_path, BUILTIN.replace("trials = 3", "trials = 5") + SPACE))
    refusal = sweep_reload_refusal(old, more)
    assert refusal is not None and "trials changed" in refusal and "next start" in refusal
    # A sweep added or removed is not a change of one.
    plain = dataclasses.replace(old, games=())
    assert sweep_reload_refusal(plain, old) is None and sweep_reload_refusal(old, plain) is None
