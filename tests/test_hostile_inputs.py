"""Hostile inputs: a checkpoint crafted to run code on load, path-traversal names in the
configuration, and the privacy of everything rlsup writes (state DB, run dirs, checkpoints)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONWARNINGS"] = "ignore"
    env["RLSUP_BOOT_ID_PATH"] = str(tmp / "boot_id")
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "RLSUP_CONFIG"):
        env.pop(key, None)
    (tmp / "boot_id").write_text("hostile-boot\n")
    return env


# ---- a checkpoint that would run code when unpickled --------------------------------------


class _Payload:
    """Unpickling this calls exec(): it creates the marker file. Never load it unsafely."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def _craft_checkpoint(run_dir: Path, step: int, marker: Path) -> Path:
    """ckpt-<step> with a malicious learner.pt and a manifest whose checksums all verify."""
    import torch

    ckpt = run_dir / "checkpoints" / f"ckpt-{step:012d}"
    ckpt.mkdir(parents=True, mode=0o700)
    with open(ckpt / "learner.pt", "wb") as f:
        torch.save({"learner": _Payload(marker), "rng": _Payload(marker)}, f)
    (ckpt / "state.json").write_text(json.dumps({"global_step": step, "resume_count": 0}))
    (ckpt / "config.json").write_text(json.dumps({"game": "CartPole-v1", "algo": "ppo"}))
    files = {}
    for p in sorted(ckpt.iterdir()):
        data = p.read_bytes()
        files[p.name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {
        "schema": 1,
        "step": step,
        "created": time.time(),
        "boot_id": "hostile",
        "rlsup_version": "0",
        "meta": {"game": "CartPole-v1", "algo": "ppo"},
        "files": files,
    }
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest, sort_keys=True, indent=2))
    return ckpt


def test_the_payload_is_live_when_loaded_unsafely(tmp_path: Path) -> None:
    # Guards the next test: the crafted file really runs code if anyone unpickles it (plain
    # pickle on the archive's data.pkl, which is what an unsafe torch.load would run).
    import pickle
    import zipfile

    marker = tmp_path / "unsafe-marker"
    ckpt = _craft_checkpoint(tmp_path / "run", 4096, marker)
    with zipfile.ZipFile(ckpt / "learner.pt") as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    pickle.loads(data)  # the point of this test: unsafe loading runs the payload
    assert marker.exists()


def test_code_carrying_checkpoint_is_refused_not_executed(tmp_path: Path) -> None:
    from checkpoints import CheckpointStore

    run_dir = tmp_path / "run"
    marker = tmp_path / "PWNED"
    ckpt = _craft_checkpoint(run_dir, 4096, marker)
    CheckpointStore(run_dir / "checkpoints").verify(
        CheckpointStore(run_dir / "checkpoints").latest()  # type: ignore[arg-type]
    )  # the manifest verifies: only the loader stands between the file and exec()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.worker",
            "--run-dir",
            str(run_dir),
            "--game",
            "CartPole-v1",
            "--algo",
            "ppo",
            "--num-envs",
            "4",
            "--n-steps",
            "32",
            "--batch-size",
            "64",
            "--total-steps",
            "20000",
            "--eval-episodes",
            "0",
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
        cwd=REPO,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert not marker.exists(), "loading the checkpoint executed code from it"
    # Refused and quarantined as corrupt; with nothing older to fall back to, the worker
    # refuses to start from zero (78: not retried) instead of crashing in a loop.
    assert done.returncode == 78, (done.returncode, done.stderr[-2000:])
    error = json.loads((run_dir / "error.json").read_text())
    assert error["kind"] == "no_valid_checkpoint", error
    hb = json.loads((run_dir / "heartbeat.json").read_text())
    assert any("weights-only loader" in q for q in hb["quarantined"]), hb["quarantined"]
    assert hb["global_step"] == 0 and hb["phase"] != "training"
    assert not (run_dir / "progress.csv").exists()
    names = [p.name for p in (run_dir / "checkpoints").iterdir()]
    assert not [n for n in names if n.startswith("ckpt-")], names
    assert [n for n in names if n.startswith(f".corrupt-{ckpt.name}")], names


