"""Command games under a real `rlsup run`: the user's own program as a game (docs/own-trainer.md).
Real processes, the real ledger; the programs are small Python scripts written by the tests,
and one uses the SDK (`import rlsup`) to heartbeat and checkpoint."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.runs import (
    committed_step,
    env_for,
    events,
    kill_quietly,
    rlsup,
    start_supervisor,
    stop_supervisor,
    wait_for,
)
from training import protocol as P

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HEAD = """\
state_dir = "state"
checkpoint_every_s = 1
stop_grace_s = 10
tick_s = 0.1
[modes.light]
num_envs = 3
batch_size = 16
n_steps = 8
max_concurrent = 8
[restart]
backoff_base_s = 0.2
backoff_max_s = 0.5
budget = 3
budget_window_s = 600
[watchdog]
startup_grace_s = 3
hang_timeout_s = 3
kill_grace_s = 2
"""


def command_game(name: str, script: str, **keys: Any) -> str:
    lines = [f'[[games]]\nname = "{name}"\ncommand = {json.dumps([sys.executable, script])}']
    lines += [f"{k} = {toml_value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + '\ndevice = "cpu"\n'


def toml_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {json.dumps(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)


def write(tmp: Path, name: str, body: str) -> str:
    path = tmp / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def status(tmp: Path, config: Path) -> dict[str, Any]:
    out = rlsup("status", "--json", "--config", str(config), env=env_for(tmp))
    assert out.returncode in (0, 1, 3, 4), out.stderr
    if out.returncode == 1 and not out.stdout.strip():
        return {}  # no state database yet (a loaded machine: asked before the supervisor made it)
    doc = json.loads(out.stdout)
    return {g["name"]: g for g in doc["games"]}


def game_processes(name: str) -> list[psutil.Process]:
    """Live processes started as the command game `name` (by their environment)."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get(P.GAME_ENV) == name:
                out.append(p)
        except psutil.Error:
            continue
    return out


RECORD_ENV = """
    import json, os, sys
    keep = {k: v for k, v in os.environ.items() if k.startswith(("RLSUP_", "OMP_", "MINE"))}
    keep["cwd"] = os.getcwd()
    with open(os.path.join(os.environ["RLSUP_RUN_DIR"], "env.json"), "w") as f:
        json.dump(keep, f)
"""
CRASH = """
    import sys
    print("step 10: loss is nan, giving up", file=sys.stderr)
    sys.exit(3)
"""
CONFIG_ERROR = """
    import sys
    print("usage: train.py [--lr LR]", file=sys.stderr)
    print("train.py: --lr must be positive, got -1", file=sys.stderr)
    sys.exit(78)
"""
SLEEP = """
    import time
    time.sleep(600)
"""


