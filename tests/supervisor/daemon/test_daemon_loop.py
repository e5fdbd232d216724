"""The supervisor's tick loop with real (tiny, torch-free) stand-in worker processes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.runs import REPO, FakeNvml, close_supervisors, spin
from supervisor.config import load_config
from supervisor.daemon import LockHeld, Supervisor, acquire_lock
from supervisor.launch.launcher import Launcher
from supervisor.ledger import db
from supervisor.lifecycle.states import WorkerState as S
from supervisor.stability import modes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

CONFIG = """\
{extra}
state_dir = "state"
stop_grace_s = 5
tick_s = 0.05
[modes.light]
num_envs = 2
batch_size = 2
n_steps = 4
max_concurrent = {cap}
[modes.heavy]
num_envs = 4
batch_size = 4
n_steps = 4
max_concurrent = {cap}
{games}
[restart]
backoff_base_s = 0.05
backoff_max_s = 0.1
budget = 1
budget_window_s = 60
{tail}
"""


def game(name: str, steps: int) -> str:
    return f'[[games]]\nname = "{name}"\nenv_id = "CartPole-v1"\ntotal_steps = {steps}\n'


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Supervisor]:
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    made: list[Supervisor] = []

    def factory(
        games: str,
        cap: int = 2,
        cores: int = 4,
        extra: str = "",
        tail: str = "",
        gpu: object = None,
    ) -> Supervisor:
        path = tmp_path / "rlsup.toml"
        path.write_text(CONFIG.format(cap=cap, games=games, extra=extra, tail=tail))
        launcher = Launcher(python=sys.executable, module="tests.supervisor.fake_worker")
        sup = Supervisor(
            load_config(path),
            launcher=launcher,
            cores=cores,
            exit_when_done=True,
            gpu_probe=gpu or FakeNvml(None),  # type: ignore[arg-type]
        )
        sup.start()
        made.append(sup)
        return sup

    yield factory  # type: ignore[misc]
    close_supervisors(made)


def test_games_beyond_max_concurrent_wait_in_config_order(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a", 40) + game("b", 40) + game("c", 40), cap=1, cores=4)
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    assert sup.games["b"].state is S.WAITING and sup.games["c"].state is S.WAITING
    assert sup.games["a"].heartbeat.threads == 4  # cores // 1 running
    order: list[str] = []

    def record() -> bool:
        for n, rt in sup.games.items():
            if rt.state is S.RUNNING and n not in order:
                order.append(n)
            assert sum(r.state in (S.STARTING, S.RUNNING) for r in sup.games.values()) <= 1
        return sup.finished

    spin(sup, record, 30)
    assert order == ["a", "b", "c"]
    assert all(rt.state is S.DONE for rt in sup.games.values())


def test_threads_divide_the_cores_among_running_workers(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a", 400) + game("b", 400), cap=2, cores=5)
    spin(sup, lambda: all(rt.heartbeat for rt in sup.games.values()))
    assert [rt.heartbeat.threads for rt in sup.games.values()] == [2, 2]


def test_config_error_exit_is_fatal_at_once_with_the_workers_message(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "state" / "runs" / "bad"
    run.mkdir(parents=True)
    (run / "fake.json").write_text(json.dumps({"exit": 78, "message": "--lr: must be > 0"}))
    sup = make(game("bad", 100) + game("ok", 100))
    spin(sup, lambda: sup.finished)
    assert sup.games["bad"].state is S.FATAL
    assert "--lr: must be > 0" in sup.games["bad"].reason
    assert sup.games["bad"].restarts == 0
    assert sup.games["ok"].state is S.DONE


def test_crash_loop_spends_the_budget_then_fatal(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "state" / "runs" / "bad"
    run.mkdir(parents=True)
    (run / "fake.json").write_text(json.dumps({"exit": 1, "kind": "crash", "message": "boom"}))
    sup = make(game("bad", 100))
    spin(sup, lambda: sup.finished)
    rt = sup.games["bad"]
    assert rt.state is S.FATAL and "restart budget" in rt.reason and rt.restarts == 1
    crashes = db.events(sup.on.conn, kind="worker_crash")  # type: ignore[arg-type]
    assert [e.detail["message"] for e in crashes] == ["boom", "boom"]


def test_pinned_mode_restarts_the_worker_with_new_sizes_without_a_failure(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a", 100_000))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    first = sup.games["a"].proc.pid
    modes.pin_mode(sup.on.conn, sup.cfg, "a", "heavy")
    spin(sup, lambda: (hb := sup.games["a"].heartbeat) is not None and hb.num_envs == 4)
    rt = sup.games["a"]
    assert rt.proc.pid != first and rt.failures == [] and rt.restarts == 0
    assert rt.heartbeat.resumed_from_step > 0
    exits = db.events(sup.on.conn, kind="worker_exit", game="a")  # type: ignore[arg-type]
    assert exits[-1].detail["returncode"] == 75


def test_lower_max_concurrent_sends_the_extra_worker_back_to_waiting(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a", 100_000) + game("b", 100_000), cap=2)
    spin(sup, lambda: all(rt.state is S.RUNNING for rt in sup.games.values()))
    # The mode in force now allows one game (config edited, then SIGHUP-reloaded).
    text = sup.cfg.path.read_text().replace("max_concurrent = 2", "max_concurrent = 1", 1)
    sup.cfg.path.write_text(text)
    sup.flags.reload = True
    spin(sup, lambda: sup.games["b"].state is S.WAITING)
    assert sup.games["a"].state is S.RUNNING
    assert db.events(sup.on.conn, kind="config_reload")  # type: ignore[arg-type]


def test_bad_reload_keeps_the_old_config(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a", 100_000))
    old = sup.cfg
    sup.cfg.path.write_text("state_dir = [")
    sup.flags.reload = True
    sup.safe_tick()
    assert sup.cfg is old
    errors = db.events(sup.on.conn, kind="config_error")  # type: ignore[arg-type]
    assert errors and "not valid TOML" in errors[0].detail["message"]


def _trained_for(run: Path, env_id: str, algo: str = "ppo") -> None:
    from checkpoints import CheckpointStore

    with CheckpointStore(run / "checkpoints").begin(64, {"game": env_id, "algo": algo}) as w:
        w.write_bytes("learner.pt", b"x")
        w.commit()


def test_reload_that_changes_a_games_env_id_is_refused_naming_both(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a", 100_000))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    _trained_for(sup.cfg.run_dir("a"), "CartPole-v1")
    pid, old = sup.games["a"].proc.pid, sup.cfg
    text = sup.cfg.path.read_text().replace('env_id = "CartPole-v1"', 'env_id = "Acrobot-v1"')
    sup.cfg.path.write_text(text)
    sup.flags.reload = True
    sup.safe_tick()
    assert sup.cfg is old and sup.games["a"].proc.pid == pid, "old config kept, worker untouched"
    [error] = db.events(sup.on.conn, kind="config_error")  # type: ignore[arg-type]
    message = error.detail["message"]
    assert "games[0].env_id" in message and "'Acrobot-v1'" in message
    assert "env_id = 'CartPole-v1'" in message and "move" in message


def test_rlsup_run_refuses_a_changed_algo_with_exit_2(tmp_path: Path) -> None:
    import subprocess

    path = tmp_path / "rlsup.toml"
    path.write_text(CONFIG.format(cap=1, games=game("a", 100), extra="", tail=""))
    _trained_for(tmp_path / "state" / "runs" / "a", "CartPole-v1", algo="dqn")
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "run", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "games[0].algo: got 'ppo'" in done.stderr and "algo = 'dqn'" in done.stderr
    assert not (tmp_path / "state" / "rlsup.db").exists(), "refused before anything was written"


def test_worker_reports_become_events_and_unreadable_checkpoints_back_off(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    damage = {"checkpoint": "ckpt-000000000064", "when": "load", "chunks": [3],
              "files": ["replay/frames-000003.bin"], "transitions_dropped": 61}  # fmt: skip
    for name, script in (
        ("rot", {"replay_damage": [damage]}),
        ("eio", {"exit": 1, "kind": "checkpoint_unreadable", "message": "cannot read x: EIO"}),
    ):
        run = tmp_path / "state" / "runs" / name
        run.mkdir(parents=True)
        (run / "fake.json").write_text(json.dumps(script))
    sup = make(game("rot", 100_000) + game("eio", 100), cap=2)
    spin(sup, lambda: sup.games["eio"].state is S.FATAL and sup.games["rot"].state is S.RUNNING)
    [event] = db.events(sup.on.conn, kind="replay_damaged", game="rot")  # type: ignore[arg-type]
    life = sup.games["rot"].life
    assert life is not None and event.detail == damage | {"pid": life.proc.pid}, "names its worker"
    unreadable = db.events(sup.on.conn, kind="checkpoint_unreadable", game="eio")  # type: ignore[arg-type]
    assert len(unreadable) == 2 and "EIO" in unreadable[0].detail["message"]
    assert db.events(sup.on.conn, kind="backoff", game="eio"), "retried after a backoff"
    assert "restart budget spent" in sup.games["eio"].reason
    assert not db.events(sup.on.conn, kind="checkpoint_corrupt")  # type: ignore[arg-type]


def test_reload_with_a_wrong_typed_worker_arg_keeps_the_old_config(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a", 100_000))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    old, pid = sup.cfg, sup.games["a"].proc.pid
    text = sup.cfg.path.read_text().replace(
        "total_steps = 100000\n", 'total_steps = 100000\nargs = { dueling = "yes" }\n'
    )
    sup.cfg.path.write_text(text)
    sup.flags.reload = True
    sup.safe_tick()
    assert sup.cfg is old and sup.games["a"].proc.pid == pid
    [error] = db.events(sup.on.conn, kind="config_error")  # type: ignore[arg-type]
    assert "games[0].args.dueling" in error.detail["message"]


def test_a_stop_request_in_the_database_stops_like_sigterm(make) -> None:  # type: ignore[no-untyped-def]
    """`rlsup stop` by an operator who may not signal the service (it runs as another user)."""
    sup = make(game("a", 100_000))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    import time

    conn = db.connect(sup.cfg.state_dir)
    with db.transaction(conn):
        db.request(conn, db.STOP_REQUEST, "uid 1000 (alice)", time.time())
    conn.close()
    spin(sup, lambda: sup.finished)
    assert sup.games["a"].state is S.STOPPED
    assert db.events(sup.on.conn, kind="worker_exit")[-1].detail["returncode"] == 75  # type: ignore[arg-type]
    assert db.pending_request(sup.on.conn, db.STOP_REQUEST) is None, "consumed"  # type: ignore[arg-type]


def test_sigterm_flag_stops_workers_and_records_a_clean_stop(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(game("a", 100_000))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    sup.flags.stop = True
    spin(sup, lambda: sup.finished)
    assert sup.games["a"].state is S.STOPPED
    assert db.events(sup.on.conn, kind="worker_exit")[-1].detail["returncode"] == 75  # type: ignore[arg-type]
    assert sup.on.conn.execute("SELECT clean_stop FROM boots").fetchone()[0] == 1  # type: ignore[union-attr]


def test_second_lock_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    fd = acquire_lock(tmp_path)
    try:
        with pytest.raises(LockHeld, match=r"pid \d+"):
            acquire_lock(tmp_path)
    finally:
        import os

        os.close(fd)


GPU = "[gpu]\nmin_free_mb = 1000\npoll_s = 0.01\ntimeout_s = {timeout}\n"


def test_gpu_game_waits_for_free_memory_then_starts(make) -> None:  # type: ignore[no-untyped-def]
    gpu = FakeNvml(100.0)
    sup = make(game("a", 100_000), gpu=gpu, tail=GPU.format(timeout=3600))
    for _ in range(5):
        sup.safe_tick()
        sup.wait(0.02)
    assert sup.games["a"].state is S.WAITING
    assert len(db.events(sup.on.conn, kind="gpu_wait")) == 1  # type: ignore[arg-type]
    gpu.free = 5000.0
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)


def test_gpu_wait_past_the_timeout_starts_one_rung_lower(make) -> None:  # type: ignore[no-untyped-def]
    gpu = FakeNvml(100.0)
    extra = 'initial_mode = "heavy"'
    sup = make(game("a", 100_000), gpu=gpu, extra=extra, tail=GPU.format(timeout=0.2))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    assert sup.games["a"].mode.name == "light"
    waits = db.events(sup.on.conn, kind="gpu_wait")  # type: ignore[arg-type]
    assert waits[-1].detail["timed_out"] and waits[-1].detail["to"] == "light"
    assert db.events(sup.on.conn, kind="scale_down", game="a")  # type: ignore[arg-type]
    for _ in range(5):  # and it is not restarted back at the heavier size
        sup.safe_tick()
        sup.wait(0.02)
    assert sup.games["a"].state is S.RUNNING and sup.games["a"].stop_reason is None


def test_cpu_games_skip_the_gpu_gate(make) -> None:  # type: ignore[no-untyped-def]
    gpu = FakeNvml(0.0)
    sup = make(game("a", 100_000) + 'device = "cpu"\n', gpu=gpu, tail=GPU.format(timeout=3600))
    spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    assert gpu.reads == 0


@pytest.mark.parametrize(
    ("env", "dirs", "files", "database"),
    [
        ({}, 0o700, 0o600, 0o600),  # `rlsup run` by hand: private to its owner
        ({"INVOCATION_ID": "x"}, 0o750, 0o640, 0o660),  # under systemd: its group reads
    ],
    ids=["by-hand", "systemd"],
)
def test_run_dirs_and_worker_logs_are_private(  # type: ignore[no-untyped-def]
    make, tmp_path, env, dirs, files, database
) -> None:
    import os
    import stat

    from supervisor.commands.run import state_umask

    old = os.umask(0o027)  # what the unit's UMask= hands the process under systemd
    try:
        os.umask(state_umask(env))  # what `rlsup run` does with it
        sup = make(game("a", 100_000))
        spin(sup, lambda: sup.games["a"].state is S.RUNNING)
    finally:
        os.umask(old)
    state = tmp_path / "state"
    for path, mode in (
        (state, dirs),
        (state / "runs" / "a", dirs),
        (state / "logs", dirs),
        (state / "logs" / "a.log", files),
        (state / "rlsup.db", database),
    ):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


def test_policy_seam_changes_modes_and_a_failing_policy_is_contained(make) -> None:  # type: ignore[no-untyped-def]
    calls: list[float] = []

    def policy(conn, cfg, now):  # type: ignore[no-untyped-def]
        calls.append(now)
        if len(calls) == 3:
            return [modes.auto_mode_change(conn, cfg, "*", "heavy", ["calm for 1 h"], now)]
        if len(calls) == 4:
            raise RuntimeError("policy bug")
        return None

    sup = make(game("a", 100_000))
    sup.policy = policy
    spin(sup, lambda: (hb := sup.games["a"].heartbeat) is not None and hb.num_envs == 4)
    assert len(calls) > 4
    assert db.events(sup.on.conn, kind="scale_up")  # type: ignore[arg-type]


def set_auto_mode(sup: Supervisor, scope: str, mode: str, reasons: list[str]) -> None:
    """As the policy would: a change, recorded by the supervisor's Recorder."""
    change = modes.auto_mode_change(sup.on.conn, sup.cfg, scope, mode, reasons)
    modes.record(sup.on.recorder, [change])


