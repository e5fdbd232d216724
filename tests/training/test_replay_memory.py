"""A replay buffer saves and loads with bounded extra memory, whatever its size.

Runs the benchmark's own rlsup path in a separate process (so its peak RSS is its own) on a
0.5 GiB buffer: the extra memory of a save or a load must stay about one chunk, not a copy of
the buffer. Timing is the benchmark's business; this asserts memory and incrementality only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_half_gib_buffer_saves_and_loads_within_64_mib_extra(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/replay_save.py", "--size-gib", "0.5", "--method", "rlsup",
         "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])["results"]["rlsup"]
    assert figures["bytes"] > 500 * 2**20
    assert figures["peak_extra_rss_mib"] <= 64, figures
    assert figures["load_extra_rss_mib"] <= 64, figures
    # After 1% new data, the next checkpoint rewrites only the chunks that changed.
    assert figures["incremental_fraction_written"] < 0.1, figures
    assert figures["chunks_copied_by_loop"] <= 4, figures
