"""envpool imported as a worker imports it: only the families a worker trains are registered
(training.envs.import_envpool), and training/tasks.py's task ids are exactly what they hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _child(code: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_worker_s_envpool_registers_its_families_and_loads_no_other() -> None:
    """Every other family's package (jumanji's pulls in matplotlib) cost 0.5 s of each boot."""
    got = _child(
        "import json, sys\n"
        "from training import envs\n"
        "from training.tasks import ATARI_TASKS, CLASSIC_TASKS\n"
        "ids = set(envs.envpool.list_all_envs())\n"
        "loaded = sorted(n for n in sys.modules if n.startswith(('matplotlib', 'envpool.jumanji',"
        " 'envpool.mujoco', 'envpool.procgen', 'envpool.vizdoom')))\n"
        "env = envs.make_env('Pong-v5', 2, 1, 1)\n"
        "shape = list(env.reset()[0].shape)\n"
        "print(json.dumps({'loaded': loaded, 'missing': sorted((ATARI_TASKS | CLASSIC_TASKS)"
        " - ids), 'shape': shape}))"
    )
    assert got == {"loaded": [], "missing": [], "shape": [2, 4, 84, 84]}


def test_the_task_list_is_envpool_s_discrete_atari_and_classic_tasks() -> None:
    """Against envpool's own full import. The list held envpool's eleven MuJoCo `*-v5` tasks
    (Ant-v5, Hopper-v5, ...) as Atari games: a config naming one passed `check-config` and its
    worker failed on a continuous action space (the test that was to check it did not exist)."""
    got = _child(
        "import json, envpool\n"
        "from training import envs\n"
        "from training.tasks import ATARI_TASKS, CLASSIC_TASKS\n"
        "ids = set(envpool.list_all_envs())\n"
        "from envpool.registration import registry\n"
        "atari = {t for t in ids if registry.specs[t][0] == 'envpool.atari'}\n"
        "print(json.dumps({'same_module': envs.envpool is envpool,"
        " 'atari_missing': sorted(ATARI_TASKS - atari), 'atari_extra': sorted(atari - ATARI_TASKS),"
        " 'classic_missing': sorted(CLASSIC_TASKS - ids)}))"
    )
    assert got == {
        "same_module": True,
        "atari_missing": [],
        "atari_extra": [],
        "classic_missing": [],
    }
