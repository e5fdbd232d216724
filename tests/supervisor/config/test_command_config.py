"""Command games in the configuration (docs/own-trainer.md): what loads, what is refused (one
message naming the file, the key and the value), and what the spawn of one is given. No
supervisor runs here: tests/supervisor/daemon/test_command_games.py drives real ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.config import ConfigError, GameSpec, ModeSpec, load_config
from tests.supervisor.config.test_config import GOOD
from training import protocol as P

COMMAND = """
[[games]]
name = "mine"
command = ["python", "train.py", "--lr", "3e-4"]
"""


def write(tmp: Path, extra: str, base: str = GOOD) -> Path:
    path = tmp / "c.toml"
    path.write_text(base + extra)
    return path


def test_a_command_game_loads_with_its_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, COMMAND))
    game = cfg.game("mine")
    assert game.kind == "command" and cfg.game("cart").kind == "builtin"
    assert game.command == ("python", "train.py", "--lr", "3e-4")
    assert (game.cwd, game.env, game.heartbeat, game.knobs) == (None, (), False, ())
    assert (game.total_steps, game.seed, game.device, game.gpu) == (0, 1, "auto", None)
    assert game.args == ()


def test_a_command_games_keys_load(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    extra = COMMAND + (
        'cwd = "work"\nenv = { WANDB_MODE = "offline", MY_FLAG = "1" }\nheartbeat = true\n'
        'knobs = ["num_envs", "batch_size"]\ntotal_steps = 5000\nseed = 9\ndevice = "cpu"\n'
    )
    game = load_config(write(tmp_path, extra)).game("mine")
    assert game.cwd == str(tmp_path / "work")  # relative to the file, absolute once loaded
    assert game.env == (("MY_FLAG", "1"), ("WANDB_MODE", "offline"))
    assert (game.heartbeat, game.knobs) == (True, ("num_envs", "batch_size"))
    assert (game.total_steps, game.seed, game.device) == (5000, 9, "cpu")


def test_a_missing_program_is_no_load_error(tmp_path: Path) -> None:
    """The file may be shared by hosts: a program not here is the game's start failure."""
    extra = '[[games]]\nname = "mine"\ncommand = ["/nonexistent/train", "x"]\n'
    assert load_config(write(tmp_path, extra)).game("mine").command == ("/nonexistent/train", "x")
    extra = '[[games]]\nname = "mine"\ncommand = ["no-such-program-rlsup"]\n'
    assert load_config(write(tmp_path, extra)).game("mine").command == ("no-such-program-rlsup",)


BAD = [
    ("both env_id", COMMAND + 'env_id = "CartPole-v1"\n', ["games[2].env_id", "command"]),
    ("both algo", COMMAND + 'algo = "ppo"\n', ["games[2].algo", "command"]),
    ("args", COMMAND + "args = { learning_starts = 1 }\n", ["games[2].args", "command"]),
    ("neither", '[[games]]\nname = "x"\ntotal_steps = 10\n', ["games[2].env_id", "command"]),
    ("empty command", '[[games]]\nname = "x"\ncommand = []\n', ["games[2].command", "[]"]),
    (
        "command string",
        '[[games]]\nname = "x"\ncommand = "python t.py"\n',
        ["games[2].command", "'python t.py'", "list of strings"],
    ),
    (
        "command not strings",
        '[[games]]\nname = "x"\ncommand = ["python", 3]\n',
        ["games[2].command", "['python', 3]"],
    ),
    ("RLSUP_ env", COMMAND + 'env = { RLSUP_SEED = "3" }\n', ["games[2].env.RLSUP_SEED", "remove"]),
    (
        "CUDA env",
        COMMAND + 'env = { CUDA_VISIBLE_DEVICES = "0" }\n',
        ["games[2].env.CUDA_VISIBLE_DEVICES", "supervisor"],
    ),
    ("env not a string", COMMAND + "env = { N = 3 }\n", ["games[2].env.N", "N = 3", "string"]),
    ("env not a table", COMMAND + 'env = ["A=1"]\n', ["games[2].env", "['A=1']"]),
    ("heartbeat not bool", COMMAND + 'heartbeat = "yes"\n', ["games[2].heartbeat", "'yes'"]),
    ("unknown knob", COMMAND + 'knobs = ["n_steps"]\n', ["games[2].knobs", "['n_steps']"]),
    ("repeated knob", COMMAND + 'knobs = ["num_envs", "num_envs"]\n', ["games[2].knobs"]),
    ("negative steps", COMMAND + "total_steps = -1\n", ["games[2].total_steps", "-1"]),
    ("cwd not a string", COMMAND + "cwd = 3\n", ["games[2].cwd", "3"]),
    ("unknown key", COMMAND + 'workdir = "."\n', ["games[2].workdir", "unknown key"]),
    ("gpu on cpu", COMMAND + 'device = "cpu"\ngpu = 0\n', ["games[2].gpu", "cpu"]),
    ("duplicate name", COMMAND.replace('"mine"', '"cart"'), ["games[2].name", "duplicate"]),
]


