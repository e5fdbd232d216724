"""A cloud's preemption notice ([preemption]): the watcher against a loopback metadata service
that speaks AWS, GCE and Azure, and an in-process supervisor with stand-in workers."""

from __future__ import annotations

import email.utils
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from harness.fake_metadata import FakeMetadata
from harness.runs import REPO, FakeNvml, close_supervisors, spin
from supervisor.config import ConfigError, PreemptionConfig, load_config
from supervisor.daemon import Supervisor
from supervisor.launch.launcher import Launcher
from supervisor.ledger import db
from supervisor.lifecycle.states import WorkerState as S
from supervisor.observe.status import collect
from supervisor.preemption.watcher import (
    MetadataClient,
    PreemptionWatcher,
    WatchError,
    detect,
    parse_azure,
)
from training import protocol

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[FakeMetadata]:
    server = FakeMetadata(getattr(request, "param", "aws"))
    yield server
    server.close()


def watcher(fake: FakeMetadata, provider: str | None = None) -> PreemptionWatcher:
    cfg = PreemptionConfig(provider or fake.provider, 0.05, fake.url, 0.3)
    return PreemptionWatcher(cfg)


def reports_until(w: PreemptionWatcher, kind: str, timeout: float = 5.0) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while kind not in seen:
        assert time.monotonic() < deadline, seen
        seen += [r.kind for r in w.drain()]
        time.sleep(0.02)
    return seen


# ---- the providers, as documented -----------------------------------------------------------


@pytest.mark.parametrize("fake", ["aws", "gcp", "azure"], indirect=True)
def test_each_provider_reads_no_notice_then_the_posted_one(fake: FakeMetadata) -> None:
    client = MetadataClient(fake.provider, fake.url, 1.0)
    assert client.read(time.time()) is None
    deadline = fake.post_notice(in_s=25)  # within every provider's longest notice
    now = time.time()
    notice = client.read(now)
    assert notice is not None and notice.provider == fake.provider
    if fake.provider == "gcp":  # TRUE has no time: about 30 s from the first sighting
        assert notice.deadline == pytest.approx(now + 30)
    else:
        assert notice.deadline == deadline
    assert (
        notice.action == {"aws": "terminate", "gcp": "terminate", "azure": "preempt"}[fake.provider]
    )


def test_aws_asks_for_an_imdsv2_token_once_and_sends_it(fake: FakeMetadata) -> None:
    client = MetadataClient("aws", fake.url, 1.0)
    client.read(time.time())
    client.read(time.time())
    assert fake.requests.count(("PUT", "/latest/api/token")) == 1
    assert fake.requests.count(("GET", "/latest/meta-data/spot/instance-action")) == 2


@pytest.mark.parametrize("fake", ["gcp", "azure"], indirect=True)
def test_gce_and_azure_refuse_requests_without_their_header(fake: FakeMetadata) -> None:
    from supervisor.preemption import watcher as pre

    path = pre.GCP_PREEMPTED_PATH if fake.provider == "gcp" else pre.AZURE_EVENTS_PATH
    status, _ = pre._http("GET", fake.url + path, {}, 1.0)
    assert status == (403 if fake.provider == "gcp" else 400)


@pytest.mark.parametrize("fake", ["aws", "gcp", "azure"], indirect=True)
def test_auto_finds_the_provider_that_answers(fake: FakeMetadata) -> None:
    assert detect(fake.url, 1.0) == fake.provider


def test_auto_is_quietly_none_where_nothing_answers() -> None:
    import socket

    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.monotonic()
    assert detect(f"http://127.0.0.1:{port}", 0.5) is None
    assert time.monotonic() - began < 2


# ---- a metadata service that misbehaves costs one event per streak ------------------------


