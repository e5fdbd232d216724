"""`[tracking]` read and refused by key; the W&B environment a command game gets; `rlsup
tensorboard --print`; a run's parameters as the trackers get them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.config import ConfigError, load_config
from supervisor.participants.tracking import TrackingBridgeParticipant
from supervisor.tracking.sinks import RunFacts, mlflow_key
from supervisor.tracking.wandb import RUN_ID_FILE, wandb_env

BASE = """
state_dir = "state"
[modes.light]
num_envs = 2
batch_size = 8
max_concurrent = 1
[[games]]
name = "mine"
command = ["/bin/true"]
seeds = [1, 2]
[[games]]
name = "pong"
env_id = "CartPole-v1"
total_steps = 1000
device = "cpu"
"""


def load(tmp_path: Path, tracking: str = "") -> object:
    path = tmp_path / "rlsup.toml"
    path.write_text(BASE + tracking)
    return load_config(path)


def test_tracking_defaults_tensorboard_on_and_no_mlflow(tmp_path: Path) -> None:
    cfg = load(tmp_path)
    assert cfg.tracking.tensorboard and cfg.tracking.mlflow is None  # type: ignore[attr-defined]


def test_mlflow_defaults_to_a_sqlite_store_under_the_state_dir(tmp_path: Path) -> None:
    cfg = load(tmp_path, "[tracking]\nmlflow = {}\n")
    mlflow = cfg.tracking.mlflow  # type: ignore[attr-defined]
    assert mlflow.tracking_uri == f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}"
    assert mlflow.experiment == "rlsup"
    cfg = load(tmp_path, '[tracking]\nmlflow = { tracking_uri = "sqlite:///t/m.db" }\n')
    assert cfg.tracking.mlflow.tracking_uri == f"sqlite:///{tmp_path / 't' / 'm.db'}"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("tensorboard = 1", "tracking.tensorboard"),
        ('mlflow = "sqlite:///x.db"', "tracking.mlflow"),
        ('mlflow = { tracking_uri = "not a uri" }', "tracking.mlflow.tracking_uri"),
        ('mlflow = { tracking_uri = "sqlite://x.db" }', "tracking.mlflow.tracking_uri"),
        ('mlflow = { experiment = "" }', "tracking.mlflow.experiment"),
        ("mlflow = { uri = 1 }", "tracking.mlflow.uri"),
        ("wandb = true", "tracking.wandb"),
    ],
)
def test_a_bad_tracking_key_is_an_error_naming_it(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"[tracking]\n{text}\n")
    assert f"{where}:" in str(err.value)


def test_a_command_game_gets_one_wandb_run_for_its_life(tmp_path: Path) -> None:
    env = wandb_env("pong/lr3/s1", "pong/lr3", tmp_path, {}, {})
    assert env["WANDB_RESUME"] == "allow" and env["WANDB_RUN_GROUP"] == "pong/lr3"
    assert env["WANDB_NAME"] == "pong/lr3/s1"
    assert (tmp_path / RUN_ID_FILE).read_text().strip() == env["WANDB_RUN_ID"]
    assert wandb_env("pong/lr3/s1", "pong/lr3", tmp_path, {}, {}) == env  # the next start
    # What the game's env or the supervisor's environment sets wins.
    mine = wandb_env("x", "x", tmp_path, {"WANDB_RUN_ID": "abc"}, {"WANDB_RESUME": "never"})
    assert "WANDB_RUN_ID" not in mine and "WANDB_RESUME" not in mine
    (tmp_path / RUN_ID_FILE).write_text("../../etc\n")  # not an id: a new one replaces it
    assert wandb_env("x", "x", tmp_path, {}, {})["WANDB_RUN_ID"] != env["WANDB_RUN_ID"]


def test_rlsup_tensorboard_prints_every_run_with_event_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rlsup.toml"
    path.write_text(BASE)
    assert main(["tensorboard", "--config", str(path), "--print"]) == 1
    assert "no run" in capsys.readouterr().err
    for run in ("mine/s1", "pong"):
        (tmp_path / "state" / "runs" / run / "tb").mkdir(parents=True)
    assert main(["tensorboard", "--config", str(path), "--print", "--", "--port", "7007"]) == 0
    out = capsys.readouterr().out
    runs = tmp_path / "state" / "runs"
    assert f"--logdir_spec mine/s1:{runs}/mine/s1/tb,pong:{runs}/pong/tb --port 7007" in out


def test_the_trackers_params_are_the_runs_effective_params(tmp_path: Path) -> None:
    cfg = load(tmp_path)
    part = TrackingBridgeParticipant(cfg)  # type: ignore[arg-type]

    def of(name: str, kind: str) -> dict[str, object]:
        run = RunFacts(
            name=name, run_dir=cfg.run_dir(name), kind=kind, group=name, seed=1,  # type: ignore[attr-defined]
            done=False, committed=None, life=None, resumed_from=None,
        )  # fmt: skip
        return part.params_of(run)

    # A built-in game's wait for its first checkpoint: its resolved arguments, then.
    assert of("pong", "builtin") == {}
    ckpt = cfg.run_dir("pong") / "checkpoints" / "ckpt-000000000100"  # type: ignore[attr-defined]
    ckpt.mkdir(parents=True)
    resolved = {"learning_rate": 0.00025, "game": "CartPole-v1", "run_dir": "/x", "other": 1}
    (ckpt / "config.json").write_text(json.dumps(resolved))
    assert of("pong", "builtin") == {"game": "CartPole-v1", "learning_rate": 0.00025}
    assert of("gone", "builtin") == {}  # no longer configured
    assert mlflow_key("charts/x y:z") == "charts/x y:z" and mlflow_key("a..b@c") == "a_b_c"