def test_command_games_get_the_contract_and_every_failure_ends_defined(tmp_path: Path) -> None:
    games = [
        command_game(
            "envs",
            write(tmp_path, "envs.py", RECORD_ENV),
            env={"MINE": "yes"},
            total_steps=5000,
            seed=7,
        ),
        command_game("crashy", write(tmp_path, "crash.py", CRASH)),
        command_game("badconf", write(tmp_path, "conf.py", CONFIG_ERROR)),
        '[[games]]\nname = "missing"\ncommand = ["/nonexistent/train"]\n',
        command_game("quiet", write(tmp_path, "quiet.py", SLEEP)),
        command_game("silent", write(tmp_path, "silent.py", SLEEP), heartbeat=True),
    ]
    config = tmp_path / "rlsup.toml"
    config.write_text(HEAD + "".join(games))
    state = tmp_path / "state"
    sup = start_supervisor(config, env_for(tmp_path))
    try:
        wait_for(lambda: events(state, "worker_hang", "silent"), 30, "silent hung")
        wait_for(
            lambda: all(
                status(tmp_path, config)[g]["state"] in want
                for g, want in {
                    "envs": ("done",),
                    "crashy": ("fatal",),
                    "badconf": ("fatal",),
                    "missing": ("fatal",),
                }.items()
            ),
            60,
            "the short games settled",
        )
        games_doc = status(tmp_path, config)
        quiet = games_doc["quiet"]
        assert quiet["state"] == "running" and not events(state, "worker_hang", "quiet")
        assert (quiet["kind"], quiet["contract_level"], quiet["hang_detection"]) == (
            "command", "L0", False,
        )  # fmt: skip
        assert not quiet["heartbeat_stale"]
        text = rlsup("status", "--config", str(config), env=env_for(tmp_path)).stdout
        assert "quiet: command game, L0" in text and "no hang detection" in text
        # The log's tail says why, each of its lines kept under the note.
        assert (
            "! badconf: fatal: configuration error: usage: train.py [--lr LR]\n"
            "      train.py: --lr must be positive, got -1\n"
        ) in text, text
    finally:
        stop_supervisor(sup)
    assert not game_processes("quiet") and not game_processes("silent")

    recorded = json.loads((state / "runs" / "envs" / "env.json").read_text())
    assert recorded["cwd"] == str(state / "runs" / "envs")
    assert recorded[P.RUN_DIR_ENV] == str(state / "runs" / "envs")
    assert (recorded[P.GAME_ENV], recorded[P.SEED_ENV], recorded[P.MODE_ENV]) == (
        "envs",
        "7",
        "light",
    )
    assert (recorded[P.NUM_ENVS_ENV], recorded[P.BATCH_SIZE_ENV]) == ("3", "16")
    assert recorded[P.TOTAL_STEPS_ENV] == "5000" and recorded[P.RESUME_COUNT_ENV] == "0"
    assert recorded[P.CHECKPOINT_EVERY_S_ENV] == "1" and recorded[P.HEARTBEAT_ENV] == "0"
    assert recorded["OMP_NUM_THREADS"] == recorded[P.THREADS_ENV] and recorded["MINE"] == "yes"

    crashes = events(state, "worker_crash", "crashy")
    assert len(crashes) == 4  # the first and its three restarts (budget 3)
    assert "loss is nan" in crashes[-1]["detail"]["message"]
    (fatal,) = events(state, "fatal", "crashy")
    assert "restart budget spent" in fatal["detail"]["reason"]
    (fatal,) = events(state, "fatal", "badconf")
    assert "--lr must be positive" in fatal["detail"]["reason"]
    assert len(events(state, "worker_start", "badconf")) == 1  # no restart loop
    (fatal,) = events(state, "fatal", "missing")
    assert "/nonexistent/train" in fatal["detail"]["reason"]
    assert not events(state, "worker_start", "missing") and not events(state, "restart", "missing")


SDK_LOOP = """
    import sys, time, rlsup
    run = rlsup.attach()
    step = 0
    if (d := run.latest()) is not None:
        step = int((d / "step").read_text())
    print("resumed", step, run.resume_count, flush=True)
    while step < 10**9:
        step += 10
        time.sleep(0.01)
        run.heartbeat(step, mean_return=step / 1000)
        if run.should_checkpoint(step):
            with run.checkpoint(step) as d:
                (d / "step").write_text(str(step))
        if run.should_stop():
            run.exit_stopped()
"""


def test_an_sdk_game_is_killed_resumes_from_its_checkpoint_and_is_never_duplicated(
    tmp_path: Path,
) -> None:
    script = write(tmp_path, "train.py", SDK_LOOP)
    config = tmp_path / "rlsup.toml"
    config.write_text(HEAD + command_game("mine", script, heartbeat=True, knobs=["num_envs"]))
    state, env = tmp_path / "state", env_for(tmp_path)
    sup = start_supervisor(config, env)
    try:
        wait_for(lambda: committed_step(state, "mine") > 0, 30, "a first checkpoint")
        doc = status(tmp_path, config)["mine"]
        assert (doc["kind"], doc["contract_level"], doc["hang_detection"]) == (
            "command",
            "L2",
            True,
        )
        (first,) = game_processes("mine")
        ckpt = committed_step(state, "mine")
        first.kill()
        wait_for(lambda: events(state, "worker_crash", "mine"), 30, "the crash recorded")
        wait_for(lambda: [p for p in game_processes("mine") if p.pid != first.pid], 30, "a restart")
        hb = wait_for(
            lambda: (h := P.read_heartbeat(state / "runs" / "mine")) and h.resumed_from_step and h,
            30,
            "the resumed heartbeat",
        )
        assert hb.resumed_from_step >= ckpt and hb.writer == "sdk" and hb.resume_count == 1
        # The supervisor dies: the SDK sees its parent gone, checkpoints and exits 75; the
        # successor starts one new process (a script without the SDK: the next test).
        second = game_processes("mine")[0]
        kill_quietly(sup.pid, signal.SIGKILL)
        sup.wait()
        sup = start_supervisor(config, env)
        wait_for(
            lambda: [p for p in game_processes("mine") if p.pid != second.pid],
            60,
            "the game started again by the new supervisor",
        )
        assert not second.is_running() or second.status() == psutil.STATUS_ZOMBIE
        (third,) = game_processes("mine")
        wait_for(
            lambda: (h := P.read_heartbeat(state / "runs" / "mine")) and h.pid == third.pid,
            30,
            "the new process heartbeating",
        )
    finally:
        stop_supervisor(sup)
    stopped = events(state, "worker_exit", "mine")[-1]["detail"]
    assert stopped["returncode"] == P.ExitCode.STOPPED  # its final checkpoint, then 75
    assert not game_processes("mine")
    assert os.path.exists(state / "runs" / "mine" / P.LOCK_FILE)


