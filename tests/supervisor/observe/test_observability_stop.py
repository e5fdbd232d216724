"""What the Prometheus textfile says once the supervisor is gone (issue 24, defect 7), and
the last alert's output in the hooks' log (defect 5, the daemon's wiring).

An in-process Supervisor with real stand-in workers and a real state database: node_exporter
keeps serving the textfile after the supervisor exits, so its last version must say the
supervisor is down, and every version says when it was written (a SIGKILLed supervisor's file
goes stale, which a `time() - rlsup_metrics_updated_timestamp_seconds` alert sees).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.runs import FAST_LIGHT_HEAD, REPO, FakeNvml, close_supervisors, spin
from supervisor.config import load_config
from supervisor.daemon import Supervisor
from supervisor.launch.launcher import Launcher
from supervisor.lifecycle.states import WorkerState as S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

CONFIG = (
    FAST_LIGHT_HEAD
    + """\
max_concurrent = 1
[[games]]
name = "a"
env_id = "CartPole-v1"
total_steps = 100000
device = "cpu"
[metrics]
textfile = "node/rlsup.prom"
interval_s = 0.2
[[hooks]]
on = ["supervisor_stop"]
command = ["/bin/sh", "-c", "echo goodbye from $RLSUP_EVENT_KIND"]
"""
)
A_RUNNING = ("rlsup_game_state", (("game", "a"), ("state", "running")))


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(path.read_text())
        for s in fam.samples
    }


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Supervisor]]:
    (tmp_path / "boot").write_text("boot-1")
    (tmp_path / "node").mkdir()
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    (tmp_path / "rlsup.toml").write_text(CONFIG)
    made: list[Supervisor] = []

    def factory() -> Supervisor:
        sup = Supervisor(
            load_config(tmp_path / "rlsup.toml"),
            launcher=Launcher(python=sys.executable, module="tests.supervisor.fake_worker"),
            cores=2,
            exit_when_done=True,
            gpu_probe=FakeNvml(None),
            policy=None,
        )
        sup.start()
        made.append(sup)
        return sup

    yield factory
    close_supervisors(made)


def test_after_a_clean_stop_the_textfile_says_the_supervisor_is_down(
    make: Callable[[], Supervisor], tmp_path: Path
) -> None:
    textfile = tmp_path / "node" / "rlsup.prom"
    sup = make()
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    spin(sup, lambda: samples(textfile).get(A_RUNNING) == 1.0)
    running = samples(textfile)
    assert running[("rlsup_supervisor_up", ())] == 1.0
    written = running[("rlsup_metrics_updated_timestamp_seconds", ())]
    assert abs(written - time.time()) < 30

    sup.begin_shutdown(sup.clock(), "test")
    spin(sup, lambda: sup.finished)
    sup.close()

    down = samples(textfile)
    assert down[("rlsup_supervisor_up", ())] == 0.0
    assert down[A_RUNNING] == 0.0
    assert down[("rlsup_metrics_updated_timestamp_seconds", ())] >= written
    assert [p.name for p in textfile.parent.iterdir()] == ["rlsup.prom"]
    # The last alert went out before the supervisor closed, its output in the hooks' log.
    logged = (tmp_path / "state" / "logs" / "hooks.log").read_text().splitlines()
    assert logged == [logged[0]] and logged[0].endswith(
        " hook 0 supervisor_stop: goodbye from supervisor_stop"
    ), logged


def test_a_reload_naming_a_missing_hook_program_is_refused_and_the_old_hooks_stay(
    make: Callable[[], Supervisor], tmp_path: Path
) -> None:
    sup = make()
    assert (
        sup.on.hooks.runner is not None and sup.cfg.hooks[0].program == ""
    )  # run resolves; not here
    before = sup.on.hooks.runner
    config = tmp_path / "rlsup.toml"
    config.write_text(CONFIG.replace('"/bin/sh", "-c"', f'"{tmp_path / "gone"}", "-c"'))
    sup.reload(sup.clock())
    assert sup.on.hooks.runner is before and sup.cfg.hooks[0].command[0] == "/bin/sh"
    assert sup.on.conn is not None
    [row] = sup.on.conn.execute("SELECT detail FROM events WHERE kind = 'config_error'").fetchall()
    assert "hooks[0].command" in row[0] and "no such file" in row[0], row[0]
    config.write_text(CONFIG.replace('"/bin/sh", "-c"', '"sh", "-c"'))  # a bare name: resolved
    sup.reload(sup.clock())
    assert sup.cfg.hooks[0].program in ("/usr/bin/sh", "/bin/sh")
