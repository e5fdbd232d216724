"""Workers import rlsup's own packages, whatever the directory the supervisor runs in holds:
an operator's `training/` beside their config must not replace ours (workers run with `python
-P`: the working directory is not on sys.path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.launch.launcher import Launcher

pytestmark = pytest.mark.e2e


def test_a_package_in_the_working_directory_cannot_shadow_rlsups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shadow = tmp_path / "training"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("open('SHADOWED', 'w').write('imported')\n")
    (shadow / "worker.py").write_text("open('SHADOWED', 'w').write('ran')\n")
    monkeypatch.chdir(tmp_path)  # the supervisor's cwd, inherited by the worker
    log = tmp_path / "worker.log"
    proc = Launcher().spawn(["--help"], log, 0.0)
    try:
        assert proc.popen.wait(120) == 0, log.read_text()
    finally:
        proc.close()
    assert not (tmp_path / "SHADOWED").exists(), "the operator's package was imported"
    assert "python -m training.worker" in log.read_text()  # rlsup's worker answered


def test_the_single_host_supervisor_never_imports_ray() -> None:
    """Ray is the several-hosts backend's alone: `rlsup run` on one host, `rlsup status` and
    the CLI keep their start-up time without it."""
    import subprocess
    import sys

    code = (
        "import sys, supervisor.cli, supervisor.daemon, supervisor.commands.join\n"
        "from supervisor.config import load_config\n"
        "from supervisor.launch.backends import make_launcher\n"
        "cfg = load_config(sys.argv[1])\n"
        "assert make_launcher(cfg).backend == 'local'\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    example = Path(__file__).resolve().parents[3] / "supervisor" / "example.toml"
    out = subprocess.run(
        [sys.executable, "-c", code, str(example)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