def test_a_supervisor_restart_stops_a_command_games_leftover_before_starting_it(
    tmp_path: Path,
) -> None:
    config = tmp_path / "rlsup.toml"
    config.write_text(HEAD + command_game("plain", write(tmp_path, "plain.py", SLEEP)))
    env = env_for(tmp_path)
    sup = start_supervisor(config, env)
    try:
        (first,) = wait_for(lambda: game_processes("plain"), 30, "the game started")
        kill_quietly(sup.pid, signal.SIGKILL)
        sup.wait()
        assert first.is_running()  # a script without the SDK outlives its supervisor
        sup = start_supervisor(config, env)
        wait_for(
            lambda: [p for p in game_processes("plain") if p.pid != first.pid],
            60,
            "the game started again",
        )
        assert len(game_processes("plain")) == 1
        started = events(tmp_path / "state", "supervisor_start")[-1]["detail"]
        assert first.pid in started["leftover_workers_stopped"]
    finally:
        stop_supervisor(sup)
    assert not game_processes("plain")


RECORD_THEN_SLEEP = (
    RECORD_ENV
    + """
    import time
    time.sleep(600)
"""
)
HEAVY = """\
[modes.heavy]
num_envs = 6
batch_size = 16
n_steps = 8
max_concurrent = 8
"""


def test_a_mode_change_restarts_only_a_command_game_that_honours_a_knob(tmp_path: Path) -> None:
    """`rlsup scale`: the game with `knobs = ["num_envs"]` restarts with the heavy mode's
    RLSUP_NUM_ENVS; the one without knobs keeps its process (no restart, no failure)."""
    config = tmp_path / "rlsup.toml"
    config.write_text(
        HEAD.replace("[restart]", HEAVY + "[restart]")
        + command_game("fixed", write(tmp_path, "fixed.py", SLEEP))
        + command_game(
            "scaled", write(tmp_path, "scaled.py", RECORD_THEN_SLEEP), knobs=["num_envs"]
        )
    )
    state, env = tmp_path / "state", env_for(tmp_path)
    recorded = state / "runs" / "scaled" / "env.json"
    sup = start_supervisor(config, env)
    try:
        (fixed,) = wait_for(lambda: game_processes("fixed"), 30, "fixed started")
        (scaled,) = wait_for(lambda: game_processes("scaled"), 30, "scaled started")
        wait_for(recorded.exists, 30, "scaled recorded its environment")
        assert json.loads(recorded.read_text())[P.NUM_ENVS_ENV] == "3"
        recorded.unlink()
        out = rlsup("scale", "--mode", "heavy", "--config", str(config), env=env)
        assert out.returncode == 0, out.stderr
        wait_for(recorded.exists, 30, "scaled restarted in the heavy mode")
        again = json.loads(recorded.read_text())
        assert (again[P.MODE_ENV], again[P.NUM_ENVS_ENV], again[P.RESUME_COUNT_ENV]) == (
            "heavy",
            "6",
            "1",
        )
        assert [p.pid for p in game_processes("scaled")] != [scaled.pid]
        assert [p.pid for p in game_processes("fixed")] == [fixed.pid]
        assert status(tmp_path, config)["fixed"]["state"] == "running"
    finally:
        stop_supervisor(sup)
    assert not events(state, "worker_exit", "fixed")[:-1]  # only the final stop
    assert not events(state, "worker_crash", "scaled") and not events(state, "backoff", "scaled")


BEATS_THEN_STALLS = """
    import time, rlsup
    run = rlsup.attach(step_deadline_s=1)
    for step in range(1, 30):
        run.heartbeat(step * 10)
        time.sleep(0.05)
    time.sleep(600)  # alive, its heartbeat thread fresh, its step stuck
"""


