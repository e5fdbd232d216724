"""The spare worker (`python -m training.worker --standby`): a real pre-warmed process that
becomes a worker on assignment, and is then indistinguishable from a cold one."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from supervisor.launch.spare import SpareKeeper, SpareWant
from supervisor.launch.spawn import process_argv
from tests.training.workerutil import heartbeat, run

pytestmark = pytest.mark.e2e

COMMON = ["--game", "CartPole-v1", "--num-envs", "4", "--batch-size", "64", "--seed", "3",
          "--eval-episodes", "0", "--threads", "2", "--device", "cpu",
          "--checkpoint-every-s", "3600"]  # fmt: skip
ALGOS = {
    "ppo": ["--algo", "ppo", "--n-steps", "64", "--total-steps", "1536"],
    "dqn": ["--algo", "dqn", "--total-steps", "1200", "--learning-starts", "256",
            "--buffer-size", "4096", "--train-frequency", "4", "--target-update-interval", "256"],
}  # fmt: skip


def ready_spare(keeper: SpareKeeper, tmp: Path, timeout: float = 180) -> int:
    want = SpareWant(True, "test", "cpu", tmp / "spare.log", tmp)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keeper.tend(want, time.monotonic())
        if keeper.spare is not None and keeper.spare.state == "ready":
            return keeper.spare.pid
        time.sleep(0.1)
    raise AssertionError(f"no ready spare in {timeout} s: {(tmp / 'spare.log').read_text()}")


def nice_of(pid: int, tid: int | None = None) -> int:
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    return int(Path(path).read_text().rsplit(")", 1)[1].split()[16])


def newest_checkpoint(run_dir: Path) -> Path:
    ckpts = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("ckpt-"))
    assert ckpts, f"no checkpoint in {run_dir}"
    return ckpts[-1]


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_worker_from_the_spare_writes_the_same_checkpoint_as_a_cold_one(
    tmp_path: Path, algo: str
) -> None:
    argv_tail = [*COMMON, *ALGOS[algo]]
    cold_dir, spare_dir = tmp_path / "cold", tmp_path / "spare"
    done = run(cold_dir, *argv_tail)
    assert done.returncode == 0, done.stdout + done.stderr

    keeper = SpareKeeper(sys.executable, "training.worker")
    try:
        pid = ready_spare(keeper, tmp_path)
        assert nice_of(pid) == 19, "the spare warms at low priority"
        spare_dir.mkdir()
        argv = ["--run-dir", str(spare_dir), *argv_tail]
        proc = keeper.take(argv, tmp_path / "worker.log", spare_dir, time.monotonic())
        assert proc is not None and proc.pid == pid and proc.served == "spare"
        # Once it has taken the assignment it is the cold worker's twin: normal priority on
        # every thread, the cold command line.
        deadline = time.monotonic() + 60
        while (hb := heartbeat(spare_dir)) is None or hb.get("phase") != "training":
            assert time.monotonic() < deadline and proc.poll() is None, "never trained"
            time.sleep(0.05)
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        assert [nice_of(pid, t) for t in tids] == [0] * len(tids)
        cmd = process_argv(psutil.Process(pid).cmdline())
        assert cmd[1:] == ["-P", "-m", "training.worker", *argv]
        assert proc.wait(240) == 0, (tmp_path / "worker.log").read_text()[-3000:]
        assert not proc.lost_before_start(), "it acknowledged its assignment"
        proc.close()
    finally:
        keeper.close()
    cold_hb, spare_hb = heartbeat(cold_dir), heartbeat(spare_dir)
    assert cold_hb is not None and spare_hb is not None
    assert cold_hb["start"]["served"] == "cold" and spare_hb["start"]["served"] == "spare"
    assert spare_hb["start"]["assigned"] <= spare_hb["start"]["loaded"]
    assert spare_hb["start"]["loaded"] <= spare_hb["start"]["first_step"]
    a, b = newest_checkpoint(cold_dir), newest_checkpoint(spare_dir)
    assert a.name == b.name, "the same final step"
    # Byte-identical learner state (network, optimizer, scheduler, RNG, counters); the same
    # config but for the run dir each was given.
    assert (a / "learner.pt").read_bytes() == (b / "learner.pt").read_bytes()
    cold_cfg, spare_cfg = (json.loads((c / "config.json").read_text()) for c in (a, b))
    assert cold_cfg.pop("run_dir") == str(cold_dir) and spare_cfg.pop("run_dir") == str(spare_dir)
    assert cold_cfg == spare_cfg
    # DQN: the replay buffer's chunks too.
    files = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    assert files == {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    for rel in files - {Path("MANIFEST.json"), Path("state.json"), Path("config.json")}:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_an_idle_spare_exits_when_its_supervisor_is_gone(tmp_path: Path) -> None:
    keeper = SpareKeeper(sys.executable, "training.worker")
    try:
        ready_spare(keeper, tmp_path)
        spare = keeper.spare
        assert spare is not None
        assert not list((tmp_path).glob("**/worker.lock")), "no run-dir lock before assignment"
        spare.chan.close()  # what the kernel does to the supervisor's end when it dies
        assert spare.popen.wait(15) == 0
        keeper.spare = None
    finally:
        keeper.close()
