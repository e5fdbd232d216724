"""The tick's participants on their own, each over a frozen view (no Supervisor, no process):
the preemption watch's hold and excuse with a fake clock, the spare's want, and the events
each returns for the daemon to record (none writes one itself)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import Config, load_config
from supervisor.launch.spare import SpareWant
from supervisor.ledger import db
from supervisor.ledger.journal import Journal
from supervisor.ledger.recorder import Recorder
from supervisor.lifecycle.game import Lifecycle
from supervisor.lifecycle.runtime import GameRuntime
from supervisor.lifecycle.states import WorkerState as S
from supervisor.participants import MetricsExport, MirrorUploads, SpareTending, TickView
from supervisor.preemption.notice import NO_HOLD, Hold, Notice
from supervisor.preemption.participant import PREEMPTION_LAPSE_S, PreemptionWatch
from supervisor.preemption.watcher import Report
from supervisor.stability import modes
from training import protocol

pytestmark = pytest.mark.e2e

CONFIG = """\
state_dir = "state"
initial_mode = "light"
[modes.light]
num_envs = 2
batch_size = 2
n_steps = 4
max_concurrent = 4
[modes.heavy]
num_envs = 4
batch_size = 4
n_steps = 4
max_concurrent = 4
[[games]]
name = "a"
env_id = "CartPole-v1"
total_steps = 1000
device = "cpu"
[[games]]
name = "b"
env_id = "CartPole-v1"
total_steps = 1000
device = "cpu"
[preemption]
provider = "none"
max_preemptions = 1
final_checkpoint_s = 20
[spare]
enabled = true
"""

T0 = 1_800_000_000.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    (tmp_path / "rlsup.toml").write_text(CONFIG)
    cfg = load_config(tmp_path / "rlsup.toml")
    for g in cfg.games:
        cfg.run_dir(g.name).mkdir(parents=True)
    return cfg


@pytest.fixture
def conn(cfg: Config) -> Iterator[sqlite3.Connection]:
    with db.connect(cfg.state_dir) as c:
        yield c


def events(conn: sqlite3.Connection) -> list[str]:
    return [e.kind for e in db.events(conn)]


def view_of(cfg: Config, conn: sqlite3.Connection, **over: Any) -> TickView:
    games = tuple(GameRuntime(g) for g in cfg.games)
    for rt in games:
        rt.state = S.WAITING
    base = TickView(1.0, T0, False, games, modes.view(conn, cfg), None, NO_HOLD, frozenset())
    return replace(base, **over)


def notice(deadline_in_s: float = 100.0, provider: str = "aws") -> Notice:
    return Notice(provider, "terminate", T0 + deadline_in_s, T0, T0 + deadline_in_s)


# ---- the preemption watch: a notice's life, with a fake clock ---------------------------------


def test_a_notice_holds_excuses_asks_every_game_and_returns_its_event(
    cfg: Config, conn: sqlite3.Connection
) -> None:
    wall = Clock()
    watch = PreemptionWatch(cfg, conn, "boot-1", wall)
    assert watch.watch() == [] and watch.hold() == NO_HOLD
    watch.watcher.reports.put(Report("notice", notice()))
    [(kind, game, detail)] = watch.watch()
    assert (kind, game) == ("preemption_notice", None)
    assert detail["checkpoint_requested"] == ["a", "b"] and detail["counted"] is True
    assert detail["boot_id"] == "boot-1" and detail["in_s"] == 100.0
    hold = watch.hold()
    assert hold.holding and hold.excuses_deaths
    env = hold.worker_env({"X": "1"})
    assert env == {"X": "1", protocol.PREEMPTION_DEADLINE_ENV: f"{T0 + 100:.3f}"}
    for g in cfg.games:
        request = protocol.read_checkpoint_request(cfg.run_dir(g.name))
        assert request is not None and request.deadline == T0 + 100 and not request.final
    assert events(conn) == [], "the participant returns its events; the daemon records them"


def test_the_final_checkpoint_is_asked_for_at_its_time_and_the_notice_lapses(
    cfg: Config, conn: sqlite3.Connection
) -> None:
    wall = Clock()
    watch = PreemptionWatch(cfg, conn, "boot-1", wall)
    watch.watcher.reports.put(Report("notice", notice(deadline_in_s=100.0)))
    watch.watch()
    assert watch.final_due == T0 + 80  # final_checkpoint_s = 20 before the deadline
    wall.t = T0 + 79.9
    assert watch.watch() == []
    wall.t = T0 + 80
    [(kind, _, detail)] = watch.watch()
    assert kind == "preemption_final_checkpoint" and detail["in_s"] == 20.0
    assert protocol.read_checkpoint_request(cfg.run_dir("a")).final  # type: ignore[union-attr]
    assert watch.watch() == [], "asked once"
    wall.t = T0 + 100 + PREEMPTION_LAPSE_S + 1  # the machine was not taken
    [(kind, _, detail)] = watch.watch()
    assert kind == "preemption_cleared" and "passed" in detail["why"]
    assert watch.hold() == NO_HOLD and not watch.holding()


def test_a_notice_beyond_the_days_budget_holds_starts_but_excuses_no_death(
    cfg: Config, conn: sqlite3.Connection
) -> None:
    wall = Clock()
    recorder = Recorder(conn, Journal(conn, wall=wall), wall=wall, steady=wall)
    recorder.event("preemption_notice", None, {"earlier": True})  # max_preemptions = 1
    recorder.journal.flush(force=True)
    watch = PreemptionWatch(cfg, conn, "boot-1", wall)
    watch.watcher.reports.put(Report("notice", notice()))
    [(_, _, detail)] = watch.watch()
    assert detail["counted"] is False
    assert watch.holding() and not watch.excuses_deaths()


def test_a_withdrawn_notice_clears_and_a_failing_service_is_an_event(
    cfg: Config, conn: sqlite3.Connection
) -> None:
    watch = PreemptionWatch(cfg, conn, "boot-1", Clock())
    watch.watcher.reports.put(Report("notice", notice()))
    watch.watcher.reports.put(Report("cleared", notice()))
    watch.watcher.reports.put(Report("failed", detail={"error": "timed out"}))
    kinds = [kind for kind, _, _ in watch.watch()]
    assert kinds == ["preemption_notice", "preemption_cleared", "preemption_watch_failed"]
    assert watch.hold() == NO_HOLD


def test_the_lifecycle_starts_nothing_while_the_hold_holds(cfg: Config) -> None:
    life = Lifecycle(cfg, wall=Clock())
    life.queue_new()
    assert [rt.spec.name for rt in life.candidates(4, 0.0)] == ["a", "b"]
    life.hold = Hold(notice(), counted=True)
    assert life.candidates(4, 0.0) == []


# ---- the spare, over the view -------------------------------------------------------------


class FakeLauncher:
    local = True

    def __init__(self) -> None:
        self.wants: list[SpareWant] = []

    def tend_spare(self, want: SpareWant, now: float) -> list[tuple[str, str | None, Any]]:
        self.wants.append(want)
        return [("spare_ready", None, {"device": want.device})] if want.want else []

    def spare_row(self) -> dict[str, Any] | None:
        return {"state": "ready", "rss_mb": 100.0} if self.wants and self.wants[-1].want else None


def spare(cfg: Config, conn: sqlite3.Connection) -> tuple[SpareTending, FakeLauncher]:
    launcher = FakeLauncher()
    recorder = Recorder(conn, Journal(conn), wall=Clock(), steady=Clock())
    return SpareTending(cfg, recorder, launcher, conn), launcher  # type: ignore[arg-type]


def test_the_spare_reads_its_reasons_from_the_view(cfg: Config, conn: sqlite3.Connection) -> None:
    part, _ = spare(cfg, conn)
    assert part.want(view_of(cfg, conn)).want is True
    held = part.want(view_of(cfg, conn, hold=Hold(notice(), counted=True)))
    assert not held.want and held.reason == "a preemption notice stands"
    placed = part.want(view_of(cfg, conn, placed=frozenset({"a", "b"})))
    assert not placed.want and "placed on a GPU" in placed.reason
    done = view_of(cfg, conn)
    for rt in done.games:
        rt.state = S.DONE
    assert part.want(done).reason == "no game left to start"


def test_the_spare_returns_its_events_and_rests_while_stopping(
    cfg: Config, conn: sqlite3.Connection
) -> None:
    part, launcher = spare(cfg, conn)
    assert part.tick(view_of(cfg, conn)) == [("spare_ready", None, {"device": "cpu"})]
    assert part.tick(view_of(cfg, conn, stopping=True)) == []
    assert len(launcher.wants) == 1
    assert events(conn) == []


# ---- the others: what they heard comes back as events -----------------------------------------


def test_the_mirror_and_metrics_return_what_they_heard(
    cfg: Config, conn: sqlite3.Connection
) -> None:
    uploads = MirrorUploads(cfg, local=True)  # no [mirror]: the uploader itself does nothing
    uploads.uploader.event("mirror_ok", "a", {"step": 10})
    assert uploads.tick(view_of(cfg, conn)) == [("mirror_ok", "a", {"step": 10})]
    assert uploads.tick(view_of(cfg, conn)) == []

    class Exporter:
        def drain(self) -> list[dict[str, Any]]:
            return [{"error": "disk full"}]

    metrics = MetricsExport(cfg)
    assert metrics.tick(view_of(cfg, conn)) == []
    metrics.exporter = Exporter()  # type: ignore[assignment]
    assert metrics.tick(view_of(cfg, conn)) == [("metrics_failed", None, {"error": "disk full"})]
    assert json.dumps(events(conn)) == "[]"
