"""`games.gpu`: "auto" (default), a visible GPU's position, or a list of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import ConfigError, load_config

BASE = """
state_dir = "state"
[modes.light]
num_envs = 2
batch_size = 8
max_concurrent = 2
[[games]]
name = "pong"
env_id = "Pong-v5"
total_steps = 1000
device = "{device}"
{gpu}
"""


def load(tmp_path: Path, gpu: str = "", device: str = "auto") -> tuple[int, ...] | None:
    path = tmp_path / "rlsup.toml"
    path.write_text(BASE.format(gpu=gpu, device=device))
    return load_config(path).games[0].gpu


def test_gpu_defaults_to_auto(tmp_path: Path) -> None:
    assert load(tmp_path) is None
    assert load(tmp_path, 'gpu = "auto"') is None


def test_gpu_takes_one_index_or_a_list(tmp_path: Path) -> None:
    assert load(tmp_path, "gpu = 1", "cuda") == (1,)
    assert load(tmp_path, "gpu = [2, 0]") == (2, 0)


@pytest.mark.parametrize(
    "value", ["-1", "[]", "[1, 1]", '"first"', "true", "1.5", "[0, -2]", '["0"]']
)
def test_a_bad_gpu_is_an_error_naming_the_key(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"gpu = {value}")
    assert "games[0].gpu" in str(err.value) and "auto" in str(err.value)


def test_gpu_on_a_cpu_game_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r'games\[0\]\.gpu: set on a game with device = "cpu"'):
        load(tmp_path, "gpu = 0", "cpu")