@pytest.mark.parametrize("mode", ["hang", "garbage", "error"])
def test_a_misbehaving_service_costs_one_failed_report_per_streak(
    fake: FakeMetadata, mode: str
) -> None:
    fake.mode = mode
    w = watcher(fake)
    w.start()
    try:
        began = time.monotonic()
        assert w.drain() == []  # never waits on the network
        assert time.monotonic() - began < 0.05
        seen = reports_until(w, "failed")
        time.sleep(1.0)  # several more polls (or timeouts) of the same streak
        seen += [r.kind for r in w.drain()]
        assert seen.count("failed") == 1, seen
        fake.release.set()
        fake.mode = "calm"
        assert "recovered" in reports_until(w, "recovered")
        fake.release.clear()
        fake.mode = mode  # a new streak: one more
        assert reports_until(w, "failed").count("failed") == 1
    finally:
        fake.release.set()
        w.stop(wait_s=2)


@pytest.mark.parametrize("mode", ["garbage", "error"])
def test_each_provider_turns_garbage_and_errors_into_a_watch_error(mode: str) -> None:
    for provider in ("aws", "gcp", "azure"):
        server = FakeMetadata(provider)
        try:
            server.mode = mode
            with pytest.raises(WatchError):
                MetadataClient(provider, server.url, 1.0).read(time.time())
        finally:
            server.close()


def test_a_hung_service_costs_the_client_its_timeout_only(fake: FakeMetadata) -> None:
    fake.mode = "hang"
    began = time.monotonic()
    with pytest.raises(WatchError):
        MetadataClient("aws", fake.url, 0.3).read(time.time())
    assert time.monotonic() - began < 1.5


@pytest.mark.parametrize("fake", ["gcp", "aws"], indirect=True)
def test_a_service_that_trickles_its_answer_is_cut_at_the_polls_deadline(
    fake: FakeMetadata,
) -> None:
    """One byte every 0.5 s never trips a 1 s read timeout: the poll's whole request (AWS:
    the token and the instance-action together) must still end at timeout_s, leaving no
    thread behind."""
    client = MetadataClient(fake.provider, fake.url, 1.0)
    if fake.provider == "aws":
        client.read(time.time())  # the token, fetched at full speed
    fake.mode = "trickle"
    began = time.monotonic()
    with pytest.raises(WatchError, match="timed out"):
        client.read(time.time())
    assert time.monotonic() - began < 1.6
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


Y2099 = 4102444800.0


@pytest.mark.parametrize(
    ("fake", "posted_at", "max_s"),
    [("aws", Y2099, 120), ("aws", 600, 120), ("azure", 900, 30)],
    indirect=["fake"],
    ids=["aws-2099", "aws-in-10-min", "azure-in-15-min"],
)
def test_a_deadline_beyond_the_providers_longest_notice_counts_from_the_first_sighting(
    fake: FakeMetadata, posted_at: float, max_s: float
) -> None:
    """AWS gives 2 minutes, Azure's Spot eviction about 30 s: a `time` in 2099 (or any time
    further out than that) would hold every start and excuse every crash for as long."""
    client = MetadataClient(fake.provider, fake.url, 1.0)
    posted = fake.post_notice(in_s=posted_at - time.time() if posted_at > 1e9 else posted_at)
    now = time.time()
    notice = client.read(now)
    assert notice is not None
    assert notice.deadline == pytest.approx(now + max_s) and notice.posted == posted
    later = client.read(now + 10)  # the watcher keeps the first sighting's (one notice)
    assert later is not None and later.posted == posted


