"""`progress.csv`, the run's history row by row: written by the built-in worker and by the SDK
(`rlsup`), read by `rlsup status` and `rlsup plot`. Torch-free."""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import os
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from training.protocol import PROGRESS_COLUMNS, PROGRESS_FILE


class ProgressLog:
    """`progress.csv`, append-only, header once. A failed append (a full disk) keeps its rows
    in memory (the newest `max_pending`) and appends them with the next one that succeeds; a
    partial write is cut back, so the file never holds half a row.

    A new file gets `columns` (PROGRESS_COLUMNS, then the algorithm's diagnostics). A file that
    already has a header keeps it: rows are written with *that file's* columns (the ones it
    lacks left out, the ones it has and we do not fill left empty). So a run started by an
    earlier version with fewer columns and resumed by this one stays one file that
    csv.DictReader, `read_progress_tail` (which splits rows by the header) and `rlsup plot`
    read whole; its new diagnostics go to TensorBoard only until a fresh run dir. Moving the
    old file aside instead would cut the run's history in two for every reader.
    """

    def __init__(
        self,
        run_dir: Path,
        on_failure: Callable[[], None],
        max_pending: int = 100_000,
        columns: Sequence[str] = PROGRESS_COLUMNS,
    ):
        self.path = run_dir / PROGRESS_FILE
        self.on_failure = on_failure
        self.pending: deque[dict[str, Any]] = deque(maxlen=max_pending)
        self.columns = tuple(columns)
        # The header of the file as found, by (device, inode): read once, not per row.
        self._header: tuple[tuple[int, int], tuple[str, ...]] | None = None

    def append(self, row: dict[str, Any]) -> None:
        self.pending.append(row)
        try:
            self._write_pending()
        except OSError:
            self.on_failure()

    def _write_pending(self) -> None:
        # Read-write: an existing file's header is read (`_file_columns`).
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        try:
            st = os.fstat(fd)
            size = st.st_size
            text = io.StringIO(newline="")
            fieldnames = self.columns if size == 0 else self._file_columns(fd, st)
            writer = csv.DictWriter(text, fieldnames=fieldnames, extrasaction="ignore")
            if size == 0:
                writer.writeheader()
                self._header = ((st.st_dev, st.st_ino), self.columns)
            writer.writerows(self.pending)
            data = text.getvalue().encode("utf-8")
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, "short write to progress.csv")
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
        self.pending.clear()

    def _file_columns(self, fd: int, st: os.stat_result) -> tuple[str, ...]:
        """The columns of the existing file's header line (ours when it has no whole one)."""
        key = (st.st_dev, st.st_ino)
        if self._header is not None and self._header[0] == key:
            return self._header[1]
        head = os.pread(fd, 1 << 16, 0)
        line, newline, _ = head.partition(b"\n")
        names: tuple[str, ...] = self.columns
        if newline:
            parsed = next(csv.reader([line.decode("utf-8", "replace").rstrip("\r")]), [])
            if parsed:
                names = tuple(parsed)
        self._header = (key, names)
        return names
