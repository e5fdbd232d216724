"""`rlsup events`: filters, JSON form, usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Cli

from harness.state_fixture import StateFixture

pytestmark = pytest.mark.e2e


def events_json(cli: Cli, *args: str) -> list[dict]:
    r = cli("events", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_events_default_is_the_last_24h_newest_last(cli: Cli, state: StateFixture) -> None:
    found = events_json(cli)
    assert found, "the fixture has events in the last day"
    assert all(state.now - e["ts"] <= 86400 + 60 for e in found)
    assert [e["ts"] for e in found] == sorted(e["ts"] for e in found)
    assert set(found[0]) == {"ts", "kind", "game", "detail"}
    assert isinstance(found[0]["detail"], dict)


def test_events_since_widens_the_window(cli: Cli) -> None:
    day, week, hour = (
        events_json(cli, "--since", "24h"),
        events_json(cli, "--since", "8d"),
        events_json(cli, "--since", "90m"),
    )
    assert len(hour) < len(day) < len(week)
    assert len(week) == 2_000 + 3


def test_events_filter_by_game_and_kind(cli: Cli) -> None:
    pong = events_json(cli, "--since", "7d", "--game", "pong")
    assert pong and {e["game"] for e in pong} == {"pong"}
    reboots = events_json(cli, "--since", "7d", "--kind", "host_reboot")
    assert len(reboots) == 1 and reboots[0]["detail"]["downtime_s"] == 120
    both = events_json(
        cli, "--since", "7d", "--kind", "worker_crash", "--kind", "worker_oom", "--game", "pong"
    )
    assert both and {e["kind"] for e in both} <= {"worker_crash", "worker_oom"}


def test_events_human_form_has_readable_times(cli: Cli) -> None:
    r = cli("events", "--since", "7d", "--kind", "host_reboot")
    assert r.returncode == 0
    assert "host_reboot" in r.stdout and "previous_boot_id=fixture-boot-2" in r.stdout
    assert r.stdout.splitlines()[1][:4].isdigit()  # 2025-01-31 14:05:09


def test_events_bad_input_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    for args, words in [
        (("--since", "yesterday"), "bad duration"),
        (("--since", "7x"), "bad duration"),
        (("--game", "nosuchgame"), "unknown game"),
        (("--kind", "explosion"), "unknown event kind"),
    ]:
        r = cli("events", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert words in r.stderr
    r = cli("events", "--config", str(tmp_path / "none.toml"), config=False)
    assert r.returncode == 2 and "no configuration file" in r.stderr
