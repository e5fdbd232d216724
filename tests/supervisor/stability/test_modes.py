"""Effective modes (pins, automatic mode, initial mode) and the policy's seam."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from supervisor.config import Config, load_config
from supervisor.ledger import db
from supervisor.ledger.journal import Journal
from supervisor.ledger.recorder import Recorder
from supervisor.stability import modes
from tests.supervisor.config.test_config import GOOD


@pytest.fixture
def setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "c.toml").write_text(GOOD)
    cfg = load_config(tmp_path / "c.toml")
    return cfg, db.connect(cfg.state_dir)


def set_auto_mode(
    conn: sqlite3.Connection, cfg: Config, scope: str, mode: str, reasons: list[str], now: float
) -> bool:
    """The policy's step (a change, or None) and the loop's half (recorded by a Recorder)."""
    change = modes.auto_mode_change(conn, cfg, scope, mode, reasons, now)
    modes.record(Recorder(conn, Journal(conn), wall=time.time, steady=time.time), [change])
    return change is not None


def test_initial_mode_is_persisted_and_used(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, conn = setup
    assert modes.effective_mode(conn, cfg, "cart").name == "light"
    modes.ensure_initial_mode(conn, cfg, 1.0)
    assert db.get_mode(conn, "*")[0] == "light"


def test_precedence_game_pin_then_host_pin_then_automatic(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, conn = setup
    modes.ensure_initial_mode(conn, cfg, 1.0)
    assert set_auto_mode(conn, cfg, "cart", "heavy", ["calm for 1 h"], 2.0)
    # Unpinned: never above the host's automatic mode.
    assert modes.effective_mode(conn, cfg, "cart").name == "light"
    assert set_auto_mode(conn, cfg, "*", "heavy", ["calm for 1 h"], 2.5)
    assert modes.effective_mode(conn, cfg, "cart").name == "heavy"
    assert set_auto_mode(conn, cfg, "pong", "light", ["2 crashes"], 2.6)
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
    # The CLI writes the wish only: the supervisor records mode_pinned as it reads it.
    assert db.events(conn, kind="mode_pinned") == []
    assert [p.detail() for p in modes.PinWatch().read(conn)] == [
        {"scope": "*", "mode": "auto", "pinned": False},
        {"scope": "cart", "mode": "auto", "pinned": False},
    ]


def test_a_mode_change_records_a_scale_event_with_its_reasons(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, conn = setup
    modes.ensure_initial_mode(conn, cfg, 1.0)
    assert set_auto_mode(conn, cfg, "*", "heavy", ["calm"], 2.0)
    assert not set_auto_mode(conn, cfg, "*", "heavy", ["calm"], 3.0)
    assert set_auto_mode(conn, cfg, "*", "light", ["2 OOMs in 1 h"], 4.0)
    evs = db.events(conn, kind=["scale_up", "scale_down"])
    assert [(e.kind, e.detail["from"], e.detail["to"]) for e in evs] == [
        ("scale_up", "light", "heavy"),
        ("scale_down", "heavy", "light"),
    ]
    assert evs[1].detail["reasons"] == ["2 OOMs in 1 h"]
    with pytest.raises(ValueError, match="light, heavy"):
        modes.auto_mode_change(conn, cfg, "*", "turbo", [])


def test_a_mode_that_left_the_config_falls_back(setup) -> None:  # type: ignore[no-untyped-def]
    cfg, conn = setup
    db.set_mode(conn, "*", "vanished", 1.0, None)
    db.set_desired(conn, "cart", "vanished", True, 1.0)
    assert modes.effective_mode(conn, cfg, "cart").name == "light"
