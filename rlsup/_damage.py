"""What a damaged array chunk costs, in the rows of the array the script saved: pure functions
over the chunk files' names and the array's header (`arrays/<name>.json`). Stdlib only."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

ARRAYS_DIR = "arrays"
_CHUNK_FILE = re.compile(ARRAYS_DIR + r"/([A-Za-z0-9][A-Za-z0-9_-]{0,99})\.(\d{6})")

Rows = list[tuple[int, int]]  # [start, stop) ranges along the first axis, merged, in order


def is_array_chunk(name: str) -> bool:
    """A chunk file of an array (`arrays/<name>.<6 digits>`): what a load may do without,
    reporting the rows it held. The header (`arrays/<name>.json`) is not one."""
    return _CHUNK_FILE.fullmatch(name) is not None


def chunks_by_array(files: Iterable[str]) -> dict[str, list[int]]:
    """Array name -> the indices of its chunk files among `files`, in order."""
    out: dict[str, list[int]] = {}
    for name in files:
        found = _CHUNK_FILE.fullmatch(name)
        if found is not None:
            out.setdefault(found[1], []).append(int(found[2]))
    return {name: sorted(chunks) for name, chunks in out.items()}


def rows_of_chunks(header: Mapping[str, Any], chunks: Iterable[int]) -> Rows:
    """The rows (first axis; a 0-d array is one row) whose bytes lie in the given chunks of an
    array with this header. A row split between a lost chunk and a good one is lost."""
    shape = [int(d) for d in header["shape"]]
    nbytes, chunk_bytes = int(header["nbytes"]), int(header["chunk_bytes"])
    total = shape[0] if shape else 1
    if nbytes <= 0 or total <= 0 or chunk_bytes <= 0:
        return []
    row_bytes = nbytes // total
    ranges: Rows = []
    for i in sorted(set(chunks)):
        start = min(total, i * chunk_bytes // row_bytes)
        stop = min(total, -(-(i + 1) * chunk_bytes // row_bytes))
        if start >= stop:
            continue
        if ranges and start <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(stop, ranges[-1][1]))
        else:
            ranges.append((start, stop))
    return ranges


def describe(rows: Rows, total: int) -> str:
    """`rows 48-63 of 64` (inclusive, as a person counts them)."""
    spans = ", ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in rows)
    return f"rows {spans} of {total}"
