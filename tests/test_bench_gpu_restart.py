"""benchmarks/gpu_restart.py, made for a GPU lease, run here on the CPU: each variant starts a
real worker cold, kills it once its first checkpoint commits, and times the restart from that
checkpoint to its first training step; the eager variant is the baseline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_restart_is_timed_from_its_checkpoint_for_each_variant() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/gpu_restart.py", "--device", "cpu", "--game",
         "CartPole-v1", "--threads", "1", "--variant", "--cuda-graphs on", "--timeout-s", "120"],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    rows = {row["variant"]: row for row in result["rows"]}
    assert set(rows) == {"eager", "--cuda-graphs on"}, out.stdout
    for row in rows.values():
        assert "error" not in row, row
        assert row["restart"]["resumed_from_step"] > 0  # it loaded the checkpoint
        for start in ("cold", "restart"):
            assert 0 < row[start]["loaded_s"] <= row[start]["first_step_s"] < 120
    assert rows["eager"]["restart_vs_eager"] == 1.0
    assert rows["--cuda-graphs on"]["restart_vs_eager"] > 0
