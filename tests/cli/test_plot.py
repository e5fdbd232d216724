"""`rlsup plot`: a readable PNG of the learning curves; usage errors."""

from __future__ import annotations

from pathlib import Path

from conftest import Cli
from state_fixture import StateFixture

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png_that_decodes_and_is_not_blank(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "curves.png"
    r = cli("plot", "--out", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 20_000
    import matplotlib.image as mpimg

    img = mpimg.imread(out)
    assert img.shape[0] > 500 and img.shape[1] > 800
    assert float(img[..., :3].std()) > 0.05  # curves and text, not a blank canvas


def test_plot_defaults_to_state_dir_and_one_game(cli: Cli, state: StateFixture) -> None:
    r = cli("plot", "--game", "pong", timeout=120)
    assert r.returncode == 0, r.stderr
    assert (state.state_dir / "plot.png").read_bytes()[:8] == PNG_SIGNATURE


def test_plot_unknown_game_or_config_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    r = cli("plot", "--game", "nosuchgame")
    assert r.returncode == 2 and "unknown game" in r.stderr
    r = cli("plot", "--config", str(tmp_path / "none.toml"), config=False)
    assert r.returncode == 2 and "no configuration file" in r.stderr
