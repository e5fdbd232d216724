"""Per-GPU stability: a game is moved to a calmer GPU before its mode steps down (pure, with a
fake clock), and GPU pressure is attributed to the games on that GPU, not the host."""

from __future__ import annotations

from dataclasses import replace

from supervisor.gpu.moves import GpuMove, LastMove, PlacedGame
from supervisor.gpu.place import GpuId
from supervisor.gpu.vitals import GpuVitals
from supervisor.stability.gpumoves import decide_moves
from supervisor.stability.policy import (
    HOST,
    GpuAttribution,
    Incident,
    PolicyConfig,
    ScopeState,
    Vitals,
    decide,
    incident_from_event,
)

LADDER = ("light", "medium", "heavy")
CFG = PolicyConfig(ceiling="heavy", window_s=3600, calm_s=3600, cooldown_s=300)
T0 = 1_000_000.0
G0, G1 = GpuId(0, "GPU-aaaa"), GpuId(1, "GPU-bbbb")


def reading(gpu: GpuId, temp_c: float = 60, used_mb: float = 4000) -> GpuVitals:
    return GpuVitals(gpu.index, used_mb, 80_000, 90, temp_c, 300, gpu.uuid)


def vitals(*gpus: GpuVitals, ram_pct: float = 60.0) -> Vitals:
    return Vitals(T0, ram_pct, 0.0, 50.0, gpus)


def on(gpu: GpuId, name: str = "pong", need_mb: float = 6000) -> PlacedGame:
    return PlacedGame(name, gpu, need_mb, (G0, G1), since=T0 - 1000)


def oom(at: float, gpu: GpuId, name: str = "pong", uptime_s: float = 30) -> Incident:
    return Incident(T0 + at, "worker_oom", name, uptime_s, gpu.uuid)


def moves(
    games: list[PlacedGame],
    gpus: list[GpuVitals],
    incidents: list[Incident] = [],  # noqa: B006
    last: dict[str, LastMove] | None = None,
    at: float = 0,
) -> list[GpuMove]:
    return decide_moves(games, gpus, incidents, last or {}, CFG, T0 + at)


def modes(
    attribution: GpuAttribution | None,
    incidents: list[Incident],
    v: Vitals,
    at: float = 0,
    games: tuple[str, ...] = ("pong",),
) -> dict[str, str]:
    scopes = [ScopeState(HOST, "heavy", False, T0 - 1000)]
    scopes += [ScopeState(g, "heavy", False, T0 - 1000) for g in games]
    return {d.scope: d.to_mode for d in decide(LADDER, scopes, incidents, v, CFG, T0 + at,
                                                attribution)}  # fmt: skip


def test_two_gpus_one_hot_moves_the_game_to_the_calm_one() -> None:
    got = moves([on(G0)], [reading(G0, temp_c=92), reading(G1)])
    assert [(m.game, m.from_gpu, m.to_gpu) for m in got] == [("pong", G0, G1)]
    assert "GPU 0 temperature 92C > 85C" in got[0].causes[0]
    detail = got[0].detail()
    assert detail["from"] == G0.as_json() and detail["to"] == G1.as_json()


def test_two_gpus_both_hot_no_move_the_game_steps_down_not_the_host() -> None:
    hot = vitals(reading(G0, temp_c=92), reading(G1, temp_c=90))
    assert moves([on(G0)], list(hot.gpus)) == []
    attribution = GpuAttribution(placed={"pong": G0.uuid})
    got = modes(attribution, [], hot, games=("pong", "cartcpu"))
    assert got == {HOST: "heavy", "pong": "medium", "cartcpu": "heavy"}  # CPU game untouched


def test_without_attribution_a_hot_gpu_steps_the_host_as_before() -> None:
    assert modes(None, [], vitals(reading(G0, temp_c=92)))[HOST] == "medium"


def test_a_hot_gpu_none_of_our_games_uses_steps_nothing() -> None:
    attribution = GpuAttribution(placed={"pong": G1.uuid})
    assert modes(attribution, [], vitals(reading(G0, temp_c=92), reading(G1))) == {
        HOST: "heavy",
        "pong": "heavy",
    }


