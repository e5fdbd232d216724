"""The Prometheus export of a real state database (status's document, mapped to rlsup_*)."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.state_fixture import StateFixture
from supervisor.config import MetricsConfig, load_config
from supervisor.observe.metrics import MetricsExporter


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(got: dict, name: str, **labels: str) -> float | None:
    return got.get((name, tuple(sorted(labels.items()))))


def exporter(state: StateFixture, **metrics: object) -> MetricsExporter:
    cfg = load_config(state.config)
    return MetricsExporter(dataclasses.replace(cfg, metrics=MetricsConfig(**metrics)))  # type: ignore[arg-type]


def test_the_textfile_holds_every_game_and_the_host(state: StateFixture, tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    path = tmp_path / "node" / "rlsup.prom"
    ex = exporter(state, textfile=path)
    ex.refresh()
    assert ex.drain() == []
    got = samples(path.read_text())
    names = [g.name for g in state.games]
    for name in names:
        assert sum(value(got, "rlsup_game_state", game=name, state=s) or 0 for s in
                   ("running", "backoff", "done", "waiting", "fatal", "stopped")) == 1  # fmt: skip
    assert value(got, "rlsup_game_state", game="pong", state="running") == 1.0
    assert value(got, "rlsup_game_steps", game="pong") == 1_000_000
    assert value(got, "rlsup_game_steps_per_second", game="pong") == 500.0
    assert value(got, "rlsup_game_mean_return", game="pong") == 12.5
    assert 235 <= value(got, "rlsup_game_last_checkpoint_age_seconds", game="pong") <= 300  # type: ignore[operator]
    assert value(got, "rlsup_game_restarts_total", game="breakout") == 1.0
    assert value(got, "rlsup_host_unexpected_reboots_total") == 1.0
    assert value(got, "rlsup_host_mtbf_seconds") is not None
    assert value(got, "rlsup_host_gpu_temperature_celsius", gpu="0") == 71.0
    assert value(got, "rlsup_mode", scope="*", mode="light") == 1.0
    assert (value(got, "rlsup_policy_decisions_total", kind="scale_down") or 0) >= 1
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["rlsup.prom"]  # no temporary left


def test_a_failing_textfile_is_reported_once_until_it_heals(
    state: StateFixture, tmp_path: Path
) -> None:
    path = tmp_path / "missing-dir" / "rlsup.prom"
    ex = exporter(state, textfile=path)
    ex.refresh()
    ex.refresh()
    [failure] = ex.drain()
    assert failure["what"] == "textfile" and str(path) in failure["message"]
    path.parent.mkdir()
    ex.refresh()
    assert path.exists() and ex.drain() == []
    path.unlink()
    path.parent.rmdir()
    ex.refresh()  # failing again after it healed: reported again
    [again] = ex.drain()
    assert again["what"] == "textfile"


def test_the_endpoint_serves_the_snapshot_and_a_taken_port_is_reported(
    state: StateFixture,
) -> None:
    ex = exporter(state, listen_host="127.0.0.1", listen_port=0, interval_s=0.2)
    ex.start()
    try:
        host, port = ex.address  # type: ignore[misc]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            got = samples(r.read().decode())
        assert value(got, "rlsup_game_steps", game="pong") == 1_000_000
        other = exporter(state, listen_host="127.0.0.1", listen_port=port)
        other.start()
        try:
            [failure] = other.drain()
            assert failure["what"] == "listen" and f"127.0.0.1:{port}" in failure["message"]
        finally:
            other.stop()
    finally:
        ex.stop()
    with socket.socket() as s:  # the port is free again: the server was shut down
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        s.bind(("127.0.0.1", port))


def test_a_stopped_exporter_leaves_up_0_and_every_file_says_when_it_was_written(
    state: StateFixture, tmp_path: Path
) -> None:
    path = tmp_path / "rlsup.prom"
    ex = exporter(state, textfile=path, interval_s=60)
    t0 = time.time()
    ex.start()
    running = samples(path.read_text())
    assert value(running, "rlsup_supervisor_up") == 1.0
    written = value(running, "rlsup_metrics_updated_timestamp_seconds")
    assert written is not None and t0 - 1 <= written <= time.time() + 1
    ex.stop()  # a clean stop (the supervisor's close()): node_exporter must not see it up
    stopped = samples(path.read_text())
    assert value(stopped, "rlsup_supervisor_up") == 0.0
    assert (value(stopped, "rlsup_metrics_updated_timestamp_seconds") or 0) >= written
    ex.refresh()  # a refresh after the stop (the thread's last one, late) changes nothing
    assert value(samples(path.read_text()), "rlsup_supervisor_up") == 0.0


def test_the_textfile_never_follows_a_planted_temporary_name(
    state: StateFixture, tmp_path: Path
) -> None:
    """Another local user who can write the textfile collector's directory plants a symlink
    where the temporary file would go: the supervisor (often root) must not write through it."""
    node = tmp_path / "node"
    node.mkdir()
    path = node / "rlsup.prom"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    planted = [node / f"rlsup.prom.{os.getpid()}.tmp", node / ".rlsup.prom.tmp"]
    for link in planted:
        link.symlink_to(victim)
    ex = exporter(state, textfile=path)
    ex.refresh()
    assert ex.drain() == []
    assert victim.read_text() == "precious\n"
    assert not path.is_symlink() and "rlsup_game_steps" in path.read_text()
    assert sorted(p.name for p in node.iterdir()) == sorted(
        ["rlsup.prom", *(p.name for p in planted)]
    )


def test_each_games_time_split_and_cost_are_exported_as_status_has_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.state_fixture import build_state
    from supervisor.observe.status import collect

    fx = build_state(tmp_path / "fx", n_games=3, n_events=400, cost_per_hour=2.5)
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(fx.boot_id_path))
    path = tmp_path / "rlsup.prom"
    ex = exporter(fx, textfile=path)
    ex.refresh()
    got = samples(path.read_text())
    doc = collect(load_config(fx.config), time.time())
    timed = [g for g in doc["games"] if g["time"]]
    assert timed, "the fixture's ledger starts its games"
    for g in timed:
        parts = [value(got, "rlsup_game_seconds_total", game=g["name"], part=p) for p in
                 ("training", "evaluation", "redone", "setup", "starting", "waiting",
                  "backoff", "down")]  # fmt: skip
        assert None not in parts
        # the exporter's document is a few ms older than this one: a running game grew since
        assert sum(parts) == pytest.approx(g["time"]["wall_s"], abs=5.0)  # type: ignore[arg-type]
        assert value(got, "rlsup_game_cost_total", game=g["name"]) == pytest.approx(
            g["time"]["money"], abs=0.01
        )
        assert value(got, "rlsup_game_cost_lost_total", game=g["name"]) is not None


def test_spare_ready_counts_the_hosts_spares_which_have_no_local_pid(state: StateFixture) -> None:
    from supervisor.observe.metrics import families
    from supervisor.observe.status import collect

    doc: dict = dict(collect(load_config(state.config), time.time()))

    def ready(spare: dict | None) -> float:
        fams = families({**doc, "spare": spare}, {})
        [fam] = [f for f in fams if f.name == "rlsup_spare_ready"]
        return float(fam.samples[0].value)

    base = {"state": "ready", "pid": 4242, "alive": True, "device": "cpu", "since": None,
            "ready_since": None, "rss_mib": None, "pss_mib": None, "reason": "auto"}  # fmt: skip
    assert ready(base) == 1.0
    assert ready({**base, "alive": False}) == 0.0, "this host's spare, recorded but gone"
    # Several hosts: the row sums up the hosts' spares; none of them is a process here.
    assert ready({**base, "pid": None, "alive": False}) == 1.0
    assert ready({**base, "pid": None, "alive": False, "state": "warming"}) == 0.0
    assert ready(None) == 0.0
