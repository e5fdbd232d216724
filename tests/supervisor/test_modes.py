"""Effective modes (pins, automatic mode, initial mode) and the policy's seam."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import load_config
from supervisor.ledger import db
from supervisor.stability import modes
from tests.supervisor.test_config import GOOD


@pytest.fixture
def setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "c.toml").write_text(GOOD)
    cfg = load_config(tmp_path / "c.toml")
    return cfg, db.connect(cfg.state_dir)


def test_initial_mode_is_persisted_and_used(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, conn = setup
    assert modes.effective_mode(conn, cfg, "cart").name == "light"
    modes.ensure_initial_mode(conn, cfg, 1.0)
    assert db.get_mode(conn, "*")[0] == "light"


def test_precedence_game_pin_then_host_pin_then_automatic(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, conn = setup
    modes.ensure_initial_mode(conn, cfg, 1.0)
    assert modes.set_auto_mode(conn, cfg, "cart", "heavy", ["calm for 1 h"], 2.0)
    # Unpinned: never above the host's automatic mode.
    assert modes.effective_mode(conn, cfg, "cart").name == "light"
    assert modes.set_auto_mode(conn, cfg, "*", "heavy", ["calm for 1 h"], 2.5)
    assert modes.effective_mode(conn, cfg, "cart").name == "heavy"
    assert modes.set_auto_mode(conn, cfg, "pong", "light", ["2 crashes"], 2.6)
    assert modes.effective_mode(conn, cfg, "pong").name == "light"
    modes.pin_mode(conn, cfg, "*", "light", 3.0)
    assert modes.effective_mode(conn, cfg, "cart").name == "light"
    assert modes.host_mode(conn, cfg).max_concurrent == 1
    modes.pin_mode(conn, cfg, "cart", "heavy", 4.0)
    assert modes.effective_mode(conn, cfg, "cart").name == "heavy"
    modes.pin_mode(conn, cfg, "*", "auto", 5.0)
    modes.pin_mode(conn, cfg, "cart", "auto", 5.0)
    assert modes.effective_mode(conn, cfg, "cart").name == "heavy"  # the automatic one again
    assert modes.effective_mode(conn, cfg, "pong").name == "light"
    assert db.get_desired(conn, "cart") == ("auto", False)
    assert [e.detail["mode"] for e in db.events(conn, kind="mode_pinned")] == [
        "light",
        "heavy",
        "auto",
        "auto",
    ]


def test_set_auto_mode_emits_scale_events_with_reasons(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, conn = setup
    modes.ensure_initial_mode(conn, cfg, 1.0)
    assert modes.set_auto_mode(conn, cfg, "*", "heavy", ["calm"], 2.0)
    assert not modes.set_auto_mode(conn, cfg, "*", "heavy", ["calm"], 3.0)
    assert modes.set_auto_mode(conn, cfg, "*", "light", ["2 OOMs in 1 h"], 4.0)
    evs = db.events(conn, kind=["scale_up", "scale_down"])
    assert [(e.kind, e.detail["from"], e.detail["to"]) for e in evs] == [
        ("scale_up", "light", "heavy"),
        ("scale_down", "heavy", "light"),
    ]
    assert evs[1].detail["reasons"] == ["2 OOMs in 1 h"]
    with pytest.raises(ValueError, match="light, heavy"):
        modes.set_auto_mode(conn, cfg, "*", "turbo", [])


def test_a_mode_that_left_the_config_falls_back(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, conn = setup
    db.set_mode(conn, "*", "vanished", 1.0, None)
    db.set_desired(conn, "cart", "vanished", True, 1.0)
    assert modes.effective_mode(conn, cfg, "cart").name == "light"
