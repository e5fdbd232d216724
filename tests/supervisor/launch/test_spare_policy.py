"""The spare worker's pure parts: when a host keeps one, which starts it may serve, its
configuration, and how a retitled worker's command line is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import ConfigError, load_config
from supervisor.launch.spare import argv_device, decide, device_matches, spare_device
from supervisor.launch.spawn import process_argv
from tests.supervisor.config.test_config import GOOD

TOTAL_MB = 24_000.0


def want(
    enabled: bool | str = "auto",
    *,
    avail: float | None = 50.0,
    rss: float | None = 400.0,
    have: bool = False,
    lowest: bool = False,
    floor: float = 20.0,
) -> tuple[bool, str]:
    return decide(
        enabled,
        floor,
        ram_available_pct=avail,
        ram_total_mb=TOTAL_MB,
        spare_rss_mb=rss,
        have_spare=have,
        lowest_rung=lowest,
    )


def test_auto_keeps_a_spare_on_a_calm_host_with_memory_to_spare() -> None:
    assert want()[0] is True
    assert want(have=True)[0] is True


def test_auto_drops_the_spare_under_memory_pressure_counting_its_own_rss() -> None:
    ok, why = want(avail=15.0)
    assert not ok and "memory pressure" in why and "min_ram_available_pct = 20" in why
    # 21% available and no spare yet: its 2,400 MB (10% of 24,000) would leave 11%: no spare.
    assert want(avail=21.0, rss=2400.0)[0] is False
    # The same 21% with that spare running (its RSS already taken): it stays.
    assert want(avail=21.0, rss=2400.0, have=True)[0] is True
    # Never measured: the expected size is counted.
    assert want(avail=20.5, rss=None)[0] is False


def test_auto_drops_the_spare_at_the_lowest_rung_and_without_a_memory_reading() -> None:
    ok, why = want(lowest=True)
    assert not ok and "lowest mode" in why
    ok, why = want(avail=None)
    assert not ok and "no memory reading" in why


def test_explicit_settings_override_the_policy() -> None:
    assert want(True, avail=1.0, lowest=True)[0] is True
    assert want(False)[0] is False


def test_devices() -> None:
    assert spare_device(["cpu", "cpu"]) == "cpu"
    assert spare_device(["cpu", "auto"]) == "cuda"
    assert device_matches("cpu", "cpu") and device_matches("cuda", "cuda")
    assert device_matches("cpu", "auto") and device_matches("cuda", "auto")
    assert not device_matches("cuda", "cpu") and not device_matches("cpu", "cuda")
    assert argv_device(["--run-dir", "x", "--device", "cpu", "--seed", "1"]) == "cpu"
    assert argv_device(["--run-dir", "x"]) == "auto"  # to_argv leaves the default out


def test_a_retitled_command_line_reads_as_the_argv() -> None:
    retitled = ["/usr/bin/python -P -m training.worker --run-dir /s/runs/g0", "", "", ""]
    assert process_argv(retitled) == [
        "/usr/bin/python", "-P", "-m", "training.worker", "--run-dir", "/s/runs/g0"
    ]  # fmt: skip
    plain = ["/usr/bin/python", "-P", "-m", "training.worker", "--run-dir", "/s/runs/g 0"]
    assert process_argv(plain) == plain


def test_spare_table_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    assert load_config(path).spare.enabled == "auto"
    for value, parsed in (("true", True), ("false", False), ('"auto"', "auto")):
        path.write_text(GOOD + f"[spare]\nenabled = {value}\nmin_ram_available_pct = 35\n")
        cfg = load_config(path)
        assert cfg.spare.enabled == parsed and cfg.spare.min_ram_available_pct == 35.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('enabled = "yes"', "spare.enabled: got 'yes'; expected true, false or \"auto\""),
        ("enabled = 1", "spare.enabled: got 1"),
        ("min_ram_available_pct = 100", "spare.min_ram_available_pct: got 100"),
        ("min_ram_available_pct = nan", "spare.min_ram_available_pct: got nan"),
        ("spares = 2", "spare.spares"),
    ],
)
def test_bad_spare_values_are_refused_naming_the_key(
    tmp_path: Path, body: str, message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD + f"[spare]\n{body}\n")
    with pytest.raises(ConfigError, match="line") as err:
        load_config(path)
    assert message in str(err.value)
