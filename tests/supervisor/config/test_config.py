"""Configuration: the example loads; each bad input: one clear message, exit 2, no writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.config import ConfigError, load_config, resolve_config_path

EXAMPLE = Path(__file__).resolve().parents[3] / "supervisor" / "example.toml"

GOOD = """\
state_dir = "state"
initial_mode = "light"

[modes.light]
num_envs = 4
batch_size = 128
n_steps = 64
max_concurrent = 1
[modes.heavy]
num_envs = 8
batch_size = 256
n_steps = 64
max_concurrent = 2

[[games]]
name = "cart"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = 1000

[[games]]
name = "pong"
env_id = "Pong-v5"
algo = "dqn"
total_steps = 1000
args = { learning_starts = 100 }

[stability]
ceiling = "heavy"
"""


def test_example_config_loads_and_state_dir_is_relative_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "rlsup.toml"
    path.parent.mkdir()
    path.write_text(EXAMPLE.read_text())
    cfg = load_config(path)
    assert cfg.state_dir == tmp_path / "sub" / "var" / "rlsup"
    assert cfg.mode_names == ("light", "medium", "heavy")
    assert [g.env_id for g in cfg.games] == ["CartPole-v1", "Pong-v5", "Breakout-v5"]
    assert cfg.mode("light").num_envs <= 8


def test_defaults_fill_missing_sections(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(GOOD)
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.restart.budget == 5 and cfg.watchdog.hang_timeout_s == 120
    assert cfg.game("pong").args_dict == {"learning_starts": 100}
    assert cfg.stability.ceiling == "heavy"


def test_the_default_checkpoint_interval_is_the_worker_contract_s(tmp_path: Path) -> None:
    """The parser keeps its own copy (status must not import training.protocol): the same."""
    from training.args import WorkerConfig
    from training.protocol import DEFAULT_CHECKPOINT_EVERY_S

    (tmp_path / "c.toml").write_text(GOOD)
    assert "checkpoint_every_s" not in GOOD
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.checkpoint_every_s == DEFAULT_CHECKPOINT_EVERY_S == 15.0
    assert WorkerConfig().checkpoint_every_s == DEFAULT_CHECKPOINT_EVERY_S


def test_a_pqn_game_loads_and_its_minibatch_must_divide_the_rollout(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace('algo = "ppo"', 'algo = "pqn"', 1))
    assert load_config(path).game("cart").algo == "pqn"
    path.write_text(GOOD.replace('algo = "ppo"', 'algo = "pqn"', 1).replace("= 128", "= 100", 1))
    with pytest.raises(ConfigError, match="batch-size 100"):
        load_config(path)


def test_config_path_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLSUP_CONFIG", raising=False)
    assert resolve_config_path(None) == Path("rlsup.toml")
    monkeypatch.setenv("RLSUP_CONFIG", "/etc/x.toml")
    assert resolve_config_path(None) == Path("/etc/x.toml")
    assert resolve_config_path("a.toml") == Path("a.toml")


BAD = [
    ("unknown top key", ("state_dir", "stat_dir"), ["stat_dir", "unknown key", "state_dir"]),
    (
        "unknown section key",
        ('ceiling = "heavy"', 'ceilling = "heavy"'),
        ["stability.ceilling", "did you mean ceiling"],
    ),
    (
        "wrong type",
        ("num_envs = 4", 'num_envs = "four"'),
        ["line 5", "modes.light.num_envs", "'four'", "positive integer"],
    ),
    (
        "unknown env id",
        ("Pong-v5", "Pong-v4"),
        ["line 23", "games[1].env_id", "Pong-v4", "Pong-v5"],
    ),
    (  # a MuJoCo task with Atari's suffix (continuous actions: no learner of ours plays it)
        "continuous-control env id",
        ('env_id = "Pong-v5"', 'env_id = "Hopper-v5"'),
        ["line 23", "games[1].env_id", "Hopper-v5", "not a supported envpool task id"],
    ),
    (
        "initial mode not a mode",
        ('initial_mode = "light"', 'initial_mode = "turbo"'),
        ["initial_mode", "'turbo'", "light, heavy"],
    ),
    (
        "ceiling not a mode",
        ('ceiling = "heavy"', 'ceiling = "max"'),
        ["stability.ceiling", "'max'", "light, heavy"],
    ),
    ("duplicate game", ('name = "pong"', 'name = "cart"'), ["games[1].name", "duplicate", "cart"]),
    ("bad game name", ('name = "pong"', 'name = "../pong"'), ["games[1].name", "[a-z0-9_-]{1,40}"]),
    (
        "unknown hyper-parameter",
        ("learning_starts", "learnin_starts"),
        ["games[1].args.learnin_starts", "unknown hyper-parameter", "learning_starts"],
    ),
    (
        "supervisor-decided field in args",
        ("learning_starts = 100", "num_envs = 100"),
        ["games[1].args.num_envs", "line 26", "set by the supervisor", "modes"],
    ),
    # Every flag the supervisor builds the worker's argv with is its own (issue 24 #13).
    *[
        (
            f"supervisor-owned {key} in args",
            ("learning_starts = 100", f"{key} = {value}"),
            [f"games[1].args.{key}", "line 26", "set by the supervisor", source],
        )
        for key, value, source in [
            ("mirror_url", '"s3://elsewhere/x"', "[mirror]"),
            ("mirror_endpoint_url", '"http://evil:9000"', "[mirror]"),
            ("mirror_region", '"eu-west-1"', "[mirror]"),
            ("mirror_name", '"cart"', "[mirror]"),
            ("epoch", "7", "placement"),
            ("run_dir", '"/tmp/x"', "state_dir"),
            ("device", '"cuda"', "games.device"),
        ]
    ],
    (
        "tick_s far too long",
        ('initial_mode = "light"', 'initial_mode = "light"\ntick_s = 1e9'),
        ["line 3", "tick_s", "1000000000", "0.01..60"],
    ),
    (
        "tick_s far too short",
        ('initial_mode = "light"', 'initial_mode = "light"\ntick_s = 1e-9'),
        ["tick_s", "1e-09", "0.01..60"],
    ),
    ("bad algo", ('algo = "dqn"', 'algo = "a2c"'), ["games[1].algo", "dqn | ppo"]),
    (
        "batch not dividing the PPO rollout",
        ("batch_size = 128", "batch_size = 100"),
        ["games[0]", "batch-size 100", "light"],
    ),
    # Right TOML type for TOML, wrong for the worker: refused where written (issue 10).
    (
        "bool arg given a string",
        ("learning_starts = 100", 'dueling = "yes"'),
        ["games[1].args.dueling", "'yes'", "true or false"],
    ),
    (
        "int arg given a float",
        ("learning_starts = 100", "learning_starts = 1.5"),
        ["games[1].args.learning_starts", "1.5", "an integer"],
    ),
    (
        "string arg given an int",
        ("learning_starts = 100", "net_arch = 5"),
        ["games[1].args.net_arch", "5", "a string"],
    ),
    (
        "float arg given a string",
        ("learning_starts = 100", 'lr_step_gamma = "abc"'),
        ["games[1].args.lr_step_gamma", "'abc'", "a finite number"],
    ),
    (
        "float arg out of range",
        ("learning_starts = 100", "lr_step_gamma = 1.5"),
        ["games[1].args.lr_step_gamma", "1.5", "(0, 1]"],
    ),
    (
        "non-finite arg",
        ("learning_starts = 100", "learning_rate = nan"),
        ["games[1].args.learning_rate", "nan", "a finite number"],
    ),
    (
        "negative seed",
        ('algo = "dqn"', 'algo = "dqn"\nseed = -1'),
        ["games[1].seed", "-1", "an integer >= 0"],
    ),
    (
        "infinite duration",
        ('initial_mode = "light"', 'initial_mode = "light"\nstop_grace_s = inf'),
        ["stop_grace_s", "inf", "a finite number"],
    ),
    (
        "nan duration in a section",
        ('ceiling = "heavy"', 'ceiling = "heavy"\ncooldown_s = nan'),
        ["stability.cooldown_s", "nan", "a finite number"],
    ),
    (
        "ray backend without a mirror",
        ('ceiling = "heavy"', 'ceiling = "heavy"\n[cluster]\nbackend = "ray"'),
        ["cluster.backend", "[mirror]"],
    ),
    (
        "unknown backend",
        ('ceiling = "heavy"', 'ceiling = "heavy"\n[cluster]\nbackend = "slurm"'),
        ["cluster.backend", "slurm", '"local" or "ray"'],
    ),
    (
        "bad head address",
        ('ceiling = "heavy"', 'ceiling = "heavy"\n[cluster]\naddress = "head"'),
        ["cluster.address", "head", "host:port"],
    ),
    (
        "toml syntax",
        ("total_steps = 1000\n\n[[games]]", "total_steps = = 1000\n\n[[games]]"),
        ["not valid TOML", "line 19"],
    ),
]


@pytest.mark.parametrize(("case", "edit", "needles"), BAD, ids=[b[0] for b in BAD])
def test_bad_config_exits_2_naming_file_key_and_value(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    edit: tuple[str, str],
    needles: list[str],
) -> None:
    path = tmp_path / "c.toml"
    assert edit[0] in GOOD
    path.write_text(GOOD.replace(edit[0], edit[1], 1))
    with pytest.raises(ConfigError):
        load_config(path)
    with pytest.raises(SystemExit) as exc:
        main(["run", "--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert str(path) in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"], "wrote something"


@pytest.mark.parametrize(
    "text", ["", 'state_dir = "x"\n[modes.a]\nnum_envs=1\nbatch_size=1\nmax_concurrent=1\n']
)
def test_missing_modes_or_games_is_a_config_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(ConfigError, match="missing"):
        load_config(tmp_path / "c.toml")


def test_missing_file_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["scale", "--mode", "light", "--config", str(tmp_path / "nope.toml")])
    assert exc.value.code == 2
    assert "nope.toml" in capsys.readouterr().err


def test_cluster_table_defaults_to_this_host_and_reads_the_ray_backend(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    assert load_config(path).cluster.backend == "local"
    path.write_text(
        GOOD + '[mirror]\nurl = "s3://rlsup-bucket/p"\n[cluster]\nbackend = "ray"\n'
        'address = "10.0.0.1:6379"\ncpus_per_game = 2\ngpus_per_game = 0.5\n'
    )
    c = load_config(path).cluster
    assert (c.backend, c.address, c.cpus_per_game, c.gpus_per_game) == (
        "ray",
        "10.0.0.1:6379",
        2.0,
        0.5,
    )


def test_every_supervisor_owned_worker_flag_names_where_it_is_set() -> None:
    """The refusal of a supervisor-owned flag in `args` names the key to set instead."""
    from supervisor.config import games
    from training import args

    assert set(games.SET_FROM) == args.SUPERVISOR_FIELDS
    assert args.SUPERVISOR_FIELDS | args.HYPERPARAMETER_FIELDS == args.WORKER_FIELDS


def test_a_game_may_still_override_its_rollout_length_and_checkpoint_interval(
    tmp_path: Path,
) -> None:
    """`n_steps` and `checkpoint_every_s` in a game's args load, as they always did, and win
    over the mode's and the file's; the flags the supervisor owns still win over args."""
    from supervisor.config import worker_config

    text = GOOD.replace(
        "args = { learning_starts = 100 }",
        "args = { learning_starts = 100, n_steps = 32, checkpoint_every_s = 900 }",
    )
    (tmp_path / "c.toml").write_text(text)
    cfg = load_config(tmp_path / "c.toml")
    pong = next(g for g in cfg.games if g.name == "pong")
    wc = worker_config(pong, cfg.mode("heavy"), tmp_path / "run", 300.0, threads=1)
    assert (wc.n_steps, wc.checkpoint_every_s, wc.learning_starts) == (32, 900.0, 100)
    assert (wc.num_envs, wc.run_dir) == (8, str(tmp_path / "run"))


def test_the_modes_batch_is_ppos_minibatch_and_dqn_keeps_its_own(tmp_path: Path) -> None:
    """A DQN game trains on its own batch (the field's 32, or `args.dqn_batch_size`), never
    on the mode's minibatch, and a mode change of the batch alone does not restart it."""
    from supervisor.config import worker_config

    text = GOOD.replace(
        "args = { learning_starts = 100 }", "args = { learning_starts = 100, dqn_batch_size = 64 }"
    )
    (tmp_path / "c.toml").write_text(text)
    cfg = load_config(tmp_path / "c.toml")
    cart, pong = cfg.games
    light, heavy = cfg.mode("light"), cfg.mode("heavy")
    for mode in (light, heavy):
        wc = worker_config(pong, mode, tmp_path / "pong", 300.0, threads=1)
        assert (wc.batch_size, wc.train_batch_size()) == (None, 64)
        assert pong.mode_batch(mode) is None
    assert worker_config(cart, heavy, tmp_path / "c", 300.0, threads=1).train_batch_size() == 256
    same_envs = type(heavy)(name="x", num_envs=8, batch_size=512, n_steps=32, max_concurrent=1)
    assert pong.knob_values(same_envs) == pong.knob_values(heavy)
    assert cart.knob_values(same_envs) != cart.knob_values(heavy)


def test_the_config_package_hands_on_every_name_the_module_had() -> None:
    """`from supervisor.config import X` (the package's lazy re-exports, issue 41): each name
    comes from its own module on first use, and the map is the list type checkers are told."""
    import ast
    import importlib

    import supervisor.config as package

    tree = ast.parse(Path(str(package.__file__)).read_text())
    typed = {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("supervisor.config.")
        for alias in node.names
    }
    assert typed == set(package._WHERE)
    for name, module in package._WHERE.items():
        home = importlib.import_module(f"supervisor.config.{module}")
        assert getattr(package, name) is getattr(home, name)
    with pytest.raises(AttributeError):
        _ = package.no_such_name
