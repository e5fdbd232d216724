"""A stop request while the disk is full: the worker's final checkpoint fails, so it must not
exit 75 ("stopped on request after a checkpoint", protocol.ExitCode.STOPPED): the supervisor
would take 75 as a clean stop and restart it from an older checkpoint without any event,
silently throwing away everything trained since (the soak once lost 40,192 CartPole steps that
way after a `rlsup scale` during a full disk). It writes error.json (checkpoint_failed) and
exits 1 instead."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.training.workerutil import heartbeat, start, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
def test_stop_on_a_full_disk_is_not_reported_as_a_clean_checkpointed_stop(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4M,mode=0700", "tmpfs", str(ckpts)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    proc = None
    try:
        args = ["--game", "CartPole-v1", "--algo", "ppo", "--num-envs", "4", "--n-steps", "32"]
        args += ["--batch-size", "64", "--total-steps", "10000000", "--eval-episodes", "0"]
        args += ["--checkpoint-every-s", "1", "--device", "cpu", "--threads", "1"]
        proc = start(run_dir, *args)
        wait_for(
            lambda: (heartbeat(run_dir) or {}).get("last_checkpoint_step") is not None,
            90,
            "a checkpoint",
        )
        with contextlib.suppress(OSError), open(ckpts / ".ballast", "wb") as f:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        wait_for(
            lambda: (heartbeat(run_dir) or {}).get("checkpoint_failures", 0) >= 1, 30, "a failure"
        )
        time.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        hb = heartbeat(run_dir) or {}
        assert hb["global_step"] > (hb["last_checkpoint_step"] or 0), "nothing to lose?"
        error = run_dir / "error.json"
        assert proc.returncode != 75, (
            f"exit 75 (clean, checkpointed stop) although the final checkpoint failed: steps "
            f"{hb['last_checkpoint_step']}..{hb['global_step']} are lost without a trace"
        )
        assert error.exists() and json.loads(error.read_text())["kind"].startswith("checkpoint")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["umount", "-l", str(ckpts)], capture_output=True)
