"""`rlsup status` stays a glance: it imports nothing a status line does not show (issue 41).

Each module named here was on the status path once, for a name or a rare row: the ledger's
writer and its fold, the status records' TypedDicts, the lifecycle's state machine, the
mirror's state, the checkpoint store's names and manifest, the worker contract's dataclasses,
psutil, and the stdlib modules only argparse's help, plots or error messages need.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.state_fixture import StateFixture

REPO = Path(__file__).resolve().parents[2]

NOT_ON_A_STATUS_LINE = (
    "supervisor.ledger.db",  # the ledger's writer: status reads (ledger/reads.py)
    "supervisor.ledger.accounting",  # the fold: only when accounting.json cannot be used
    "supervisor.ledger.fold",
    "supervisor.ledger.fold_state",
    "supervisor.observe.schema",  # the records are types only
    "supervisor.lifecycle",  # LIVE_STATES names the lifecycle's live states
    "supervisor.mirror",  # only with a [mirror]
    "checkpoints.manifest",  # the boot id is checkpoints/boot.py's
    "checkpoints.names",  # only for a command game, or a heartbeat without a checkpoint time
    "training.protocol",  # the run dir's files are training/run_files.py's
    "training.torchbuild",  # only for a CPU fallback's reason
    "psutil",  # process identity and free RAM from /proc, as psutil reads them
    "threading",
    "shutil",  # argparse's terminal width (cli.help_formatter)
    "difflib",  # a misspelt key's message
    "csv",  # plots read progress.csv whole; status reads its tail
)


def _loaded_by_status(state: StateFixture, *modules: str) -> list[str]:
    """The modules among `modules` (and their submodules) that `rlsup status` and `rlsup
    status --json` leave in sys.modules, run in a fresh interpreter on the fixture."""
    code = (
        "import contextlib, io, json, sys\n"
        "from supervisor import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    codes = [cli.main(['status', *a, '--config', {str(state.config)!r}])\n"
        "             for a in ([], ['--json'])]\n"
        f"wanted = {modules!r}\n"
        "loaded = [m for m in sys.modules\n"
        "          if any(m == w or m.startswith(w + '.') for w in wanted)]\n"
        "print(json.dumps({'codes': codes, 'loaded': sorted(loaded)}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=state.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["codes"] == [4, 4], out  # the fixture's supervisor runs and a game is FATAL
    return list(out["loaded"])


@pytest.mark.e2e
def test_status_imports_nothing_a_status_line_does_not_show(state: StateFixture) -> None:
    assert _loaded_by_status(state, *NOT_ON_A_STATUS_LINE) == []


@pytest.mark.e2e
def test_importing_the_status_command_loads_none_of_them() -> None:
    code = (
        "import sys, supervisor.commands.status\n"
        f"wanted = {NOT_ON_A_STATUS_LINE!r}\n"
        "print(sorted(m for m in sys.modules\n"
        "             if any(m == w or m.startswith(w + '.') for w in wanted)))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_live_states_are_the_lifecycles_alive_states() -> None:
    """observe/games.py names the states in which a worker process exists rather than import
    the lifecycle's state machine: they must stay the lifecycle's ALIVE."""
    from supervisor.lifecycle.states import ALIVE
    from supervisor.observe.games import LIVE_STATES

    assert {str(state) for state in ALIVE} == LIVE_STATES