def test_code_carrying_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    marker = tmp_path / "PWNED"
    args = [sys.executable, "-m", "training.worker", "--run-dir", str(run_dir)]
    args += ["--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "32"]
    args += ["--batch-size", "64", "--eval-episodes", "0", "--device", "cpu", "--threads", "1"]
    args += ["--checkpoint-every-steps", "1000"]
    first = subprocess.run(
        [*args, "--total-steps", "2000"], cwd=REPO, env=_env(tmp_path), capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    legit = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*"))[-1]
    _craft_checkpoint(run_dir, 3000, marker)  # newer than anything legit, short of the total
    again = subprocess.run(
        [*args, "--total-steps", "4000"], cwd=REPO, env=_env(tmp_path), capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    assert not marker.exists(), "loading the checkpoint executed code from it"
    assert again.returncode == 0, again.stderr[-2000:]
    hb = json.loads((run_dir / "heartbeat.json").read_text())
    assert hb["resumed_from_step"] == int(legit.split("-")[1])
    assert any("weights-only loader" in q for q in hb["quarantined"]), hb["quarantined"]


# ---- path traversal in names --------------------------------------------------------------

_CONFIG = """state_dir = "{state}"
{top}
[modes.light]
num_envs = 4
batch_size = 64
n_steps = 32
max_concurrent = 1
[[games]]
name = "{name}"
env_id = "CartPole-v1"
algo = "ppo"
total_steps = {total}
seed = 1
device = "cpu"
args = {{ eval_episodes = 0 }}
"""


@pytest.mark.parametrize("name", ["../evil", "a/b", "/tmp/evil", "..", "ok/../../evil"])
@pytest.mark.parametrize("command", [["run"], ["scale", "--mode", "light"]])
def test_traversal_game_name_is_refused_and_nothing_written(
    tmp_path: Path, name: str, command: list[str]
) -> None:
    state = tmp_path / "nest" / "state"
    config = tmp_path / "rlsup.toml"
    config.write_text(_CONFIG.format(state=state, name=name, top="", total=1000))
    env = _env(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *command, "--config", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "games[0].name" in done.stderr, done.stderr
    assert not (tmp_path / "nest").exists(), "a refused configuration created the state dir"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not Path("/tmp/evil").exists() or name != "/tmp/evil"


# ---- privacy of what rlsup writes -------------------------------------------------------


def _modes_under(root: Path) -> list[tuple[str, str]]:
    """(path, mode) of everything under root that is not private to its owner."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode)
            want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
            if mode & 0o077 or (stat.S_ISDIR(st.st_mode) and mode != want):
                bad.append((str(p.relative_to(root)), oct(mode)))
    return bad


def test_state_db_run_dirs_and_checkpoints_are_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "rlsup.toml"
    config.write_text(
        _CONFIG.format(state=state, name="priv", top="checkpoint_every_s = 1", total=2_000_000)
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "run", "--config", str(config)],
        cwd=REPO,
        env=_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        umask=0o022,  # a usual umask: privacy must not depend on the operator's
    )
    run_dir = state / "runs" / "priv"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ckpts = list((run_dir / "checkpoints").glob("ckpt-*"))
            if ckpts and (run_dir / "progress.csv").exists() and (state / "rlsup.db-wal").exists():
                break
            time.sleep(0.3)
        else:
            pytest.fail("no checkpoint, progress.csv and WAL within 120 s")
        expected = [
            state / "rlsup.db",
            state / "rlsup.db-wal",
            state / "rlsup.db-shm",
            run_dir / "heartbeat.json",
            run_dir / "progress.csv",
        ]
        for p in expected:
            assert p.exists(), p
        ckpt_files = list((run_dir / "checkpoints").glob("ckpt-*/*"))
        assert ckpt_files
        bad = _modes_under(state)
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert not bad, f"not private (want dirs 0700, files 0600): {bad}"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---- numbers in a heartbeat the supervisor cannot use ---------------------------------------


def _beat(**changes: object) -> dict[str, object]:
    hb: dict[str, object] = {
        "seq": 3, "pid": os.getpid(), "phase": "training", "phase_deadline_s": 60.0,
        "global_step": 100, "total_steps": 1000, "episodes": 2, "sps": 50.0,
        "mean_return": 1.5, "last_checkpoint_step": None, "resumed_from_step": None,
        "num_envs": 4, "batch_size": 64, "device": "cpu", "gpu_mem_mb": None, "time": time.time(),
    }  # fmt: skip
    return hb | changes


def test_a_heartbeats_unusable_numbers_never_reach_the_supervisors_tick(tmp_path: Path) -> None:
    """The tick compares and adds a heartbeat's numbers: `"abc" > 100` is a TypeError, `inf` a
    step no int holds. A field liveness is judged by that is unusable makes the heartbeat
    unreadable (as one that is not JSON); any other reads as its neutral value."""
    from supervisor.lifecycle.liveness import Liveness, Reported, new_reports
    from training import protocol as P

    live, live_reported = Liveness(since=0.0), Reported()
    path = tmp_path / P.HEARTBEAT_FILE

    def beat(**changes: object) -> P.Heartbeat | None:
        path.write_text(json.dumps(_beat(**changes)))
        hb = P.read_heartbeat(tmp_path)
        if hb is not None:  # what the daemon does with each heartbeat it reads
            live.observe(hb, time.monotonic())
            new_reports(live_reported, hb)
        return hb

    assert beat() is not None
    for bad in ("abc", float("inf"), float("nan"), -5, True, None):
        assert beat(global_step=bad) is None, bad
        assert beat(seq=bad) is None, bad
    odd = beat(
        sps=float("nan"), mean_return=float("inf"), episodes="many", time="x", num_envs=[4],
        eval={"mean": 2.0, "step": float("inf")}, write_failures={"log": float("nan")},
        metrics={"loss": float("nan"), "ok": 1.0},
    )  # fmt: skip
    assert odd is not None
    assert (odd.sps, odd.mean_return, odd.episodes, odd.time, odd.num_envs) == (
        0.0,
        None,
        0,
        0.0,
        0,
    )
    assert odd.eval == {"mean": 2.0} and odd.write_failures == {} and odd.metrics == {"ok": 1.0}