@pytest.mark.parametrize(("case", "extra", "needles"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_command_game_is_one_message_naming_file_key_and_value(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    extra: str,
    needles: list[str],
) -> None:
    path = write(tmp_path, extra)
    with pytest.raises(ConfigError):
        load_config(path)
    with pytest.raises(SystemExit) as exc:
        main(["check-config", "--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert str(path) in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_a_command_game_loads_on_the_ray_backend(tmp_path: Path) -> None:
    """Command games run on several hosts too (docs/own-trainer.md): no refusal; the mirror
    that moves a game between hosts is still required."""
    ray = '[mirror]\nurl = "s3://rlsup-bucket/p"\n[cluster]\nbackend = "ray"\n'
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace("[stability]", COMMAND.lstrip() + "[stability]") + ray)
    cfg = load_config(path)
    assert cfg.cluster.backend == "ray"
    [mine] = [g for g in cfg.games if g.name == "mine"]
    assert mine.command == ("python", "train.py", "--lr", "3e-4"), mine.command
    no_mirror = path.read_text().replace('[mirror]\nurl = "s3://rlsup-bucket/p"\n', "")
    path.write_text(no_mirror)
    with pytest.raises(ConfigError, match=r"cluster\.backend.*\[mirror\]"):
        load_config(path)


def test_check_runs_match_skips_a_command_game(tmp_path: Path) -> None:
    """A command game's run dir holds the script's checkpoints (no env id or algo of ours)."""
    from checkpoints import CheckpointStore
    from supervisor.config import check_runs_match

    cfg = load_config(write(tmp_path, COMMAND))
    store = CheckpointStore(cfg.run_dir("mine") / P.CHECKPOINT_DIR)
    with store.begin(100, {"game": "Whatever-v0", "algo": "sac"}) as writer:
        writer.write_bytes("x", b"1")
        writer.commit()
    assert store.newest_meta() is not None
    check_runs_match(cfg)  # no ConfigError


def test_knob_values_decide_a_command_games_restart_on_a_mode_change() -> None:
    light, heavy = ModeSpec("light", 4, 128, 64, 1), ModeSpec("heavy", 8, 128, 128, 2)
    base = dict(name="g", env_id="", algo="command", total_steps=0, seed=1, device="cpu")
    fixed = GameSpec(**base, command=("t",), knobs=())  # type: ignore[arg-type]
    envs = GameSpec(**base, command=("t",), knobs=("num_envs",))  # type: ignore[arg-type]
    batch = GameSpec(**base, command=("t",), knobs=("batch_size",))  # type: ignore[arg-type]
    builtin = GameSpec("b", "CartPole-v1", "ppo", 10, 1, "cpu")
    assert fixed.knob_values(light) == fixed.knob_values(heavy)  # never restarted
    assert envs.knob_values(light) != envs.knob_values(heavy)
    assert batch.knob_values(light) == batch.knob_values(heavy)  # only n_steps differs
    assert builtin.knob_values(light) != builtin.knob_values(heavy)


@pytest.mark.e2e  # it starts a process (the probe of a command's interpreter, systemd)
def test_init_byo_writes_a_config_that_loads_and_a_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rlsup.toml"
    assert main(["init", "--example", "byo", str(path)]) == 0
    assert (tmp_path / "train.py").is_file()
    assert main(["check-config", "--config", str(path)]) == 0, capsys.readouterr()
    (game,) = load_config(path).games
    assert game.kind == "command" and game.command == (sys.executable, "train.py")
    assert game.cwd == str(tmp_path) and game.heartbeat and game.knobs == ("num_envs",)
    assert json.loads(json.dumps(dict(game.env)))  # a plain table of strings
    # A second init keeps what is there.
    assert main(["init", "--example", "byo", str(path)]) == 1


def test_worker_config_is_for_builtin_games_only(tmp_path: Path) -> None:
    from supervisor.config import worker_config

    cfg = load_config(write(tmp_path, COMMAND))
    with pytest.raises(ValueError, match="'mine' is a command game"):
        worker_config(cfg.game("mine"), cfg.mode("light"), tmp_path, 60.0, threads=1)
