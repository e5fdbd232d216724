"""`rlsup plot`: a readable PNG of the learning curves; usage errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Cli

from harness.state_fixture import SUPERSEDED, StateFixture, build_matrix_state, matrix_return

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


# ---- any metric, variants overlaid, seeds' mean and band, superseded points dropped ----------


def _matrix_panels(root: Path, metrics: list[str], x: str = "step") -> list[Any]:
    from supervisor.commands.plot import _events, panels
    from supervisor.config import load_config
    from supervisor.observe import curves as C

    fx = build_matrix_state(root)
    cfg = load_config(fx.config)
    runs = [(g.name, g.group) for g in cfg.games]
    read = {r: C.read_curve(cfg.run_dir(r), metrics) for r, _ in runs}
    return panels(C.group_runs(runs), read, metrics, x, _events(cfg.db_path))


def test_plot_overlays_variants_with_their_seeds_mean_and_band(tmp_path: Path) -> None:
    from supervisor.cli import main
    from supervisor.commands.plot import figure

    built = _matrix_panels(tmp_path / "m", ["mean_return", "policy_loss"])
    assert [(p.game, p.metric) for p in built] == [("cart", "mean_return"), ("cart", "policy_loss")]
    ret = built[0]
    means = [ln for ln in ret.lines if ln.role == "mean"]
    assert [ln.label for ln in means] == [
        "cart/base: mean of 3 seeds, min..max",
        "cart/lr3: mean of 3 seeds, min..max",
    ]
    assert len({ln.colour for ln in means}) == 2
    assert sum(ln.role == "run" for ln in ret.lines) == 6
    top = max(ln.y[-1] for ln in means)
    assert top == pytest.approx(sum(matrix_return(1, s, 1.0) for s in (1, 2, 3)) / 3, rel=1e-3)
    every_y = [y for p in built for ln in p.lines for y in ln.y + (ln.lo or [])]
    assert SUPERSEDED not in every_y  # the resumed run's redone steps are gone
    assert ret.markers  # the crash of cart/lr3/s2 is marked on its steps
    fig = figure(built)
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [ln.label for ln in means]
    assert len(ax.collections) >= 2  # one min..max band per variant
    assert ax.get_xlabel() == "agent steps" and ax.get_title() == "cart: mean_return"
    assert fig.axes[1].get_title() == "cart: policy_loss"
    import matplotlib.pyplot as plt

    plt.close(fig)
    config = tmp_path / "m" / "rlsup.toml"
    out = tmp_path / "metrics.png"
    argv = ["plot", "--config", str(config), "--metric", "policy_loss", "--metric", "my_metric"]
    assert main([*argv, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_SIGNATURE and out.stat().st_size > 20_000


def test_plot_against_wall_time_has_readable_ticks(tmp_path: Path) -> None:
    from supervisor.commands.plot import figure

    built = _matrix_panels(tmp_path / "m", ["mean_return"], x="time")
    assert all(ln.x[0] >= 0 for ln in built[0].lines)  # elapsed since each run's first point
    fig = figure(built)
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and all(lab[-1] in "smhd0123456789" for lab in labels), labels
    assert any(lab.endswith("m") or "m" in lab for lab in labels), labels  # minutes, not 1200.0
    assert not any("." in lab for lab in labels)
    assert ax.get_xlabel() == "wall time since the run's first point"
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_plot_unknown_metric_lists_the_runs_columns(tmp_path: Path, capsys: Any) -> None:
    from supervisor.cli import main

    fx = build_matrix_state(tmp_path / "m", bad_cells=2)
    config = str(fx.config)
    assert (
        main(["plot", "--config", config, "--metric", "nosuch", "--out", str(tmp_path / "x.png")])
        == 2
    )
    err = capsys.readouterr().err
    assert "unknown metric 'nosuch'" in err
    assert "policy_loss" in err and "my_metric" in err and "mean_return" in err
    assert not (tmp_path / "x.png").exists()
    out = tmp_path / "y.png"
    assert main(["plot", "--config", config, "--metric", "my_metric", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "my_metric: 2 cell(s)" in err and "Traceback" not in err  # counted, not a crash
    assert out.stat().st_size > 0
    # --game takes a [[games]] name, a variant or a run; --seeds still works
    assert main(["plot", "--config", config, "--game", "cart/lr3", "--out", str(out)]) == 0
    assert main(["plot", "--config", config, "--seeds", "--game", "cart/base/s1"]) == 0
    assert (fx.state_dir / "plot-seeds.png").is_file()
