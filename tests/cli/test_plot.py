"""`rlsup plot`: a readable PNG of the learning curves; usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Cli

from harness.state_fixture import StateFixture

pytestmark = pytest.mark.e2e

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


def test_plot_seeds_draws_the_mean_and_band_of_a_games_seeds(tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    from supervisor.cli import main
    from supervisor.commands.plot import seed_band

    config = tmp_path / "rlsup.toml"
    config.write_text(
        'state_dir = "state"\n[modes.light]\nnum_envs = 4\nbatch_size = 128\n'
        "max_concurrent = 1\n"
        '[[games]]\nname = "cart"\nenv_id = "CartPole-v1"\ntotal_steps = 1000\n'
        "seeds = [1, 2, 3]\n"
    )
    # Three seeds' progress: returns k, 2k, 3k ... at steps 0..1000 (the third stops at 800).
    for seed, stop in ((1, 1000), (2, 1000), (3, 800)):
        run = tmp_path / "state" / "runs" / "cart" / f"s{seed}"
        run.mkdir(parents=True)
        rows = [f"{t},{step},{seed * step / 100}" for t, step in enumerate(range(0, stop + 1, 100))]
        (run / "progress.csv").write_text("time,global_step,mean_return\n" + "\n".join(rows))
    out = tmp_path / "seeds.png"
    assert main(["plot", "--config", str(config), "--seeds", "--out", str(out)]) == 0
    img = mpimg.imread(out)
    assert img.shape[0] > 200 and float(img[..., :3].std()) > 0.05
    from supervisor.commands.plot import _series
    from supervisor.observe import readonly

    runs = {f"s{k}": _series(readonly.read_progress(tmp_path / "state/runs/cart" / f"s{k}"))
            for k in (1, 2, 3)}  # fmt: skip
    band = seed_band(runs, points=5)
    assert band is not None
    grid, mean, lo, hi, n = band
    assert n == 3 and grid[0] == 0 and grid[-1] == 800  # up to where every seed got
    assert mean[-1] == pytest.approx((8 + 16 + 24) / 3) and (lo[-1], hi[-1]) == (8, 24)
    assert main(["plot", "--config", str(config), "--seeds", "--game", "nope"]) == 2
