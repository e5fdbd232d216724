"""Workers import rlsup's own packages, whatever the directory the supervisor runs in holds:
an operator's `training/` beside their config must not replace ours (workers run with `python
-P`: the working directory is not on sys.path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.launcher import Launcher


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
