"""The stability policy: pure, table-driven, with a fake clock (plain floats)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest

from supervisor.gpu.vitals import GpuVitals
from supervisor.stability.policy import (
    HOST,
    Decision,
    Incident,
    PolicyConfig,
    ScopeState,
    Vitals,
    decide,
    effective_mode,
    incident_from_event,
    resume_mode,
)

LADDER = ("light", "medium", "heavy")
CFG = PolicyConfig(ceiling="heavy", window_s=3600, calm_s=3600, cooldown_s=300)
T0 = 1_000_000.0  # the fake clock's epoch; every time below is T0 + offset
H = 3600.0


def healthy(ts: float, **kw: object) -> Vitals:
    base = Vitals(
        ts=ts, ram_available_pct=60.0, swap_used_pct=0.0, disk_free_pct=50.0, gpus=(gpu(),)
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def gpu(**kw: object) -> GpuVitals:
    base = GpuVitals(
        index=0, mem_used_mb=4000, mem_total_mb=80000, util_pct=90, temp_c=60, power_w=300
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def host(mode: str = "heavy", last_change: float | None = T0, pinned: bool = False) -> ScopeState:
    return ScopeState(HOST, mode, pinned, last_change)


def game(
    name: str, mode: str = "heavy", last_change: float | None = T0, pinned: bool = False
) -> ScopeState:
    return ScopeState(name, mode, pinned, last_change)


def crash(at: float, name: str, kind: str = "worker_crash", uptime_s: float = 600) -> Incident:
    return Incident(T0 + at, kind, name, uptime_s)


def reboot(at: float) -> Incident:
    return Incident(T0 + at, "host_reboot", None)


@dataclass
class Case:
    scopes: Sequence[ScopeState]
    incidents: Sequence[Incident] = ()
    at: float = 10.0  # seconds after T0
    vitals: Vitals | str | None = "healthy"
    cfg: PolicyConfig = field(default_factory=lambda: CFG)

    def run(self) -> dict[str, Decision]:
        now = T0 + self.at
        vitals = healthy(now) if self.vitals == "healthy" else self.vitals
        assert not isinstance(vitals, str)
        out = decide(LADDER, self.scopes, self.incidents, vitals, self.cfg, now)
        assert [d.scope for d in out] == [s.scope for s in self.scopes]
        for d in out:
            assert d.causes, f"{d} names no cause"
        return {d.scope: d for d in out}


def storm(start: float, n: int, games: Sequence[str] = ("pong",)) -> list[Incident]:
    return [crash(start + i, games[i % len(games)]) for i in range(n)]


# --- cooldown and calm --------------------------------------------------------------------


def test_storm_steps_host_down_one_rung_not_three() -> None:
    """A storm of spread failures over many ticks: one rung, then cooldown holds it."""
    incidents = storm(100, 30, games=("pong", "breakout", "qbert"))
    modes = {"heavy": 0}
    h = host("heavy", last_change=T0 - H)
    for tick in range(100, 400, 5):  # 5-minute storm, ticked every 5 s
        d = Case([h], [i for i in incidents if i.ts <= T0 + tick], at=tick).run()[HOST]
        if d.action == "down":
            h = ScopeState(HOST, d.to_mode, False, T0 + tick)
            modes[d.to_mode] = tick
    assert h.mode == "medium"
    assert list(modes) == ["heavy", "medium"]


def test_old_storm_does_not_step_again_after_cooldown() -> None:
    """Incidents before the last change were acted on: past the cooldown they do not count."""
    d = Case([host("medium", last_change=T0 + 200)], storm(100, 9, ("a", "b", "c")), at=900).run()
    assert d[HOST].action == "stay"


def test_new_failures_during_cooldown_stay_and_say_cooldown() -> None:
    d = Case([host("medium", last_change=T0 + 200)], storm(250, 6, ("a", "b")), at=300).run()
    assert d[HOST].action == "stay"
    assert any("cooldown" in c for c in d[HOST].causes)


def test_calm_hour_steps_up_one_rung() -> None:
    d = Case([host("light", last_change=T0)], at=H + 1).run()
    assert (d[HOST].action, d[HOST].to_mode) == ("up", "medium")


def test_calm_but_last_change_too_recent_stays() -> None:
    d = Case([host("light", last_change=T0)], at=H - 60).run()
    assert d[HOST].action == "stay"
    assert any("last change" in c for c in d[HOST].causes)


def test_recent_incident_blocks_step_up() -> None:
    d = Case([host("light", last_change=T0)], [crash(H, "pong")], at=H + 60).run()
    assert d[HOST].action == "stay"


def test_no_recorded_change_never_steps_up() -> None:
    d = Case([host("light", last_change=None)], at=10 * H).run()
    assert d[HOST].action == "stay"


def test_stale_vitals_block_step_up() -> None:
    d = Case([host("light")], at=H + 1, vitals=healthy(T0)).run()
    assert d[HOST].action == "stay"
    assert "no fresh vitals sample" in d[HOST].causes


def test_disk_nearly_full_blocks_step_up_but_does_not_step_down() -> None:
    d1 = Case([host("light")], at=H + 1, vitals=healthy(T0 + H + 1, disk_free_pct=2.0)).run()
    d2 = Case([host("heavy")], at=60, vitals=healthy(T0 + 60, disk_free_pct=2.0)).run()
    assert d1[HOST].action == "stay"
    assert d2[HOST].action == "stay"


# --- pins, ceiling, floor ------------------------------------------------------------------


@pytest.mark.parametrize(
    "incidents,at,vitals",
    [
        (storm(10, 6, ("a", "b")), 3 * H / 4, "healthy"),  # instability
        ((), 2 * H, "healthy"),  # calm
        ((), 10, healthy(T0 + 10, ram_available_pct=1.0)),  # pressure
    ],
    ids=["instability", "calm", "pressure"],
)
def test_pin_blocks_automation(incidents: list[Incident], at: float, vitals: Vitals) -> None:
    d = Case([host("medium", pinned=True)], incidents, at=at, vitals=vitals).run()
    assert d[HOST] == Decision(HOST, "stay", "medium", "medium", ("pinned",))


def test_pinned_game_is_not_changed() -> None:
    d = Case([host(), game("pong", "medium", pinned=True)], storm(400, 5), at=600).run()
    assert d["pong"].action == "stay"
    assert d["pong"].causes == ("pinned",)


def test_ceiling_respected_when_calm() -> None:
    cfg = replace(CFG, ceiling="medium")
    d = Case([host("medium")], at=5 * H, cfg=cfg).run()
    assert d[HOST].action == "stay"
    assert any("upper limit (medium)" in c for c in d[HOST].causes)


def test_mode_above_lowered_ceiling_goes_to_ceiling() -> None:
    cfg = replace(CFG, ceiling="light")
    d = Case([host("heavy")], at=10, cfg=cfg).run()
    assert (d[HOST].action, d[HOST].to_mode) == ("down", "light")


def test_floor_respected_and_says_why() -> None:
    d = Case([host("light", last_change=T0 - H)], [reboot(10), reboot(1200)], at=1300).run()
    assert d[HOST].action == "stay"
    assert d[HOST].to_mode == "light"
    assert any("lowest mode" in c for c in d[HOST].causes)
    assert any("2 unexpected reboots" in c for c in d[HOST].causes)


# --- per-game vs host scope -----------------------------------------------------------------


def test_one_game_failing_alone_steps_only_that_game() -> None:
    scopes = [host("heavy"), game("pong"), game("breakout")]
    d = Case(scopes, storm(400, 3, ("pong",)), at=500).run()
    assert (d["pong"].action, d["pong"].to_mode) == ("down", "medium")
    assert d[HOST].action == "stay"
    assert d["breakout"].action == "stay"


def test_failures_over_several_games_step_the_host_not_the_games() -> None:
    scopes = [host("heavy"), game("pong"), game("breakout")]
    d = Case(scopes, storm(400, 4, ("pong", "breakout")), at=500).run()
    assert (d[HOST].action, d[HOST].to_mode) == ("down", "medium")
    assert d["pong"].action == "stay"
    assert d["breakout"].action == "stay"


def test_two_failures_of_one_game_are_not_enough() -> None:
    d = Case([host(), game("pong")], storm(400, 2, ("pong",)), at=500).run()
    assert d["pong"].action == "stay"


def test_game_steps_down_from_its_effective_mode_under_the_host() -> None:
    """A game following a medium host is effectively medium: one rung down is light."""
    d = Case([host("medium"), game("pong", "heavy")], storm(400, 3), at=500).run()
    assert (d["pong"].from_mode, d["pong"].to_mode) == ("heavy", "light")


def test_game_never_climbs_above_the_host() -> None:
    d = Case([host("medium"), game("pong", "medium")], at=5 * H).run()
    assert d["pong"].action == "stay"
    assert any("follows the host" in c for c in d["pong"].causes)


def test_calm_game_below_host_steps_up_one_rung() -> None:
    d = Case([host("heavy"), game("pong", "light")], [crash(10, "other")], at=H + 20).run()
    assert (d["pong"].action, d["pong"].to_mode) == ("up", "medium")


def test_effective_mode_is_min_of_game_and_host_unless_pinned() -> None:
    assert effective_mode(LADDER, host("medium"), game("pong", "heavy")) == "medium"
    assert effective_mode(LADDER, host("medium"), game("pong", "light")) == "light"
    assert effective_mode(LADDER, host("light"), game("pong", "heavy", pinned=True)) == "heavy"


# --- reboots, pressure ----------------------------------------------------------------------


def test_two_reboots_in_an_hour_step_host_down() -> None:
    """The seed's host rebooted every 15-20 min under heavy load."""
    d = Case([host("heavy", last_change=T0 - H)], [reboot(0), reboot(1100)], at=1200).run()
    assert (d[HOST].action, d[HOST].to_mode) == ("down", "medium")
    assert "2 unexpected reboots in 3600s" in d[HOST].causes