def test_ram_pressure_still_steps_the_host_with_attribution() -> None:
    attribution = GpuAttribution(placed={"pong": G0.uuid})
    assert modes(attribution, [], vitals(reading(G0), ram_pct=3))[HOST] == "medium"


def test_an_oom_on_gpu_0_with_gpu_1_free_moves_the_game_and_keeps_its_mode() -> None:
    incidents = [oom(-5, G0)]
    got = moves([on(G0)], [reading(G0, used_mb=79_000), reading(G1)], incidents)
    assert [(m.from_gpu, m.to_gpu) for m in got] == [(G0, G1)]
    assert "pong ran out of memory on GPU 0" in got[0].causes[0]
    attribution = GpuAttribution(
        placed={"pong": G0.uuid}, moved_at={"pong": T0}, moving={"pong": "moved to GPU 1"}
    )
    v = vitals(reading(G0), reading(G1))
    assert modes(attribution, incidents, v)["pong"] == "heavy"
    # The early OOM, without the move, steps the game down (as today).
    assert modes(None, incidents, v)["pong"] == "medium"


def test_a_second_oom_after_the_move_steps_down_instead_of_moving_back() -> None:
    last = {"pong": LastMove(T0, G0.uuid)}
    incidents = [oom(-5, G0), oom(60, G1)]
    gpus = [reading(G0), reading(G1)]
    assert moves([on(G1)], gpus, incidents, last, at=70) == []  # moved 70 s ago < cooldown
    attribution = GpuAttribution(placed={"pong": G1.uuid}, moved_at={"pong": T0})
    # The first OOM was acted on by the move; the second, on the new GPU, steps it down.
    assert modes(attribution, incidents, vitals(*gpus), at=70)["pong"] == "medium"


def test_after_the_cooldown_a_game_may_move_again() -> None:
    last = {"pong": LastMove(T0, G0.uuid)}
    got = moves([on(G1)], [reading(G0), reading(G1, temp_c=95)], [], last, at=400)
    assert [m.to_gpu for m in got] == [G0]


def test_no_move_to_a_gpu_without_room_or_with_its_own_incidents() -> None:
    full = [reading(G0, temp_c=92), reading(G1, used_mb=78_000)]
    assert moves([on(G0)], full) == []
    troubled = [reading(G0, temp_c=92), reading(G1)]
    assert moves([on(G0)], troubled, [oom(-100, G1, name="other")]) == []


def test_no_move_outside_the_gpus_the_game_may_use() -> None:
    pinned = replace(on(G0), allowed=(G0,))
    assert moves([pinned], [reading(G0, temp_c=92), reading(G1)]) == []


def test_an_oom_before_the_modes_last_change_is_no_reason_to_move() -> None:
    placed = replace(on(G0), since=T0)
    assert moves([placed], [reading(G0), reading(G1)], [oom(-5, G0)]) == []


def test_games_spread_over_calm_gpus_when_several_move() -> None:
    g2 = GpuId(2, "GPU-cccc")
    everywhere = (G0, G1, g2)
    games = [replace(on(G0, name=n), allowed=everywhere) for n in ("a", "b")]
    got = moves(games, [reading(G0, temp_c=92), reading(G1), reading(g2)])
    assert sorted(m.to_gpu.index for m in got) == [1, 2]


def test_incidents_name_their_gpu_unless_host_ram_ran_out() -> None:
    gpu = {"index": 0, "uuid": G0.uuid}
    cuda = incident_from_event(T0, "worker_oom", "pong", {"gpu": gpu, "error_kind": "cuda_oom"})
    host_ram = incident_from_event(T0, "worker_oom", "pong", {"gpu": gpu, "error_kind": "host_oom"})
    kernel = incident_from_event(T0, "worker_crash", "pong", {"gpu": gpu, "kernel_oom": True})
    assert cuda is not None and cuda.gpu == G0.uuid
    assert host_ram is not None and host_ram.gpu is None
    assert kernel is not None and kernel.gpu is None