def test_an_aws_time_without_a_zone_is_read_as_utc(
    fake: FakeMetadata, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS documents `time` in UTC; a zone-less one must not be read in the host's zone."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # UTC+9, no daylight saving
    time.tzset()
    try:
        deadline = fake.post_notice(in_s=60)
        fake.aws_time = datetime.fromtimestamp(deadline, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        notice = MetadataClient("aws", fake.url, 1.0).read(time.time())
        # Azure's RFC 1123 NotBefore with "-0000" (no zone information) is UTC too.
        soon = float(int(time.time() + 20))
        when = email.utils.formatdate(soon).rsplit(" ", 1)[0] + " -0000"
        events = {"Events": [{"EventType": "Preempt", "NotBefore": when}]}
        azure = parse_azure(200, json.dumps(events).encode(), time.time())
    finally:
        monkeypatch.undo()
        time.tzset()
    assert notice is not None and notice.deadline == deadline
    assert azure is not None and azure.deadline == soon


def test_the_watcher_reports_one_notice_then_its_clearing(fake: FakeMetadata) -> None:
    w = watcher(fake)
    w.start()
    try:
        fake.post_notice(120)
        seen = reports_until(w, "notice")
        time.sleep(0.3)
        seen += [r.kind for r in w.drain()]
        assert seen.count("notice") == 1
        fake.mode = "calm"
        reports_until(w, "cleared")
    finally:
        w.stop(wait_s=2)


def test_the_config_names_the_bad_preemption_key(tmp_path: Path) -> None:
    path = tmp_path / "rlsup.toml"
    path.write_text(
        "[modes.light]\nnum_envs = 1\nbatch_size = 1\nmax_concurrent = 1\n"
        '[[games]]\nname = "a"\nenv_id = "CartPole-v1"\ntotal_steps = 10\n'
        '[preemption]\nprovider = "oracle"\n'
    )
    with pytest.raises(ConfigError, match=r"line 10: preemption\.provider: got 'oracle'"):
        load_config(path, check_devices=False)
    path.write_text(path.read_text().replace('"oracle"', '"gcp"\nflush = "later"'))
    with pytest.raises(ConfigError, match=r"preemption\.flush"):
        load_config(path, check_devices=False)


# ---- the supervisor -------------------------------------------------------------------------

CONFIG = """\
state_dir = "state"
stop_grace_s = 5
tick_s = 0.05
[modes.light]
num_envs = 2
batch_size = 2
n_steps = 4
max_concurrent = 1
[[games]]
name = "a"
env_id = "CartPole-v1"
total_steps = 100000000
[[games]]
name = "b"
env_id = "CartPole-v1"
total_steps = 100000000
[restart]
backoff_base_s = 0.05
backoff_max_s = 0.1
budget = 1
budget_window_s = 600
[preemption]
provider = "aws"
endpoint = "{url}"
poll_s = 0.05
timeout_s = 0.5
"""


@pytest.fixture
def make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeMetadata
) -> Iterator[Callable[[], Supervisor]]:
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    path = tmp_path / "rlsup.toml"
    path.write_text(CONFIG.format(url=fake.url))
    made: list[Supervisor] = []

    def factory(**kw: Any) -> Supervisor:
        launcher = Launcher(python=sys.executable, module="tests.supervisor.fake_worker")
        sup = Supervisor(load_config(path), launcher=launcher, cores=2,
                         gpu_probe=FakeNvml(None), **kw)  # type: ignore[arg-type]  # fmt: skip
        sup.start()
        made.append(sup)
        return sup

    yield factory
    close_supervisors(made)


def kinds(sup: Supervisor, kind: str) -> list[db.Event]:
    return db.events(sup.on.conn, kind=kind)


def test_a_notice_asks_every_game_to_checkpoint_holds_starts_and_shows_in_status(
    make: Callable[[], Supervisor], fake: FakeMetadata
) -> None:
    sup = make()
    a, b = sup.games["a"], sup.games["b"]
    spin(sup, lambda: a.state is S.RUNNING)
    (sup.cfg.run_dir("b")).mkdir(parents=True)  # b ran before: its run dir exists
    deadline = fake.post_notice(120)
    spin(sup, lambda: kinds(sup, "preemption_notice"))
    [ev] = kinds(sup, "preemption_notice")
    assert ev.detail["provider"] == "aws" and ev.detail["deadline"] == deadline
    assert ev.detail["action"] == "terminate" and ev.detail["boot_id"] == "boot-1"
    for name in ("a", "b"):
        request = sup.cfg.run_dir(name) / protocol.CHECKPOINT_REQUEST_FILE
        assert json.loads(request.read_text()) == {
            "reason": "preemption", "deadline": deadline, "provider": "aws",
        }  # fmt: skip

    doc = collect(sup.cfg, time.time())["preemption"]
    assert doc is not None and doc["deadline"] == deadline and doc["provider"] == "aws"
    assert 100 < (doc["remaining_s"] or 0) <= 120

    # The worker dies at the deadline: requeued, no failure, no crash; b never starts.
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGKILL)
    spin(sup, lambda: a.state is S.WAITING)
    for _ in range(20):
        sup.safe_tick()
        sup.wait(0.02)
    assert a.state is S.WAITING and b.state is S.WAITING
    assert a.failures == [] and kinds(sup, "worker_crash") == []
    assert [e.game for e in kinds(sup, "worker_preempted")] == ["a"]
    assert sup.on.spare.want(sup.tick_view()).want is False

    # The metadata withdraws it: starts resume, status shows none.
    fake.mode = "calm"
    spin(sup, lambda: a.state is S.RUNNING)
    assert kinds(sup, "preemption_cleared")
    assert collect(sup.cfg, time.time())["preemption"] is None


