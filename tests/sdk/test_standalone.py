"""The SDK stands alone: `import rlsup` and everything the SDK does works from a user's own
interpreter that has the standard library and numpy, and nothing of the service's dependencies
(structlog, tenacity, psutil, torch). `command = ["python", "train.py"]` runs whatever `python`
the service finds, with only `PYTHONPATH=<checkout>` added by rlsup."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from training import protocol as P

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# What the SDK's closure must never pull in: the service's own dependencies, and torch.
SERVICE_ONLY = ("structlog", "tenacity", "psutil", "torch", "rich")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A fresh venv with no packages at all, and a PYTHONPATH of the checkout (what rlsup
    injects) and numpy alone (linked from this venv; the array functions need it)."""
    where = tmp_path_factory.mktemp("bare")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where / "venv")],
        check=True,
        capture_output=True,
    )
    deps = where / "deps"
    deps.mkdir()
    numpy_dir = Path(np.__file__).parent
    for name in ("numpy", "numpy.libs"):
        if (numpy_dir.parent / name).exists():
            (deps / name).symlink_to(numpy_dir.parent / name)
    return where / "venv" / "bin" / "python", os.pathsep.join((str(ROOT), str(deps)))


def _run_bare(
    python: Path, pythonpath: str, code: str, cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RLSUP_", "PYTHON"))}
    base.update({"RLSUP_TEST_RUN": os.environ["RLSUP_TEST_RUN"], "PYTHONPATH": pythonpath})
    base.update(env)
    return subprocess.run(
        [str(python), "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )


TRAIN = """
    import sys
    for name in ("structlog", "tenacity", "psutil", "torch"):
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise SystemExit(f"{name} is importable: not a bare interpreter")
    import numpy as np
    import rlsup

    run = rlsup.attach("run", checkpoint_every_s=3600, keep=2, handle_signals=False)
    step = 0
    replay = np.zeros((64, 8), dtype=np.float32)
    if (ckpt := run.latest()) is not None:
        step = int((ckpt / "step").read_text())
        replay = run.load_arrays("replay")
        assert (replay[:, 0] == np.arange(64) * step).all(), "resumed a different array"
    print("resumed", step, flush=True)
    for _ in range(5):
        step += 1
        replay[:, 0] = np.arange(64) * step
        run.heartbeat(step, mean_return=1.5, loss=0.25)
        assert not run.should_stop()
    assert run.should_checkpoint(step) is False
    with run.checkpoint(step) as d:
        (d / "step").write_text(str(step))
        run.save_arrays("replay", replay, chunk_bytes=512)
    print("committed", step, flush=True)
    run.close()
"""


def test_the_sdk_works_from_an_interpreter_with_only_the_stdlib_and_numpy(
    bare_python: tuple[Path, str], tmp_path: Path
) -> None:
    python, pythonpath = bare_python
    first = _run_bare(python, pythonpath, TRAIN, tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["resumed", "0", "committed", "5"]
    second = _run_bare(python, pythonpath, TRAIN, tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["resumed", "5", "committed", "10"]
    hb = P.read_heartbeat(tmp_path / "run")
    assert hb is not None and hb.writer == "sdk" and hb.last_checkpoint_step == 10
    assert hb.metrics == {"loss": 0.25}


STOP = """
    import os, signal
    import rlsup

    run = rlsup.attach(checkpoint_every_s=3600)  # RLSUP_RUN_DIR: as under `rlsup run`
    step = 0
    while True:
        step += 1
        run.heartbeat(step)
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # what `rlsup stop` sends
        stop = run.should_stop()
        if stop or run.should_checkpoint(step):
            with run.checkpoint(step) as d:
                (d / "step").write_text(str(step))
"""


def test_a_stop_from_a_bare_interpreter_is_a_checkpoint_and_exit_75(
    bare_python: tuple[Path, str], tmp_path: Path
) -> None:
    python, pythonpath = bare_python
    run_dir = tmp_path / "run"
    done = _run_bare(
        python,
        pythonpath,
        STOP,
        tmp_path,
        RLSUP_RUN_DIR=str(run_dir),
        RLSUP_PARENT_PID=str(os.getpid()),
    )
    assert done.returncode == P.ExitCode.STOPPED, done.stderr
    assert sorted(p.name for p in (run_dir / P.CHECKPOINT_DIR).iterdir()) == ["ckpt-000000000003"]


def _closure(code: str, cwd: Path) -> set[str]:
    """The top-level packages `code` imports, beyond what the interpreter's start-up did."""
    prelude = "import json, sys\nbefore = set(sys.modules)\n"
    report = "\nprint(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    out = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code) + report],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_rlsup_loads_none_of_the_services_dependencies(tmp_path: Path) -> None:
    """In this venv, where structlog, tenacity and psutil are all installed."""
    loaded = _closure("import rlsup", tmp_path)
    assert loaded.isdisjoint((*SERVICE_ONLY, "numpy")), sorted(loaded)
    foreign = {m for m in loaded if m not in sys.stdlib_module_names and not m.startswith("_")}
    assert foreign <= {"rlsup", "training", "checkpoints"}, sorted(foreign)


USE = """
    import numpy as np
    import rlsup

    run = rlsup.attach("run", handle_signals=False)
    run.heartbeat(1, mean_return=0.0)
    run.should_stop()
    run.should_checkpoint(1)
    with run.checkpoint(1) as d:
        (d / "x").write_bytes(b"x")
        run.save_arrays("a", np.arange(10))
    run.latest()
    run.load_arrays("a")
    run.close()
"""


def test_using_the_sdk_loads_no_logging_library_and_prints_nothing(tmp_path: Path) -> None:
    """structlog, when installed, is the service's: unconfigured it prints every store event
    on the script's stdout. tenacity runs the store's retries where it is installed."""
    loaded = _closure(USE, tmp_path)
    assert loaded.isdisjoint(("structlog", "psutil", "torch", "rich")), sorted(loaded)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(USE)], cwd=tmp_path, capture_output=True, text=True
    )
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


@pytest.mark.parametrize("with_tenacity", [True, False])
@pytest.mark.parametrize(
    ("policy", "failure", "waits"),
    [
        # transient_io: wait_random_exponential(multiplier=0.005, max=0.1)
        ("transient_io", errno.EBUSY, [(0.0, 0.005), (0.0, 0.01), (0.0, 0.02)]),
        # transient_read: wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05)
        ("transient_read", errno.EIO, [(0.05, 0.1), (0.1, 0.15), (0.2, 0.25), (0.4, 0.45)]),
    ],
)
def test_the_store_retries_the_same_with_or_without_tenacity(
    monkeypatch: pytest.MonkeyPatch,
    with_tenacity: bool,
    policy: str,
    failure: int,
    waits: list[tuple[float, float]],
) -> None:
    from checkpoints import _retry

    if not with_tenacity:
        monkeypatch.setitem(sys.modules, "tenacity", None)  # `import tenacity` fails
    model: _retry.RetryPolicy = getattr(_retry, policy)
    fresh = _retry.RetryPolicy(model.attempts, model.wait_s, model.retry_on, model._tenacity_wait)
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    calls = 0

    @fresh
    def always_failing() -> None:
        nonlocal calls
        calls += 1
        raise OSError(failure, os.strerror(failure))

    with pytest.raises(OSError) as raised:
        always_failing()
    assert raised.value.errno == failure, "the last error, re-raised"
    assert calls == len(waits) + 1
    assert len(slept) == len(waits)
    for wait, (low, high) in zip(slept, waits, strict=True):
        assert low <= wait <= high
    calls, slept[:] = 0, []

    @fresh
    def not_transient() -> None:
        nonlocal calls
        calls += 1
        raise OSError(errno.ENOSPC, "full")

    with pytest.raises(OSError):
        not_transient()
    assert (calls, slept) == (1, [])


READ_FAULT = """
    import os, sys, threading, time
    import rlsup

    run = rlsup.attach("run", handle_signals=False)
    with run.checkpoint(1) as d:
        (d / "state").write_text("1")
    run.close()
    control = os.environ["RLSUP_FAULT_READ_ERRORS"]
    fault = f"EIO {os.path.abspath('run/checkpoints/ckpt-000000000001/state')}\\n"
    with open(control, "w") as f:
        f.write(fault)
    threading.Timer(0.12, lambda: open(control, "w").close()).start()
    run = rlsup.attach("run", handle_signals=False)
    assert run.latest_step is None and run.latest() is not None  # outlasted the fault
    run.close()
    with open(control, "w") as f:
        f.write(fault)
    run = rlsup.attach("run", handle_signals=False)
    t0 = time.monotonic()
    try:
        run.latest()
    except SystemExit as exc:  # checkpoint_unreadable: exit 1, error.json says why
        import json
        error = json.load(open("run/error.json"))
        print(round(time.monotonic() - t0, 3), exc.code, error["kind"], error["message"])
"""


def test_without_tenacity_a_transient_read_error_is_retried_and_bounded(
    bare_python: tuple[Path, str], tmp_path: Path
) -> None:
    python, pythonpath = bare_python
    control = tmp_path / "faults"
    control.write_text("")
    done = _run_bare(python, pythonpath, READ_FAULT, tmp_path, RLSUP_FAULT_READ_ERRORS=str(control))
    assert done.returncode == 0, done.stderr
    waited, code, kind, message = done.stdout.split(" ", 3)
    assert (code, kind) == ("1", "checkpoint_unreadable")
    assert "cannot read" in message and "Input/output error" in message
    # 5 attempts, 0.05 + 0.1 + 0.2 + 0.4 s of waits between them (+ up to 0.05 s each).
    assert 0.75 <= float(waited) < 3.0