def test_the_spare_goes_where_the_policy_stepped_the_host_down_to_its_lowest_rung(  # type: ignore[no-untyped-def]
    make,
) -> None:
    """`initial_mode` at the lowest rung keeps the spare; a step down there (or a pin) drops
    it, with the reason in `spare_want`."""
    sup = make(game("a", 10_000), extra='initial_mode = "light"')
    assert sup.on.conn is not None
    sup.refresh_modes()
    starting = "starting at the lowest rung by initial_mode"
    assert not sup.on.spare.lowest_rung(sup.tick_view()), starting
    set_auto_mode(sup, modes.HOST, "heavy", ["calm"])
    set_auto_mode(sup, modes.HOST, "light", ["3 crashes in 3600 s"])
    sup.refresh_modes()
    assert sup.on.spare.lowest_rung(sup.tick_view())
    want = sup.on.spare.want(sup.tick_view())
    assert not want.want and "lowest mode" in want.reason
    set_auto_mode(sup, modes.HOST, "heavy", ["calm"])
    sup.refresh_modes()
    assert not sup.on.spare.lowest_rung(sup.tick_view())
    modes.pin_mode(sup.on.conn, sup.cfg, modes.HOST, "light")
    sup.refresh_modes()
    assert sup.on.spare.lowest_rung(sup.tick_view()), "an operator's pin to the lowest rung counts"