def test_a_final_checkpoint_is_asked_for_just_before_the_deadline(
    make: Callable[[], Supervisor], fake: FakeMetadata, tmp_path: Path
) -> None:
    path = tmp_path / "rlsup.toml"
    path.write_text(path.read_text() + "final_checkpoint_s = 3\n")
    sup = make()
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    request = sup.cfg.run_dir("a") / protocol.CHECKPOINT_REQUEST_FILE
    deadline = fake.post_notice(10)  # whole seconds: 9-10 s away, the final one 3 s before
    spin(sup, lambda: kinds(sup, "preemption_notice"))
    first = request.stat().st_mtime
    assert "final" not in json.loads(request.read_text())
    spin(sup, lambda: kinds(sup, "preemption_final_checkpoint"), timeout=15)
    asked_at = time.time()
    [ev] = kinds(sup, "preemption_final_checkpoint")
    assert ev.detail["checkpoint_requested"] == ["a"] and ev.detail["deadline"] == deadline
    assert 2 <= ev.detail["in_s"] <= 3.5 and deadline - asked_at <= 3.5
    # A fresh request (a newer mtime), so a worker that served the first owes one more.
    assert request.stat().st_mtime > first
    assert json.loads(request.read_text()) == {
        "reason": "preemption", "deadline": deadline, "provider": "aws", "final": True,
    }  # fmt: skip
    for _ in range(20):  # asked once
        sup.safe_tick()
        sup.wait(0.02)
    assert len(kinds(sup, "preemption_final_checkpoint")) == 1


def test_a_notice_too_late_for_a_second_checkpoint_asks_for_one(
    make: Callable[[], Supervisor], fake: FakeMetadata
) -> None:
    sup = make()  # final_checkpoint_s = 15 (the default): a 10 s notice leaves no room
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    fake.post_notice(10)
    spin(sup, lambda: kinds(sup, "preemption_notice"))
    assert sup.on.preemption.final_due is None
    for _ in range(20):
        sup.safe_tick()
        sup.wait(0.02)
    assert kinds(sup, "preemption_final_checkpoint") == []


