"""The uploader as a helper of the supervisor: it fails to start without failing the tick, it
never outlives its supervisor (even one that dies while it is still importing), it mirrors the
configuration in force (never a file the supervisor refused), and one unusable game never stops
the others. No S3 server: the mirror's endpoint is a closed local port."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.runs import (
    FAST_LIGHT_HEAD,
    REPO,
    FakeNvml,
    close_supervisors,
    spin,
    wait_for,
)
from harness.seaweed import TEST_AWS_ENV
from supervisor.config import Config, load_config
from supervisor.daemon import Supervisor
from supervisor.launch.launcher import Launcher
from supervisor.ledger import db
from supervisor.lifecycle.states import WorkerState as S
from supervisor.mirror.state import MirrorState
from supervisor.mirror.uploader import _PARENT_PID_ENV, Uploader, UploadPlan, run_uploader
from training.protocol import PARENT_PID_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CONFIG = (
    FAST_LIGHT_HEAD
    + """\
max_concurrent = 2
{games}
[restart]
backoff_base_s = 0.05
backoff_max_s = 0.1
budget = 3
budget_window_s = 60
[mirror]
url = "{url}"
endpoint_url = "http://127.0.0.1:{port}"
"""
)
Events = list[tuple[str, str | None, dict[str, Any]]]


def game(name: str) -> str:
    return f'[[games]]\nname = "{name}"\nenv_id = "CartPole-v1"\ntotal_steps = 1000000\n'


def closed_port() -> int:
    """A local port nothing listens on: every S3 request is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write(tmp_path: Path, games: str = "", url: str = "s3://rlsup-test/one") -> Path:
    path = tmp_path / "rlsup.toml"
    path.write_text(CONFIG.format(games=games or game("a"), url=url, port=closed_port()))
    return path


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key, value in TEST_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))


class RecordingLauncher(Launcher):
    """The local launcher (fake workers), recording the configurations it is given."""

    def __init__(self) -> None:
        super().__init__(python=sys.executable, module="tests.supervisor.fake_worker")
        self.configured: list[Config] = []

    def configure(self, cfg: Config) -> None:
        self.configured.append(cfg)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[[Path], Supervisor]]:
    made: list[Supervisor] = []

    def factory(path: Path) -> Supervisor:
        sup = Supervisor(
            load_config(path),
            launcher=RecordingLauncher(),
            cores=4,
            gpu_probe=FakeNvml(None),
        )
        sup.start()
        made.append(sup)
        return sup

    yield factory
    close_supervisors(made)


def _uploader_pid(sup: Supervisor) -> int | None:
    up = sup.on.uploads.uploader
    return None if up is None or up.proc is None or up.proc.poll() is not None else up.proc.pid


def _mirror_pid(sup: Supervisor) -> int | None:
    state = MirrorState.read(sup.cfg.state_dir)
    return None if state is None else state.pid


# ---- a helper that cannot start -----------------------------------------------------------


def test_an_uploader_that_cannot_start_is_an_event_and_a_backoff(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path))
    (cfg.logs_dir / "uploader.log").mkdir(parents=True)  # its log cannot be opened (EISDIR)
    seen: Events = []
    up = Uploader(cfg, lambda kind, g, detail: seen.append((kind, g, detail)))
    try:
        up.tick(100.0)  # must not raise
        assert up.proc is None
        [(kind, g, detail)] = seen
        assert kind == "uploader_exit" and g is None and detail["returncode"] is None
        assert "uploader.log" in detail["error"] and detail["restart_in_s"] >= 1
        up.tick(100.5)
        assert len(seen) == 1, "no second attempt before the backoff ends"
        up.tick(100.0 + detail["restart_in_s"] + 0.1)
        assert len(seen) == 2 and seen[1][2]["restart_in_s"] > detail["restart_in_s"], "capped"
    finally:
        up.stop()


def test_a_fork_failure_is_an_event_and_a_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(write(tmp_path))
    seen: Events = []
    up = Uploader(cfg, lambda kind, g, detail: seen.append((kind, g, detail)))

    def no_fork(*args: Any, **kw: Any) -> Any:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess, "Popen", no_fork)
    up.tick(5.0)
    assert up.proc is None and [k for k, _, _ in seen] == ["uploader_exit"]
    assert "Resource temporarily unavailable" in seen[0][2]["error"]


def test_a_helper_start_failure_never_fails_the_tick(
    make: Callable[[Path], Supervisor], tmp_path: Path
) -> None:
    path = write(tmp_path)
    (tmp_path / "state" / "logs" / "uploader.log").mkdir(parents=True)
    sup = make(path)
    for _ in range(5):
        sup.safe_tick()
        assert sup._tick_errors == 0
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    assert sup._tick_errors == 0
    [failed] = db.events(sup.on.conn, kind="uploader_exit")  # type: ignore[arg-type]
    assert failed.detail["returncode"] is None and "uploader.log" in failed.detail["error"]


# ---- the parent's death ---------------------------------------------------------------------

PARENT = """\
import os, sys, time
from supervisor.config import load_config
from supervisor.mirror.uploader import Uploader
up = Uploader(load_config(sys.argv[1]), lambda *a: None)
up.tick(time.monotonic())
print(up.proc.pid, flush=True)
os._exit(0)  # the supervisor dies while its uploader is still starting
"""