class _SlowLauncher(Launcher):
    """Each spawn takes 0.3 s (a backend whose start is slow, as a Ray actor's can be)."""

    def spawn(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        import time

        time.sleep(0.3)
        return super().spawn(*args, **kwargs)


def test_slow_spawns_stop_at_the_tick_budget_and_the_rest_start_next_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick never spends much more than SPAWN_BUDGET_S starting workers (a slow backend
    would hold the tick past the systemd watchdog); the games left start on the next ticks."""
    import time

    from supervisor import daemon

    monkeypatch.setattr(daemon, "SPAWN_BUDGET_S", 0.5)
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    path = tmp_path / "rlsup.toml"
    games = "".join(game(n, 100000) for n in "abcd")
    path.write_text(CONFIG.format(cap=4, games=games, extra="", tail=""))
    sup = Supervisor(
        load_config(path),
        launcher=_SlowLauncher(python=sys.executable, module="tests.supervisor.fake_worker"),
        cores=4,
        gpu_probe=FakeNvml(None),
    )
    try:
        sup.start()
        began = time.monotonic()
        sup.tick()
        took = time.monotonic() - began
        started = [n for n, rt in sup.games.items() if rt.life is not None]
        assert 1 <= len(started) <= 2, started
        assert took < 0.5 + 0.3 + 1.0, took  # the budget, one spawn past it, slack
        spin(sup, lambda: all(rt.life is not None for rt in sup.games.values()))
    finally:
        close_supervisors([sup])


def seeded(name: str, steps: int, seeds: str) -> str:
    return game(name, steps) + f"seeds = [{seeds}]\n"


def test_a_matrix_starts_every_games_first_seed_before_any_second(make) -> None:  # type: ignore[no-untyped-def]
    """Under max_concurrent the queue is fair: round-robin over games, not game after game."""
    sup = make(seeded("a", 40, "1, 2, 3") + seeded("b", 40, "1, 2"), cap=1, cores=4)
    order: list[str] = []

    def record() -> bool:
        order.extend(n for n, rt in sup.games.items() if rt.state is S.RUNNING and n not in order)
        return sup.finished

    spin(sup, record, 40)
    assert order == ["a/s1", "b/s1", "a/s2", "b/s2", "a/s3"]
    assert all(rt.state is S.DONE for rt in sup.games.values())
    assert (sup.cfg.state_dir / "runs" / "a" / "s3").is_dir()
    assert (sup.cfg.logs_dir / "b" / "s2.log").is_file()


def test_reload_adds_and_removes_seeds_without_touching_the_running_ones(make) -> None:  # type: ignore[no-untyped-def]
    sup = make(seeded("a", 100_000, "1, 2"), cap=3)
    spin(sup, lambda: all(rt.state is S.RUNNING for rt in sup.games.values()))
    pids = {n: rt.proc.pid for n, rt in sup.games.items()}
    sup.cfg.path.write_text(sup.cfg.path.read_text().replace("seeds = [1, 2]", "seeds = [1, 3]"))
    sup.flags.reload = True
    spin(sup, lambda: "a/s3" in sup.games and sup.games["a/s3"].state is S.RUNNING)
    assert sup.games["a/s1"].proc.pid == pids["a/s1"]  # untouched
    assert sup.games["a/s1"].restarts == 0
    assert "a/s2" not in sup.games
    spin(sup, lambda: "a/s2" not in sup.life.removed)  # its worker stopped, then forgotten
    with pytest.raises(ProcessLookupError):
        os.kill(pids["a/s2"], 0)
    assert sup.games["a/s3"].spec.seed == 3