def test_a_new_boot_after_a_notice_is_preempted_not_an_unexpected_reboot(
    make: Callable[[], Supervisor], fake: FakeMetadata, tmp_path: Path
) -> None:
    sup = make()
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    restarts = sup.games["a"].restarts
    fake.post_notice(120)
    spin(sup, lambda: kinds(sup, "preemption_notice"))
    close_supervisors([sup])  # the machine is taken: no clean stop
    (tmp_path / "boot").write_text("boot-2")
    fake.mode = "calm"  # the new machine has no notice

    sup2 = make()
    assert kinds(sup2, "host_reboot") == []
    [ev] = kinds(sup2, "preempted")
    assert ev.detail["previous_boot_id"] == "boot-1" and ev.detail["provider"] == "aws"
    start = kinds(sup2, "supervisor_start")[-1]
    assert start.detail["after"] == "preempted"
    spin(sup2, lambda: sup2.games["a"].state is S.RUNNING)
    assert sup2.games["a"].restarts == restarts and sup2.games["a"].failures == []
    assert kinds(sup2, "scale_down") == []
    assert db.boots_summary(sup2.on.conn, time.time(), 86400).unexpected_reboots == 0


def test_beyond_max_preemptions_a_lost_boot_is_an_unexpected_reboot(
    make: Callable[[], Supervisor], fake: FakeMetadata, tmp_path: Path
) -> None:
    path = tmp_path / "rlsup.toml"
    path.write_text(path.read_text() + "max_preemptions = 0\n")
    sup = make()
    fake.post_notice(120)
    spin(sup, lambda: kinds(sup, "preemption_notice"))
    assert kinds(sup, "preemption_notice")[0].detail["counted"] is False
    close_supervisors([sup])
    (tmp_path / "boot").write_text("boot-2")
    fake.mode = "calm"
    sup2 = make()
    assert kinds(sup2, "preempted") == []
    [ev] = kinds(sup2, "host_reboot")
    assert ev.detail["over_max_preemptions"] is True


def test_a_notice_for_2099_lapses_like_any_other_and_starts_resume(
    make: Callable[..., Supervisor], fake: FakeMetadata
) -> None:
    """Clamped to AWS's 2 minutes from its first sighting, a notice whose `time` is 2099
    lapses PREEMPTION_LAPSE_S after that: starts resume, deaths count again."""
    shift = [0.0]
    sup = make(wall=lambda: time.time() + shift[0])
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    fake.post_notice(in_s=Y2099 - time.time())
    spin(sup, lambda: kinds(sup, "preemption_notice"))
    [ev] = kinds(sup, "preemption_notice")
    assert ev.detail["deadline"] <= ev.detail["notice_at"] + 120
    assert ev.detail["posted"] == Y2099
    assert sup.on.preemption.holding() and sup.on.preemption.excuses_deaths()
    shift[0] = 120 + 300 + 5  # past the clamped deadline's lapse
    spin(sup, lambda: kinds(sup, "preemption_cleared"))
    assert not sup.on.preemption.holding() and not sup.on.preemption.excuses_deaths()
    for _ in range(20):  # the metadata still posts 2099: the same notice, never again
        sup.safe_tick()
        sup.wait(0.02)
    assert len(kinds(sup, "preemption_notice")) == 1


def _previous_boot_ended(sup: Supervisor, *, deadline: float, notice_age_s: float) -> None:
    """The notice sup recorded, rewritten as if seen `notice_age_s` ago with `deadline`
    (what an older supervisor, or a machine that ran on past it, leaves in the ledger)."""
    [ev] = kinds(sup, "preemption_notice")
    detail = {**ev.detail, "deadline": deadline}
    with db.transaction(sup.on.conn):
        sup.on.conn.execute(
            "UPDATE events SET ts = ?, detail = ? WHERE id = ?",
            (time.time() - notice_age_s, json.dumps(detail), ev.id),
        )


