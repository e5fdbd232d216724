"""A command game's `params` (its hyper-parameters): what loads, what is refused (one message
naming the file, the key and the value), what its spawn is given (RLSUP_PARAMS), and every
run's effective parameters as `rlsup results` shows them (observe/params.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkpoints import CheckpointStore
from supervisor.cli import main
from supervisor.config import ConfigError, load_config
from supervisor.launch.spawn import prepare_worker
from supervisor.observe.params import common, differing, run_params
from tests.supervisor.config.test_config import GOOD
from training import protocol as P

COMMAND = """
[[games]]
name = "mine"
command = ["python", "train.py"]
"""
PARAMS = 'params = { lr = 3e-4, env_id = "CartPole-v1", double_q = true, layers = 2 }\n'


def write(tmp: Path, extra: str, base: str = GOOD) -> Path:
    path = tmp / "c.toml"
    path.write_text(base + extra)
    return path


def test_params_load_and_reach_the_program_as_rlsup_params(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, COMMAND + PARAMS))
    game = cfg.game("mine")
    assert dict(game.params) == {"lr": 3e-4, "env_id": "CartPole-v1", "double_q": True, "layers": 2}
    prepared = prepare_worker(cfg, game, cfg.mode("light"), threads=1)
    assert json.loads(prepared.env[P.PARAMS_ENV]) == dict(game.params)
    assert run_params(cfg, "mine") == {
        "double_q": True,
        "env_id": "CartPole-v1",
        "layers": 2,
        "lr": 3e-4,
    }
    # None declared: an empty object, so a script can always parse it.
    cfg = load_config(write(tmp_path, COMMAND))
    assert cfg.game("mine").params == ()
    prepared = prepare_worker(cfg, cfg.game("mine"), cfg.mode("light"), threads=1)
    assert prepared.env[P.PARAMS_ENV] == "{}" and run_params(cfg, "mine") == {}


BAD = [
    ("a table", "params = { opt = { lr = 1 } }\n", ["games[2].params.opt", "{'lr': 1}", "scalar"]),
    ("a list", "params = { sizes = [64, 64] }\n", ["games[2].params.sizes", "[64, 64]"]),
    ("inf", "params = { lr = inf }\n", ["games[2].params.lr", "inf", "finite"]),
    ("nan", "params = { lr = nan }\n", ["games[2].params.lr", "nan", "finite"]),
    ("a date", "params = { when = 2024-01-01 }\n", ["games[2].params.when", "(date)"]),
    ("long text", f'params = {{ note = "{"x" * 1001}" }}\n', ["games[2].params.note", "1001"]),
    ("a bad name", 'params = { "my lr" = 1 }\n', ["games[2].params.my lr", "'my lr'"]),
    ("not a table", "params = 3\n", ["games[2].params", "got 3"]),
]


@pytest.mark.parametrize(("case", "extra", "needles"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_params_value_is_one_message_naming_file_key_and_value(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    extra: str,
    needles: list[str],
) -> None:
    path = write(tmp_path, COMMAND + extra)
    with pytest.raises(ConfigError):
        load_config(path)
    with pytest.raises(SystemExit) as exc:
        main(["check-config", "--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert str(path) in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "state").exists()  # nothing written


def test_params_on_a_builtin_game_points_at_args(tmp_path: Path) -> None:
    builtin = GOOD.replace("total_steps = 1000\n", "total_steps = 1000\nparams = { a = 1 }\n", 1)
    path = write(tmp_path, "", builtin)
    with pytest.raises(ConfigError, match=r"games\[0\]\.params: .*`args`"):
        load_config(path)


MATRIX = """
[[games]]
name = "sweep"
env_id = "CartPole-v1"
total_steps = 1000
seeds = [1, 2]
args = { gamma = 0.98 }
[games.variants]
base = {}
fast = { learning_rate = 1e-3 }
"""


def test_a_builtin_runs_params_are_its_resolved_worker_args_variant_included(
    tmp_path: Path,
) -> None:
    cfg = load_config(write(tmp_path, MATRIX))
    base, fast = run_params(cfg, "sweep/base/s1"), run_params(cfg, "sweep/fast/s2")
    # Not started: the recipe in the initial mode (the mode's sizes, the variant's overrides).
    assert (base["gamma"], base["learning_rate"], fast["learning_rate"]) == (0.98, None, 1e-3)
    assert (base["num_envs"], base["n_steps"], base["seed"], fast["seed"]) == (4, 64, 1, 2)
    assert (base["game"], base["algo"]) == ("CartPole-v1", "ppo")
    assert not {"run_dir", "threads", "mirror_url", "epoch"} & set(base)  # plumbing
    assert differing([base, fast]) == ["learning_rate", "seed"]
    assert common([base, fast])["gamma"] == 0.98 and "seed" not in common([base, fast])
    # Started: what the worker wrote into its newest checkpoint (here, another mode's sizes).
    run = cfg.run_dir("sweep/fast/s2")
    written = {**fast, "num_envs": 8, "run_dir": str(run), "threads": 2}
    store = CheckpointStore(run / P.CHECKPOINT_DIR)
    with store.begin(64, {}) as writer:
        writer.write_json("config.json", written)
        writer.commit()
    got = run_params(cfg, "sweep/fast/s2")
    assert got["num_envs"] == 8 and got["learning_rate"] == 1e-3 and "run_dir" not in got
    with pytest.raises(KeyError):
        run_params(cfg, "nosuch")
