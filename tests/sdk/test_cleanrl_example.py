"""examples/cleanrl_dqn.py, a CleanRL-style single file on the SDK: killed with SIGKILL and started
again it resumes *exactly* (its checkpoint at a later step is byte for byte the one of a run
that was never interrupted), and SIGTERM ends in a final checkpoint and exit 75."""

from __future__ import annotations

import importlib.util
import json
import signal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from checkpoints.names import MANIFEST_NAME
from tests.sdk.sb3_helpers import EXAMPLES, Script, committed, heartbeat_step, wait_for
from training import protocol as P

pytestmark = pytest.mark.e2e

SCRIPT = EXAMPLES / "cleanrl_dqn.py"
N, K = 3000, 1000
ARGS = ["--total-steps", str(N), "--checkpoint-every-steps", str(K), "--learning-starts", "400",
        "--buffer-size", "2000", "--seed", "3"]  # fmt: skip
NO_TIMER = {P.CHECKPOINT_EVERY_S_ENV: "3600"}  # checkpoints by steps only


def files(ckpt: Path) -> dict[str, str]:
    """Every file of a checkpoint with its sha256 (the manifest's meta holds a wall-clock
    time: compared are the files)."""
    manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
    return {name: entry["sha256"] for name, entry in manifest["files"].items()}


def test_killed_and_resumed_it_is_byte_identical_to_an_uninterrupted_run(tmp_path: Path) -> None:
    straight, killed, logs = tmp_path / "straight", tmp_path / "killed", tmp_path / "logs"
    with Script(SCRIPT, ARGS, straight, logs, **NO_TIMER) as a:
        assert a.wait(120) == 0, a.output()
    with Script(SCRIPT, ARGS, killed, logs, **NO_TIMER) as b:
        wait_for(lambda: any(step == K for step, _ in committed(killed)), b, 120)
        b.proc.send_signal(signal.SIGKILL)
        assert b.wait(30) == -signal.SIGKILL
    assert [step for step, _ in committed(killed)] == [K]  # killed before its second
    with Script(SCRIPT, ARGS, killed, logs, **NO_TIMER) as c:
        assert c.wait(120) == 0, c.output()
    # It resumed (a restart from step 0 would write the same checkpoints and pass the rest).
    hb = P.read_heartbeat(killed)
    assert hb is not None and hb.resumed_from_step == K and hb.global_step == N
    want = dict(committed(straight))
    got = dict(committed(killed))
    assert sorted(got) == sorted(want) == [K, 2 * K, N]
    for step in (2 * K, N):
        assert files(got[step]) == files(want[step]), f"step {step} differs"
    assert {"nets.pt", "state.json", "arrays/obs.json"} <= set(files(got[N]))


def test_sigterm_checkpoints_and_exits_75(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with Script(SCRIPT, ["--total-steps", "100000"], run_dir, tmp_path / "logs", **NO_TIMER) as s:
        wait_for(lambda: heartbeat_step(run_dir) > 300, s, 120)
        s.proc.send_signal(signal.SIGTERM)
        assert s.wait(60) == P.ExitCode.STOPPED, s.output()
    ((step, _),) = committed(run_dir)
    hb = P.read_heartbeat(run_dir)
    assert hb is not None and hb.last_checkpoint_step == step and step > 300


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cleanrl_dqn", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_env_state_round_trips_through_json_mid_episode() -> None:
    """What the kill test cannot reach in 3000 steps: a resumed episode is truncated at the same
    step (TimeLimit's count), and the episodes after it start where they would have (CartPole's
    own RNG), with the physics mid-episode exact through JSON."""
    import gymnasium as gym

    ex = example()
    a = gym.make("CartPole-v1")
    a.reset(seed=11)
    for action in (0, 1, 0, 1, 0):
        a.step(action)
    ex.time_limit(a)._elapsed_steps = 497  # truncated 3 steps from now
    saved = json.loads(json.dumps(ex.env_state(a)))
    b = gym.make("CartPole-v1")
    b.reset(seed=99)  # another episode entirely, as a fresh process's first reset
    ex.set_env_state(b, saved)
    ends: list[tuple[bool, bool]] = []
    for i in range(200):
        action = i % 2
        got: list[Any] = [a.step(action), b.step(action)]
        (oa, ra, ta, ua, _), (ob, rb, tb, ub, _) = got
        assert oa.tobytes() == ob.tobytes() and (ra, ta, ua) == (rb, tb, ub), f"step {i}"
        if ta or ua:
            ends.append((ta, ua))
            assert a.reset()[0].tobytes() == b.reset()[0].tobytes()
    assert ends[0] == (False, True) and len(ends) > 3  # truncated, then more episodes
