"""A game's matrix: `seeds` x `variants` expand one [[games]] table into runs named
GAME[/VARIANT][/sSEED], in a fair order; every bad matrix is one error naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.config import ConfigError, load_config, split_run_name

HEAD = """\
state_dir = "state"
[modes.light]
num_envs = 4
batch_size = 128
n_steps = 64
max_concurrent = 2
"""


def game(name: str, body: str = "", env_id: str = "CartPole-v1") -> str:
    return f'[[games]]\nname = "{name}"\nenv_id = "{env_id}"\ntotal_steps = 1000\n{body}\n'


def load(tmp_path: Path, *games: str) -> list:  # type: ignore[type-arg]
    path = tmp_path / "rlsup.toml"
    path.write_text(HEAD + "".join(games))
    return list(load_config(path).games)


def test_seeds_expand_to_one_run_each_named_by_seed(tmp_path: Path) -> None:
    runs = load(tmp_path, game("pong", "seeds = [3, 1, 2]"))
    assert [(g.name, g.seed, g.group) for g in runs] == [
        ("pong/s3", 3, "pong"),
        ("pong/s1", 1, "pong"),
        ("pong/s2", 2, "pong"),
    ]
    assert all(g.table == 0 for g in runs)


def test_variants_merge_over_the_games_args_and_name_the_runs(tmp_path: Path) -> None:
    body = (
        "seeds = [1, 2]\nargs = { learning_rate = 1e-3, ent_coef = 0.02 }\n"
        "[games.variants]\nbase = {}\nlr3 = { learning_rate = 3e-4 }\n"
    )
    runs = load(tmp_path, game("pong", body))
    assert [g.name for g in runs] == ["pong/base/s1", "pong/lr3/s1", "pong/base/s2", "pong/lr3/s2"]
    by = {g.name: g.args_dict for g in runs}
    assert by["pong/base/s1"] == {"learning_rate": 1e-3, "ent_coef": 0.02}
    assert by["pong/lr3/s2"] == {"learning_rate": 3e-4, "ent_coef": 0.02}
    assert {g.group for g in runs} == {"pong/base", "pong/lr3"}


def test_variants_without_seeds_keep_the_games_seed(tmp_path: Path) -> None:
    runs = load(tmp_path, game("pong", "seed = 7\nvariants = { a = {}, b = { gamma = 0.9 } }"))
    assert [(g.name, g.seed) for g in runs] == [("pong/a", 7), ("pong/b", 7)]


def test_runs_are_queued_round_robin_over_games(tmp_path: Path) -> None:
    """Every game's first seed comes before any game's second (the queue's start order)."""
    runs = load(
        tmp_path,
        game("a", "seeds = [1, 2, 3]"),
        game("b", "seeds = [1, 2]"),
        game("c"),
    )
    assert [g.name for g in runs] == ["a/s1", "b/s1", "c", "a/s2", "b/s2", "a/s3"]


def test_split_run_name() -> None:
    assert split_run_name("pong/lr3/s12") == ("pong/lr3", 12)
    assert split_run_name("pong/s2") == ("pong", 2)
    assert split_run_name("pong/lr3") == ("pong/lr3", None)
    assert split_run_name("s2") == ("s2", None)  # a plain game may be named like a seed part


def test_a_command_game_takes_seeds(tmp_path: Path) -> None:
    text = '[[games]]\nname = "mine"\ncommand = ["/bin/true"]\nseeds = [1, 2]\n'
    runs = load(tmp_path, text)
    assert [(g.name, g.seed, g.kind) for g in runs] == [
        ("mine/s1", 1, "command"),
        ("mine/s2", 2, "command"),
    ]


BAD = [
    ("duplicate seed", game("pong", "seeds = [1, 2, 1]"), ["games[0].seeds", "1 appears twice"]),
    ("empty seeds", game("pong", "seeds = []"), ["games[0].seeds", "at least one seed"]),
    ("seed and seeds", game("pong", "seed = 1\nseeds = [1, 2]"), ["games[0].seed", "one of them"]),
    ("negative seed", game("pong", "seeds = [-1]"), ["games[0].seeds", "-1"]),
    ("bool seed", game("pong", "seeds = [true]"), ["games[0].seeds"]),
    (
        "supervisor-owned flag in a variant",
        game("pong", "[games.variants]\nbig = { num_envs = 64 }"),
        ["games[0].variants.big.num_envs", "set by the supervisor", "[modes.<name>] num_envs"],
    ),
    (
        "unknown hyper-parameter in a variant",
        game("pong", "[games.variants]\nx = { learning_rat = 1e-3 }"),
        ["games[0].variants.x.learning_rat", "did you mean learning_rate"],
    ),
    (
        "bad value in a variant",
        game("pong", "[games.variants]\nx = { learning_rate = -1.0 }"),
        ["games[0].variants.x.learning_rate"],
    ),
    (
        "a variant named like a seed",
        game("pong", "[games.variants]\ns2 = {}"),
        ["games[0].variants.s2", "seed part"],
    ),
    (
        "a variant that is not a table",
        game("pong", "[games.variants]\nx = 3"),
        ["games[0].variants.x", "got 3"],
    ),
    ("empty variants", game("pong", "variants = {}"), ["games[0].variants", "one variant"]),
    (
        "variants on a command game",
        '[[games]]\nname = "m"\ncommand = ["/bin/true"]\nvariants = { a = {} }\n',
        ["games[0].variants", "command game"],
    ),
    (
        "a game named like another's runs' folder",
        game("pong") + game("pong", "seeds = [1]"),
        ["games[0].name", "'pong' is also the name of the runs"],
    ),
    (
        "the same matrix twice",
        game("pong", "seeds = [1]") + game("pong", "seeds = [1, 2]"),
        ["duplicate game name 'pong/s1'"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("case", "text", "needles"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_matrix_is_refused_naming_its_key(
    tmp_path: Path, case: str, text: str, needles: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rlsup.toml"
    path.write_text(HEAD + text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    for needle in [str(path), *needles]:
        assert needle in str(err.value), (case, str(err.value))
    with pytest.raises(SystemExit) as exc:
        main(["run", "--config", str(path)])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rlsup.toml"], "wrote something"


def test_an_invalid_variant_for_a_mode_names_the_run(tmp_path: Path) -> None:
    """A variant whose args do not fit a mode (PPO's minibatch must divide the rollout) is
    refused naming the run it would make."""
    path = tmp_path / "rlsup.toml"
    path.write_text(HEAD + game("pong", "seeds = [1]\nvariants = { odd = { n_steps = 33 } }"))
    with pytest.raises(ConfigError, match=r"games\[0\]: pong/odd/s1: invalid worker settings"):
        load_config(path)
