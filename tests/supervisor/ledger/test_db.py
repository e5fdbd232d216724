"""State database: permissions, schema version, boot ledger, query helpers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from supervisor.ledger import db


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize(
    ("umask", "directory", "files"),
    [(0o077, 0o700, 0o600), (0o027, 0o750, 0o660)],
    ids=["private", "service-group"],
)
def test_state_dir_and_db_files_are_private(
    tmp_path: Path, umask: int, directory: int, files: int
) -> None:
    """Private to the owner, or (the systemd unit's UMask=0027) readable by its group, the
    database writable by it (`rlsup scale`); never anything for others."""
    state = tmp_path / "state"
    old = os.umask(umask)
    try:
        conn = db.connect(state, owner=True)
        db._add_event(conn, "supervisor_start")
        conn.close()
        conn = db.connect(state, owner=True)
    finally:
        os.umask(old)
    assert _mode(state) == directory
    for name in ("rlsup.db", "rlsup.db-wal", "rlsup.db-shm"):
        assert _mode(state / name) == files, name
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_schema_version_and_contract_tables(tmp_path: Path) -> None:
    conn = db.connect(tmp_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    cols = {
        t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")]
        for t in ("boots", "events", "workers", "samples", "desired", "modes", "supervisor")
    }
    assert cols["workers"][:12] == [
        "game",
        "state",
        "pid",
        "pid_create_time",
        "mode",
        "num_envs",
        "batch_size",
        "restarts",
        "state_since",
        "reason",
        "heartbeat",
        "updated",
    ]
    assert cols["boots"] == ["boot_id", "boot_time", "first_seen", "last_seen", "clean_stop"]
    conn.close()
    # Reopening migrates nothing and keeps data.
    assert db.migrate(db.connect(tmp_path)) == db.SCHEMA_VERSION


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    conn = db.connect(tmp_path)
    conn.execute(f"PRAGMA user_version = {db.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        db.connect(tmp_path)


def test_read_boot_id_honours_the_env_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "b").write_text("abc\n")
    monkeypatch.setenv(db.BOOT_ID_ENV, str(tmp_path / "b"))
    assert db.read_boot_id() == "abc"


def test_boot_ledger_tells_reboot_crash_and_clean_stop_apart(tmp_path: Path) -> None:
    conn = db.connect(tmp_path)
    assert db.record_boot(conn, "b1", 100.0).kind == "first"
    db.touch_boot(conn, "b1", 150.0)
    # Same boot, no clean stop: the supervisor crashed (leftover workers may live).
    out = db.record_boot(conn, "b1", 160.0)
    assert out.kind == "supervisor_crash" and out.same_boot
    # Same boot after a clean stop: just a restart.
    db.mark_clean_stop(conn, "b1", 200.0)
    assert db.record_boot(conn, "b1", 210.0).kind == "supervisor_restart"
    db.touch_boot(conn, "b1", 300.0)
    # New boot id without a clean stop: an unexpected reboot, downtime from last_seen.
    out = db.record_boot(conn, "b2", 420.0)
    assert (out.kind, out.previous_boot_id, out.downtime_s) == ("host_reboot", "b1", 120.0)
    assert not out.same_boot
    # New boot id after a clean stop: a planned reboot.
    db.mark_clean_stop(conn, "b2", 500.0)
    out = db.record_boot(conn, "b3", 600.0)
    assert (out.kind, out.downtime_s) == ("reboot", 100.0)


def test_boots_summary_and_mtbf(tmp_path: Path) -> None:
    conn = db.connect(tmp_path)
    day = 86_400.0
    db.record_boot(conn, "b1", 0.0)
    db.touch_boot(conn, "b1", 3 * day)
    db.record_boot(conn, "b2", 3 * day + 600)  # crash of the host: 10 min down
    db._add_event(conn, "host_reboot", None, {"downtime_s": 600}, ts=3 * day + 600)
    db.touch_boot(conn, "b2", 7 * day)
    now = 7 * day
    week = db.boots_summary(conn, now, 7 * day)
    assert week.reboots == 1 and week.unexpected_reboots == 1
    assert week.uptime_s == pytest.approx(7 * day - 600)
    assert week.uptime_fraction == pytest.approx(1 - 600 / (7 * day))
    today = db.boots_summary(conn, now, day)
    assert today.reboots == 0 and today.uptime_fraction == pytest.approx(1.0)
    assert db.mtbf_s(conn, now) == pytest.approx(7 * day - 600)


def test_mtbf_is_none_without_failures(tmp_path: Path) -> None:
    conn = db.connect(tmp_path)
    db.record_boot(conn, "b1", 0.0)
    assert db.mtbf_s(conn, 10.0) is None


def test_event_queries_filter_by_time_game_and_kind(tmp_path: Path) -> None:
    conn = db.connect(tmp_path)
    db._add_event(conn, "worker_crash", "a", {"x": 1}, ts=10)
    db._add_event(conn, "worker_crash", "b", ts=20)
    db._add_event(conn, "restart", "a", ts=30)
    assert [e.ts for e in db.events(conn, since=15)] == [20, 30]
    assert [e.kind for e in db.events(conn, game="a")] == ["worker_crash", "restart"]
    assert db.events(conn, kind="worker_crash", game="a")[0].detail == {"x": 1}
    assert len(db.events(conn, kind=["restart", "worker_crash"])) == 3
    assert [e.ts for e in db.events(conn, limit=2)] == [20, 30]


def test_worker_rows_and_desired_roundtrip(tmp_path: Path) -> None:
    conn = db.connect(tmp_path)
    db.upsert_worker(conn, "a", state="running", pid=5, heartbeat='{"seq": 3}')
    db.upsert_worker(conn, "a", state="backoff", pid=None)
    row = db.worker(conn, "a")
    assert row is not None and row["state"] == "backoff" and row["heartbeat"] == {"seq": 3}
    db.set_desired(conn, "*", "heavy", True, 1.0)
    assert db.get_desired(conn, "*") == ("heavy", True)
    db.set_mode(conn, "a", "light", 2.0, "calm")
    assert db.get_mode(conn, "a") == ("light", 2.0, "calm")
