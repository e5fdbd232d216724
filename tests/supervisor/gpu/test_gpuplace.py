"""Placement, pure: CUDA_VISIBLE_DEVICES onto NVML's GPUs, and which GPU a game gets."""

from __future__ import annotations

import pytest

from supervisor.gpu.place import GpuId, Slot, place, visible

GPUS = [
    GpuId(0, "GPU-aaaa0000-1111"),
    GpuId(1, "GPU-bbbb0000-2222"),
    GpuId(2, "GPU-bbbb9999-3333"),
    GpuId(3, "GPU-dddd0000-4444"),
]


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (None, [0, 1, 2, 3]),  # unset: all
        ("", []),  # empty: none
        ("2", [2]),
        ("3,1", [3, 1]),  # CUDA's order is the list's
        (" 1 , 0 ", [1, 0]),
        ("GPU-dddd0000-4444", [3]),  # a full UUID
        ("GPU-aaaa,GPU-bbbb9", [0, 2]),  # unique prefixes
        ("GPU-bbbb", []),  # ambiguous prefix: CUDA stops there
        ("1,7,2", [1]),  # out of range ends the list
        ("1,foo,2", [1]),  # so does garbage
        ("0,MIG-abc", [0]),  # MIG devices are not placed on
        ("2,2", [2]),  # a GPU named twice ends it too
        ("-1", []),  # CUDA's idiom for "no GPU"
    ],
)
def test_cuda_visible_devices_maps_onto_nvml(spec: str | None, want: list[int]) -> None:
    assert [g.index for g in visible(spec, GPUS)] == want


def slots(
    *free: float | None, games: tuple[int, ...] = (), reserved: tuple[float, ...] = ()
) -> list[Slot]:
    return [
        Slot(
            GPUS[i],
            f,
            reserved[i] if i < len(reserved) else 0.0,
            games[i] if i < len(games) else 0,
        )
        for i, f in enumerate(free)
    ]


def test_auto_takes_the_gpu_with_the_most_free_memory() -> None:
    p = place(slots(10_000, 70_000, 40_000), None, 2_000)
    assert p.gpu == GPUS[1] and p.fits
    assert "GPU 1" in p.reason and GPUS[1].uuid in p.reason


def test_a_busy_gpu_is_avoided() -> None:
    p = place(slots(500, 30_000), None, 2_000)  # GPU 0 busy with someone else's job
    assert p.gpu == GPUS[1]


def test_reservations_of_games_placed_spread_the_next_game() -> None:
    # Both GPUs 40 GB free, a game just placed on GPU 0 holds 10 GB its NVML reading lacks.
    p = place(slots(40_000, 40_000, reserved=(10_000, 0)), None, 2_000)
    assert p.gpu == GPUS[1]


def test_among_gpus_that_fit_the_one_with_fewer_games_wins() -> None:
    assert place(slots(70_000, 40_000, games=(1, 0)), None, 2_000).gpu == GPUS[1]
    assert place(slots(40_000, 40_000, games=(1, 1)), None, 2_000).gpu == GPUS[0]


def test_a_gpu_without_games_that_does_not_fit_loses_to_a_shared_one_that_does() -> None:
    assert place(slots(50_000, 1_000, games=(3, 0)), None, 2_000).gpu == GPUS[0]


def test_a_gpu_that_fits_beats_a_roomier_one_that_is_not_readable() -> None:
    p = place(slots(None, 3_000), None, 2_000)
    assert p.gpu == GPUS[1] and p.fits


def test_when_none_fits_the_roomiest_is_chosen_for_the_gate_to_wait_on() -> None:
    p = place(slots(1_000, 1_500), None, 2_000)
    assert p.gpu == GPUS[1] and not p.fits
    assert "<" in p.reason


def test_a_pinned_choice_is_by_position_among_the_visible_gpus() -> None:
    visible_two = slots(80_000, 10_000)
    assert place(visible_two, (1,), 2_000).gpu == GPUS[1]  # even though GPU 0 has more room
    assert place(visible_two, (0, 1), 2_000).gpu == GPUS[0]


def test_a_choice_beyond_the_visible_gpus_waits_and_says_why() -> None:
    p = place(slots(80_000, 80_000), (2,), 2_000)
    assert p.gpu is None
    assert "games.gpu names visible GPU 2 but 2 GPU(s) are visible" in p.reason


def test_all_allowed_gpus_lost_waits() -> None:
    p = place(slots(None, 80_000), (0,), 2_000)
    assert p.gpu is None and "not readable" in p.reason


def test_no_visible_gpu() -> None:
    assert place([], None, 1.0).gpu is None


def test_a_gpu_the_game_was_moved_off_is_avoided_while_another_is_allowed() -> None:
    avoid = frozenset({GPUS[1].uuid})
    assert place(slots(10_000, 70_000, 40_000), None, 2_000, avoid).gpu == GPUS[2]
    # Only the avoided one is allowed (or readable): it is still used, not waited for ever.
    assert place(slots(10_000, 70_000), (1,), 2_000, avoid).gpu == GPUS[1]
    assert place(slots(None, 70_000), None, 2_000, avoid).gpu == GPUS[1]