def test_one_reboot_alone_does_not_step_but_blocks_step_up() -> None:
    d1 = Case([host("heavy", last_change=T0 - H)], [reboot(0)], at=60).run()
    d2 = Case([host("medium", last_change=T0 - H)], [reboot(0)], at=1800).run()
    assert d1[HOST].action == "stay"
    assert d2[HOST].action == "stay"


def test_reboots_a_window_apart_do_not_step() -> None:
    d = Case([host("heavy", last_change=T0 - 2 * H)], [reboot(0), reboot(H + 60)], at=H + 90).run()
    assert d[HOST].action == "stay"


def test_kernel_oom_kill_steps_host_down() -> None:
    d = Case([host("heavy"), game("pong")], [crash(400, "pong", "kernel_oom")], at=500).run()
    assert d[HOST].action == "down"
    assert d["pong"].action == "stay"


@pytest.mark.parametrize(
    "vitals,cause",
    [
        ({"ram_available_pct": 7.0}, "RAM available 7% < 10%"),
        ({"gpus": (gpu(mem_used_mb=79800),)}, "GPU 0 free memory 200 MB < 512 MB"),
        ({"gpus": (gpu(temp_c=91),)}, "GPU 0 temperature 91C > 85C"),
    ],
    ids=["ram", "gpu-memory", "gpu-temperature"],
)
def test_pressure_steps_host_down_before_any_failure(vitals: dict[str, object], cause: str) -> None:
    d = Case([host("heavy")], at=400, vitals=healthy(T0 + 400, **vitals)).run()
    assert (d[HOST].action, d[HOST].to_mode) == ("down", "medium")
    assert d[HOST].causes == (cause,)