def test_a_game_that_promised_no_heartbeat_but_sends_them_is_judged_by_them(
    tmp_path: Path,
) -> None:
    """`heartbeat = false` is no exemption once heartbeats come: a stuck step is a hang."""
    config = tmp_path / "rlsup.toml"
    config.write_text(
        HEAD + command_game("stalls", write(tmp_path, "stalls.py", BEATS_THEN_STALLS))
    )
    state = tmp_path / "state"
    sup = start_supervisor(config, env_for(tmp_path))
    try:
        doc = wait_for(
            lambda: (
                (d := status(tmp_path, config).get("stalls")) and d["contract_level"] == "L1" and d
            ),
            30,
            "its heartbeats seen",
        )
        assert (doc["kind"], doc["hang_detection"]) == ("command", True)
        (hang, *_) = wait_for(lambda: events(state, "worker_hang", "stalls"), 40, "judged hung")
        assert "global_step stuck at 290" in hang["detail"]["reason"]
    finally:
        stop_supervisor(sup)
    assert not game_processes("stalls")


FINISHES = """
    import rlsup
    run = rlsup.attach()
    step = 0
    while step < 5000:
        step += 7
        run.heartbeat(step)
    with run.checkpoint(step) as d:
        (d / "step").write_text(str(step))
"""


def test_a_wrapped_scripts_last_step_reaches_the_supervisor(tmp_path: Path) -> None:
    """`sh -c "python train.py; true"`: the SDK's last heartbeat, written as it exits, is read
    after the shell's exit, when the script is no longer in the session: still the game's."""
    script = write(tmp_path, "train.py", FINISHES)
    config = tmp_path / "rlsup.toml"
    game = command_game("mine", script, heartbeat=True, total_steps=5000).replace(
        json.dumps([sys.executable, script]),
        json.dumps(["sh", "-c", f"{sys.executable} {script}; sleep 0.3; true"]),
    )
    config.write_text(HEAD + game)
    state, env = tmp_path / "state", env_for(tmp_path)
    sup = start_supervisor(config, env, "--exit-when-done")
    try:
        assert sup.wait(60) == 0, (tmp_path / "supervisor.log").read_text()[-3000:]
    finally:
        stop_supervisor(sup)
    done = events(state, "worker_exit", "mine")[-1]["detail"]
    assert (done["global_step"], done["last_checkpoint_step"]) == (5005, 5005), done
    assert status(tmp_path, config)["mine"]["global_step"] == 5005


@pytest.mark.parametrize("wrapped", [False, True], ids=["python", "sh -c"])
def test_an_sdk_game_that_cannot_read_its_checkpoints_backs_off_and_resumes_the_newest(
    tmp_path: Path, wrapped: bool
) -> None:
    """EIO under the checkpoints (a failing disk, a lost mount): each start exits
    checkpoint_unreadable, which the supervisor records as that event (not a crash of the
    script's), and backs off; nothing is quarantined; once reads work, the newest checkpoint is
    resumed. Behind `sh -c "...; exit $?"` the script is not the process started, and its
    error.json is the game's all the same."""
    script = write(tmp_path, "train.py", SDK_LOOP)
    game = command_game("mine", script, heartbeat=True)
    if wrapped:
        game = game.replace(
            json.dumps([sys.executable, script]),
            json.dumps(["sh", "-c", f"{sys.executable} {script}; exit $?"]),
        )
    config = tmp_path / "rlsup.toml"
    config.write_text(HEAD.replace("budget = 3", "budget = 50") + game)
    control = tmp_path / "read-faults"
    control.write_text("")
    state = tmp_path / "state"
    env = env_for(tmp_path, RLSUP_FAULT_READ_ERRORS=str(control))
    ckpts = state / "runs" / "mine" / "checkpoints"
    sup = start_supervisor(config, env)
    try:
        wait_for(lambda: committed_step(state, "mine") > 0, 30, "a first checkpoint")
        [first] = [p for p in game_processes("mine") if p.cmdline()[:2] == [sys.executable, script]]
        control.write_text(f"EIO {ckpts}/\n")
        first.kill()
        seen = wait_for(
            lambda: events(state, "checkpoint_unreadable", "mine"), 60, "checkpoint_unreadable"
        )
        newest = committed_step(state, "mine")
        assert not [p for p in ckpts.iterdir() if p.name.startswith(".corrupt")]
        control.write_text("")
        hb = wait_for(
            lambda: (
                (h := P.read_heartbeat(state / "runs" / "mine"))
                and h.resumed_from_step is not None
                and h.global_step > h.resumed_from_step
                and h
            ),
            60,
            "training resumed once the disk reads again",
        )
        assert hb.resumed_from_step == newest
    finally:
        stop_supervisor(sup)
    assert seen[0]["detail"]["error_kind"] == "checkpoint_unreadable", seen[0]
    assert os.strerror(5) in seen[0]["detail"]["message"]
    exits = [e["detail"] for e in events(state, "worker_exit", "mine")]
    unreadable = [d for d in exits if (d.get("error") or {}).get("kind") == "checkpoint_unreadable"]
    assert unreadable and all(d["returncode"] == 1 for d in unreadable), exits
    assert not [e for e in events(state, "fatal", "mine")]


