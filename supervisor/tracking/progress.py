"""A run's `progress.csv` read incrementally (by byte offset) and each row judged final or not.

A row is *final* when no resume can ever redo its step: its step is at or before the newest
committed checkpoint of the life (worker process) that wrote it, or, for a life that a later
one followed, at or before the step that later life resumed from. Rows after that point were
redone by the later life (*superseded*) and are never sent. Rows that are neither yet stay
on disk, and the reader's offset stops before them: nothing is held in memory across passes.

Lives are told apart by the row's `resume_count` and by a step that does not grow (a resume
went back). The step a later life resumed from is its heartbeat's `resumed_from_step` while it
is the current life; for a life the supervisor never saw (it was down), the newest committed
checkpoint on disk at or before that life's first row (none: 0, its predecessor's rows are all
dropped rather than risk a doubled step).
"""

from __future__ import annotations

import bisect
import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path

from training.protocol import PROGRESS_FILE

MAX_ROWS = 2000  # rows read per pass and run: what waits beyond stays on disk
MAX_BYTES = 4 << 20
# Columns that are the row's bookkeeping, not a metric.
NOT_METRICS = frozenset({"time", "wall_s", "global_step", "resume_count"})


@dataclass(frozen=True)
class Row:
    end: int  # byte offset just after the row
    step: int
    life: int  # resume_count (0 when the file has none)
    time: float | None  # Unix seconds, from the row
    values: dict[str, float]  # finite numbers only
    dropped: int  # values that were not finite numbers


@dataclass(frozen=True)
class Lives:
    """What is known of the run's lives now (the tick's heartbeat, the run dir's checkpoints)."""

    committed: int | None  # the current life's newest committed checkpoint step
    current: int | None = None  # the current life's resume_count (None: no heartbeat)
    resumed_from: int | None = None  # the step the current life resumed from (None: fresh)
    checkpoints: tuple[int, ...] = ()  # committed checkpoint steps on disk, sorted


@dataclass(frozen=True)
class Read:
    inode: int
    header: tuple[str, ...]
    rows: list[Row]
    truncated: bool  # the file is shorter than the offset (replaced): read from its start


def read_rows(run_dir: Path, offset: int, inode: int | None) -> Read | None:
    """The whole rows after `offset` (at most MAX_ROWS), None when there is no file."""
    path = run_dir / PROGRESS_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        truncated = (inode is not None and st.st_ino != inode) or st.st_size < offset
        if truncated:
            offset = 0
        head = os.pread(fd, 1 << 16, 0)
        line, newline, _ = head.partition(b"\n")
        if not newline:
            return Read(st.st_ino, (), [], truncated)
        header = tuple(next(csv.reader([line.decode("utf-8", "replace").rstrip("\r")]), []))
        offset = max(offset, len(line) + 1)
        data = os.pread(fd, min(MAX_BYTES, max(0, st.st_size - offset)), offset)
    finally:
        os.close(fd)
    rows: list[Row] = []
    pos = offset
    for raw in data.split(b"\n")[:-1]:  # the last piece is a partial row (or empty)
        pos += len(raw) + 1
        row = _parse(header, raw.decode("utf-8", "replace").rstrip("\r"), pos)
        rows.append(row if row is not None else Row(pos, -1, -1, None, {}, 0))  # -1: unreadable
        if len(rows) >= MAX_ROWS:
            break
    return Read(st.st_ino, header, rows, truncated)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _parse(header: tuple[str, ...], line: str, end: int) -> Row | None:
    cells = next(csv.reader([line]), [])
    if len(cells) != len(header):
        return None
    named = dict(zip(header, cells, strict=True))
    step = _number(named.get("global_step", ""))
    if step is None or step < 0:
        return None
    life = _number(named.get("resume_count", "") or "0")
    values: dict[str, float] = {}
    dropped = 0
    for key, text in named.items():
        if key in NOT_METRICS or text == "":
            continue
        value = _number(text)
        if value is None:
            dropped += 1
        else:
            values[key] = value
    return Row(end, int(step), int(life or 0), _number(named.get("time", "")), values, dropped)


def decide(rows: list[Row], lives: Lives) -> list[tuple[Row, bool]]:
    """The rows at the head of `rows` that are decided, each with True (final: to send) or
    False (superseded, or unreadable: never sent); stops at the first undecided row."""
    out: list[tuple[Row, bool]] = []
    # Segments: a new life starts where resume_count changes or the step does not grow.
    starts = [i for i in range(1, len(rows)) if _new_life(rows[i - 1], rows[i])]
    for i, row in enumerate(rows):
        if row.step < 0:
            out.append((row, False))
            continue
        nxt = bisect.bisect_right(starts, i)
        if nxt < len(starts):  # a later life follows this row's in the file
            later = rows[starts[nxt]]
            resumed = _resumed_from(later, lives)
            out.append((row, row.step <= resumed))
            continue
        # The newest life in the file: final at or before its newest committed checkpoint.
        if lives.current is not None and row.life < lives.current:
            # The current life wrote no row yet: wait until it has loaded its checkpoint.
            if lives.resumed_from is None:
                break
            out.append((row, row.step <= lives.resumed_from))
            continue
        if lives.committed is None or row.step > lives.committed:
            break
        out.append((row, True))
    return out


def _new_life(prev: Row, row: Row) -> bool:
    return prev.step >= 0 and row.step >= 0 and (row.life != prev.life or row.step <= prev.step)


def _resumed_from(later: Row, lives: Lives) -> int:
    if lives.current is not None and later.life == lives.current:
        return lives.resumed_from if lives.resumed_from is not None else 0
    # A life the supervisor did not see: the newest checkpoint at or before its first row.
    at = bisect.bisect_right(lives.checkpoints, later.step)
    return lives.checkpoints[at - 1] if at else 0