def test_pressure_during_cooldown_stays() -> None:
    d = Case([host("medium")], at=100, vitals=healthy(T0 + 100, ram_available_pct=3.0)).run()
    assert d[HOST].action == "stay"


# --- worker OOM right after start -----------------------------------------------------------


def test_oom_right_after_start_steps_that_game_down() -> None:
    oom = crash(400, "pong", "worker_oom", uptime_s=20)
    d = Case([host("heavy"), game("pong"), game("breakout")], [oom], at=410).run()
    assert (d["pong"].action, d["pong"].to_mode) == ("down", "medium")
    assert d["breakout"].action == "stay"
    assert d[HOST].action == "stay"


def test_oom_right_after_start_at_new_size_steps_again_despite_cooldown() -> None:
    oom = crash(60, "pong", "worker_oom", uptime_s=20)
    d = Case([host("heavy"), game("pong", "medium", last_change=T0 + 30)], [oom], at=70).run()
    assert (d["pong"].action, d["pong"].to_mode) == ("down", "light")


def test_late_oom_alone_is_an_ordinary_failure() -> None:
    oom = crash(400, "pong", "worker_oom", uptime_s=3000)
    d = Case([host("heavy"), game("pong")], [oom], at=410).run()
    assert d["pong"].action == "stay"


# --- persisted mode after reboot ------------------------------------------------------------


@pytest.mark.parametrize(
    "persisted,initial,ceiling,expected",
    [
        ("light", "heavy", "heavy", "light"),  # the stepped-down mode, not the configured start
        ("heavy", "light", "medium", "medium"),  # never above the (possibly lowered) ceiling
        (None, "medium", "heavy", "medium"),  # nothing persisted: the configured start
        ("gone", "medium", "heavy", "medium"),  # a rung removed from the config
    ],
)
def test_resume_mode_after_reboot(
    persisted: str | None, initial: str, ceiling: str, expected: str
) -> None:
    assert resume_mode(LADDER, persisted, initial, ceiling) == expected


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        Case([host("turbo")]).run()


# --- events → incidents ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,detail,expected",
    [
        ("host_reboot", {}, "host_reboot"),
        ("worker_oom", {"returncode": 76, "uptime_s": 12}, "worker_oom"),
        ("worker_crash", {"returncode": 1}, "worker_crash"),
        # A SIGKILL that rlsup did not send is a crash unless the kernel says it was an OOM.
        ("worker_crash", {"returncode": -9}, "worker_crash"),
        ("worker_crash", {"returncode": -9, "kernel_oom": False}, "worker_crash"),
        ("worker_crash", {"returncode": -9, "killed_by_supervisor": True}, "worker_crash"),
        ("worker_oom", {"returncode": -9, "kernel_oom": True}, "kernel_oom"),
        ("worker_hang", {}, "worker_hang"),
        ("worker_start", {}, None),
        ("scale_down", {}, None),
    ],
)
def test_incident_from_event(kind: str, detail: dict[str, object], expected: str | None) -> None:
    incident = incident_from_event(5.0, kind, "pong", detail)
    assert (incident.kind if incident else None) == expected


def test_incident_from_event_carries_uptime() -> None:
    incident = incident_from_event(5.0, "worker_oom", "pong", {"uptime_s": 12})
    assert incident == Incident(5.0, "worker_oom", "pong", 12.0)
