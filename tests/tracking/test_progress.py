"""progress.csv read incrementally and judged row by row: final (at or before a committed
checkpoint of its life, or before the step a later life resumed from), superseded (redone by a
later life) or not yet decided (stays on disk)."""

from __future__ import annotations

from pathlib import Path

from supervisor.tracking.progress import Lives, Row, decide, read_rows

HEADER = "time,wall_s,global_step,episodes,sps,mean_return,num_envs,batch_size,resume_count,loss\n"


def row(step: int, life: int = 0, loss: str = "0.5") -> str:
    return f"{1000 + step},{step},{step},1,10.0,1.5,2,64,{life},{loss}\n"


def rows(*spec: tuple[int, int]) -> list[Row]:
    return [Row(i + 1, step, life, None, {"loss": 1.0}, 0) for i, (step, life) in enumerate(spec)]


def verdicts(decided: list[tuple[Row, bool]]) -> list[tuple[int, bool]]:
    return [(r.step, final) for r, final in decided]


def test_rows_are_final_up_to_the_committed_checkpoint_and_wait_after_it() -> None:
    got = decide(rows((10, 0), (20, 0), (30, 0)), Lives(committed=20, current=0))
    assert verdicts(got) == [(10, True), (20, True)]  # 30 waits: a crash could redo it
    assert decide(rows((10, 0)), Lives(committed=None, current=0)) == []


def test_rows_a_later_life_redid_are_superseded_never_sent() -> None:
    # Life 0 checkpointed at 20 and was killed at 40; life 1 resumed from 20.
    spec = rows((10, 0), (20, 0), (30, 0), (40, 0), (30, 1), (40, 1))
    got = decide(spec, Lives(committed=40, current=1, resumed_from=20))
    assert verdicts(got) == [(10, True), (20, True), (30, False), (40, False), (30, True),
                             (40, True)]  # fmt: skip


def test_the_old_life_waits_until_the_new_one_has_loaded_its_checkpoint() -> None:
    spec = rows((10, 0), (30, 0))
    # The new life (1) wrote no row and has not said where it resumed from: nothing decided
    # past the old life's last committed step... nor before it: its resume point is unknown.
    assert decide(spec, Lives(committed=None, current=1, resumed_from=None)) == []
    got = decide(spec, Lives(committed=None, current=1, resumed_from=20))
    assert verdicts(got) == [(10, True), (30, False)]


def test_a_life_the_supervisor_never_saw_resumed_from_the_checkpoint_before_its_first_row() -> None:
    # Lives 0 and 1 ran while the supervisor was down; now no heartbeat (the game stopped).
    spec = rows((10, 0), (20, 0), (30, 0), (25, 1), (35, 1))
    got = decide(spec, Lives(committed=30, checkpoints=(10, 20, 30)))
    assert verdicts(got) == [(10, True), (20, True), (30, False), (25, True)]  # 35 waits


def test_a_step_that_does_not_grow_starts_a_new_life_even_with_the_same_resume_count() -> None:
    spec = rows((10, 0), (20, 0), (15, 0))
    got = decide(spec, Lives(committed=15, checkpoints=(10,)))
    assert verdicts(got) == [(10, True), (20, False), (15, True)]


def test_reading_is_incremental_by_offset_and_leaves_a_partial_row(tmp_path: Path) -> None:
    path = tmp_path / "progress.csv"
    path.write_text(HEADER + row(10) + row(20, loss="nan") + "1003,3,3")  # a row being written
    read = read_rows(tmp_path, 0, None)
    assert read is not None and [r.step for r in read.rows] == [10, 20]
    assert read.rows[0].values["loss"] == 0.5 and "time" not in read.rows[0].values
    assert "loss" not in read.rows[1].values and read.rows[1].dropped == 1  # not finite
    again = read_rows(tmp_path, read.rows[-1].end, read.inode)
    assert again is not None and again.rows == [] and not again.truncated
    with path.open("a") as f:
        f.write(",1,10.0,1.5,2,64,0,0.1\n" + "garbage\n" + row(30))
    more = read_rows(tmp_path, read.rows[-1].end, read.inode)
    assert more is not None and [r.step for r in more.rows] == [3, -1, 30]  # -1: unreadable
    assert verdicts(decide(more.rows, Lives(committed=30)))[1] == (-1, False)


def test_a_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    (tmp_path / "progress.csv").write_text(HEADER + row(10) + row(20))
    first = read_rows(tmp_path, 0, None)
    assert first is not None
    (tmp_path / "progress.csv").unlink()
    (tmp_path / "progress.csv").write_text(HEADER + row(5))
    read = read_rows(tmp_path, first.rows[-1].end, first.inode)
    assert read is not None and read.truncated and [r.step for r in read.rows] == [5]
    assert read_rows(tmp_path / "nowhere", 0, None) is None