def test_an_sdk_game_whose_checkpoints_all_fail_to_verify_is_fatal_at_once(tmp_path: Path) -> None:
    """Checkpoints exist and none verifies: the SDK script that lets NoValidCheckpoint escape
    exits 78 as rlsup's worker does, so the game is FATAL at once naming why (no restarts
    until the budget is spent: each would find the same), with its checkpoint_corrupt event;
    nothing starts from zero."""
    script = write(tmp_path, "train.py", SDK_LOOP)
    config = tmp_path / "rlsup.toml"
    config.write_text(HEAD.replace("budget = 3", "budget = 50") + command_game("mine", script))
    state, env = tmp_path / "state", env_for(tmp_path)
    sup = start_supervisor(config, env)
    try:
        wait_for(lambda: committed_step(state, "mine") > 0, 30, "a first checkpoint")
    finally:
        stop_supervisor(sup)
    for step_file in (state / "runs" / "mine" / "checkpoints").glob("ckpt-*/step"):
        step_file.write_text("rot")
    sup = start_supervisor(config, env)
    try:
        wait_for(lambda: events(state, "fatal", "mine"), 60, "the game FATAL")
    finally:
        stop_supervisor(sup)
    (fatal,) = events(state, "fatal", "mine")
    assert "none verif" in fatal["detail"]["reason"] or "verified" in fatal["detail"]["reason"]
    assert "refusing to start from zero" in fatal["detail"]["reason"], fatal
    assert events(state, "checkpoint_corrupt", "mine")
    last = events(state, "worker_exit", "mine")[-1]["detail"]
    assert last["returncode"] == P.ExitCode.CONFIG, last
    starts = events(state, "worker_start", "mine")
    assert len(starts) == 2, "one start before the rot, one after it: no restart loop"


OOM_WHEN_HEAVY = """
    import time, rlsup
    run = rlsup.attach()
    if run.knobs["num_envs"] > 3:
        # The first optimizer step at the heavy mode's size, on a GPU another process fills.
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    step = 0
    while not run.should_stop():
        step += 10
        time.sleep(0.01)
        run.heartbeat(step)
"""


def test_an_sdk_game_out_of_memory_is_stepped_down_and_restarted_smaller(tmp_path: Path) -> None:
    """The seeds' first failure, in the user's own script: CUDA OOM at the first optimizer
    step. Uncaught, the SDK makes it exit 76 (as rlsup's worker does), so the stability policy
    steps the game down before its restart, and the script comes back with the lighter mode's
    knobs and trains, instead of crashing at the same size until the budget is spent."""
    script = write(tmp_path, "train.py", OOM_WHEN_HEAVY)
    heavy = "[modes.heavy]\nnum_envs = 6\nbatch_size = 32\nn_steps = 8\nmax_concurrent = 8\n"
    config = tmp_path / "rlsup.toml"
    config.write_text(
        'initial_mode = "heavy"\n' + HEAD + heavy + "[stability]\ncalm_s = 3600\n"
        + command_game("mine", script, heartbeat=True, knobs=["num_envs"])
    )  # fmt: skip
    state, env = tmp_path / "state", env_for(tmp_path)
    sup = start_supervisor(config, env)
    try:
        wait_for(
            lambda: (h := P.read_heartbeat(state / "runs" / "mine")) and h.global_step > 0,
            60,
            "the script training after its restart",
        )
    finally:
        stop_supervisor(sup)
    [oom] = events(state, "worker_oom", "mine")
    assert oom["detail"]["returncode"] == P.ExitCode.OOM, oom
    assert oom["detail"]["error_kind"] == "cuda_oom", oom
    assert "CUDA out of memory" in oom["detail"]["message"], oom
    [down] = events(state, "scale_down", "mine")
    assert (down["detail"]["from"], down["detail"]["to"]) == ("heavy", "light"), down
    assert [e["detail"]["mode"] for e in events(state, "worker_start", "mine")][:1] == ["heavy"]
    assert [e["detail"]["mode"] for e in events(state, "restart", "mine")] == ["light"]
    assert not events(state, "worker_crash", "mine")