def test_the_uploader_exits_when_its_supervisor_died_while_it_started(tmp_path: Path) -> None:
    assert _PARENT_PID_ENV == PARENT_PID_ENV, "the early check reads the workers' variable"
    path = write(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", PARENT, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[-1])
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    try:
        ready, _, _ = select.select([fd], [], [], 30.0)
        assert ready, f"the uploader {pid} outlived its supervisor"
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        os.close(fd)


# ---- the configuration in force -------------------------------------------------------------


def test_a_restarted_uploader_mirrors_the_config_in_force_not_a_refused_file(
    make: Callable[[Path], Supervisor], tmp_path: Path
) -> None:
    path = write(tmp_path)
    sup = make(path)
    spin(sup, lambda: _uploader_pid(sup) is not None and _mirror_pid(sup) == _uploader_pid(sup))
    first = _uploader_pid(sup)
    assert first is not None
    path.write_text("state_dir = [")  # a broken edit, refused by the reload
    sup.flags.reload = True
    sup.safe_tick()
    assert db.events(sup.on.conn, kind="config_error")  # type: ignore[arg-type]
    os.kill(first, signal.SIGKILL)
    spin(
        sup,
        lambda: _uploader_pid(sup) not in (None, first) and _mirror_pid(sup) == _uploader_pid(sup),
        timeout=30,
    )
    state = MirrorState.read(sup.cfg.state_dir)
    assert state is not None and state.url == "s3://rlsup-test/one"


def test_a_reload_that_moves_the_mirror_is_refused_whole(
    make: Callable[[Path], Supervisor], tmp_path: Path
) -> None:
    path = write(tmp_path)
    sup = make(path)
    spin(sup, lambda: sup.games["a"].state is S.RUNNING and _uploader_pid(sup) is not None)
    old, worker, uploader = sup.cfg, sup.games["a"].proc.pid, _uploader_pid(sup)  # type: ignore[union-attr]
    text = path.read_text().replace("s3://rlsup-test/one", "s3://rlsup-test/two")
    path.write_text(text + game("b"))
    sup.flags.reload = True
    sup.safe_tick()
    assert sup.cfg is old and "b" not in sup.games, "nothing of that reload applied"
    assert sup.games["a"].proc.pid == worker and _uploader_pid(sup) == uploader  # type: ignore[union-attr]
    [error] = db.events(sup.on.conn, kind="config_error")  # type: ignore[arg-type]
    message = error.detail["message"]
    assert "mirror.url" in message and "s3://rlsup-test/two" in message and "restart" in message
    assert error.detail["kept"] == "previous"
    assert not db.events(sup.on.conn, kind="config_reload")  # type: ignore[arg-type]
    launcher = sup.launcher
    assert isinstance(launcher, RecordingLauncher) and launcher.configured == []


def test_a_reload_gives_the_launcher_the_config_in_force(
    make: Callable[[Path], Supervisor], tmp_path: Path
) -> None:
    path = write(tmp_path)
    sup = make(path)
    spin(sup, lambda: _uploader_pid(sup) is not None)
    before = _uploader_pid(sup)
    path.write_text(
        path.read_text().replace('endpoint_url = "http', 'bandwidth_mb_s = 5\nendpoint_url = "http')
    )
    sup.flags.reload = True
    sup.safe_tick()
    assert sup.cfg.mirror is not None and sup.cfg.mirror.bandwidth_mb_s == 5.0
    launcher = sup.launcher
    assert isinstance(launcher, RecordingLauncher) and launcher.configured == [sup.cfg]
    spin(sup, lambda: _uploader_pid(sup) not in (None, before), timeout=30)


# ---- one game's unusable folder -------------------------------------------------------------


def test_one_unusable_checkpoints_folder_does_not_stop_the_other_games(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, game("bad") + game("good")))
    (cfg.run_dir("bad")).mkdir(parents=True)
    (cfg.run_dir("bad") / "checkpoints").write_text("not a folder")  # scandir: ENOTDIR
    from checkpoints import CheckpointStore

    with CheckpointStore(cfg.run_dir("good") / "checkpoints").begin(8, {}) as w:
        w.write_bytes("learner.pt", b"x")
        w.commit()
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_uploader(UploadPlan.of(cfg), stop, poll_s=0.05)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:

        def both_tried() -> bool:
            state = MirrorState.read(cfg.state_dir)
            return bool(errors) or (
                state is not None
                and all(state.games.get(g) and state.games[g].failures for g in ("bad", "good"))
            )

        wait_for(both_tried, 60, "an attempt for each game")
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    state = MirrorState.read(cfg.state_dir)
    assert state is not None
    assert "checkpoints" in (state.games["bad"].last_error or "")
    assert "ckpt-" in (state.games["good"].last_error or ""), "the good game was attempted"


# ---- uploader.log -------------------------------------------------------------------------


def test_the_uploader_log_is_never_followed_through_a_symlink(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path))
    cfg.logs_dir.mkdir(parents=True)
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep\n")
    (cfg.logs_dir / "uploader.log").symlink_to(target)
    seen: Events = []
    up = Uploader(cfg, lambda kind, g, detail: seen.append((kind, g, detail)))
    try:
        up.tick(1.0)
        assert up.proc is None and seen and seen[0][0] == "uploader_exit"
        time.sleep(0.2)
        assert target.read_text() == "keep\n"
    finally:
        up.stop()


def test_the_uploader_log_is_rotated_at_start(tmp_path: Path) -> None:
    from supervisor.files import LOG_ROTATE_BYTES

    cfg = load_config(write(tmp_path))
    cfg.logs_dir.mkdir(parents=True)
    log = cfg.logs_dir / "uploader.log"
    with open(log, "wb") as f:
        f.truncate(LOG_ROTATE_BYTES + 1)
    up = Uploader(cfg, lambda *a: None)
    try:
        up.tick(1.0)
        assert up.proc is not None
        assert (cfg.logs_dir / "uploader.log.1").stat().st_size == LOG_ROTATE_BYTES + 1
        assert log.stat().st_size < LOG_ROTATE_BYTES
    finally:
        up.stop()
