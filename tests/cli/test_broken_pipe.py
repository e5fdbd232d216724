"""A reader that stops reading (`rlsup results --json | head`) ends the command quietly: no
BrokenPipeError traceback, and the exit code the command has without a pipe (0, or status's
0/3/4): a reader gone is no failure of the command, as `rlsup events -f | head` ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.state_fixture import StateFixture, build_state

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> StateFixture:
    """Enough games that `results --json` and `status --json` outgrow a pipe's buffer (64 KiB)."""
    root = tmp_path_factory.mktemp("pipe")
    return build_state(root / "site", n_games=160, n_events=300, progress_rows=20)


def _argv(state: StateFixture, *args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor.cli", *args, "--config", str(state.config)]


COMMANDS = [
    (["results", "--json"], 0),
    (["results"], 0),
    (["report"], 0),
    (["report", "--json"], 0),
    (["status", "--json"], 4),  # its supervisor (this process) runs and a game is FATAL
    (["events", "--json"], 0),
]


@pytest.mark.parametrize(("args", "code"), COMMANDS, ids=[" ".join(a) for a, _ in COMMANDS])
def test_a_reader_closed_before_the_output_ends_it_quietly(
    big: StateFixture, args: list[str], code: int
) -> None:
    # The read end is closed before the command writes a byte: every write meets EPIPE.
    proc = subprocess.Popen(_argv(big, *args), cwd=REPO, env=big.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == code, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err, err


@pytest.mark.parametrize(
    "args", [["results", "--json"], ["report"], ["status", "--json"]], ids=" ".join
)
def test_head_c_10_through_a_shell_pipe_is_quiet(
    big: StateFixture, args: list[str], tmp_path: Path
) -> None:
    errors = tmp_path / "stderr"
    command = " ".join(_argv(big, *args)) + f" 2>{errors} | head -c 10"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=REPO, env=big.env(),
                          capture_output=True, timeout=60)  # fmt: skip
    assert len(done.stdout) == 10
    err = errors.read_text()
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert done.returncode == (4 if args[0] == "status" else 0), err