@pytest.mark.parametrize(
    ("deadline_in_s", "notice_age_s"),
    [(Y2099 - time.time(), 10), (-250, 370)],
    ids=["deadline-in-2099", "ran-on-250-s-past-the-deadline"],
)
def test_a_boot_that_ended_far_from_the_notices_deadline_is_an_unexpected_reboot(
    make: Callable[..., Supervisor],
    fake: FakeMetadata,
    tmp_path: Path,
    deadline_in_s: float,
    notice_age_s: float,
) -> None:
    """A boot is `preempted` only when it ended near the deadline (within the provider's
    longest notice before it, a margin after): not after any notice ever seen that boot."""
    sup = make()
    fake.post_notice(120)
    spin(sup, lambda: kinds(sup, "preemption_notice"))
    close_supervisors([sup])  # no clean stop; the boot's last sign of life is now
    fake.mode = "calm"
    sup = make()  # the same boot: rewrite the notice, then the machine goes
    _previous_boot_ended(sup, deadline=time.time() + deadline_in_s, notice_age_s=notice_age_s)
    close_supervisors([sup])
    (tmp_path / "boot").write_text("boot-2")
    sup2 = make()
    assert kinds(sup2, "preempted") == []
    [ev] = kinds(sup2, "host_reboot")
    assert ev.detail["previous_boot_id"] == "boot-1"


def test_a_checkpoint_plus_upload_longer_than_the_grace_is_a_warning_naming_the_knobs(
    tmp_path: Path,
) -> None:
    from supervisor.mirror.state import GameMirror, MirrorState
    from supervisor.observe.preemption_fit import fit_warnings

    path = tmp_path / "rlsup.toml"
    path.write_text(
        "[modes.light]\nnum_envs = 1\nbatch_size = 1\nmax_concurrent = 1\n"
        '[[games]]\nname = "a"\nenv_id = "CartPole-v1"\ntotal_steps = 10\n'
        '[mirror]\nurl = "s3://bucket/x"\n[preemption]\nprovider = "gcp"\n'
    )
    cfg = load_config(path, check_devices=False)
    cfg.logs_dir.mkdir(parents=True)
    line = {"event": "checkpoint", "step": 5, "seconds": 20.0}
    (cfg.logs_dir / "a.log").write_text('{"event": "x"}\n' + json.dumps(line) + "\n")
    assert fit_warnings(cfg) == []  # 20 s < gcp's 30 s, nothing uploaded yet
    MirrorState(url="s3://bucket/x", games={"a": GameMirror(step=5, seconds=15.0)}).write(
        cfg.state_dir
    )
    [warning] = fit_warnings(cfg)
    assert "game a's checkpoint 20 s + upload 15 s = 35 s exceeds gcp's 30 s" in warning
    assert 'flush = "local"' in warning and "checkpoint_every_s" in warning
    assert fit_warnings(cfg, "aws") == []  # 120 s


def test_the_fit_counts_the_slowest_recent_checkpoint_and_status_json_carries_it(
    tmp_path: Path,
) -> None:
    """A replay buffer's full rewrite (40 s) followed by cheap incremental ones (2 s): the
    window must hold the slow one, which is what a notice can land on."""
    from supervisor.observe.preemption_fit import fit_warnings

    path = tmp_path / "rlsup.toml"
    path.write_text(
        'state_dir = "s"\n[modes.light]\nnum_envs = 1\nbatch_size = 1\nmax_concurrent = 1\n'
        '[[games]]\nname = "a"\nenv_id = "CartPole-v1"\ntotal_steps = 10\n'
        '[preemption]\nprovider = "gcp"\n'
    )
    cfg = load_config(path, check_devices=False)
    cfg.logs_dir.mkdir(parents=True)
    lines = [{"event": "checkpoint", "step": s, "seconds": t} for s, t in ((5, 40.0), (6, 2.0))]
    (cfg.logs_dir / "a.log").write_text("".join(json.dumps(x) + "\n" for x in lines))
    [warning] = fit_warnings(cfg)
    assert "game a's checkpoint 40 s = 40 s exceeds gcp's 30 s" in warning
    assert collect(cfg, time.time(), fit=True)["preemption_fit"] == [warning]
    assert collect(cfg, time.time())["preemption_fit"] == []  # the metrics' and dashboard's
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "status", "--json", "--config", str(path)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert json.loads(out.stdout)["preemption_fit"] == [warning]
    human = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "status", "--config", str(path)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert f"warning: {warning}" in human.stdout
