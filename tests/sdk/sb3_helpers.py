"""Helpers for the tests that run training scripts as real processes under the SDK: start one
with the RLSUP_* environment the supervisor gives a command game, wait for committed
checkpoints and heartbeats, and check what a checkpoint holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkpoints.names import MANIFEST_NAME, ckpt_step
from training import protocol as P

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def game_env(run_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a command game: this one less any RLSUP_* of the caller, plus the run
    directory (and `extra`), one thread (2-core CI machines), and the repo on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSUP_")}
    env["RLSUP_TEST_RUN"] = os.environ["RLSUP_TEST_RUN"]  # the leftover-process marker
    env[P.RUN_DIR_ENV] = str(run_dir)
    env["PYTHONPATH"] = str(ROOT)
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env.update(extra)
    return env


class Script:
    """A training script running as its own process; its stdout and stderr go to files."""

    def __init__(self, path: Path, args: list[str], run_dir: Path, logs: Path, **env: str):
        logs.mkdir(parents=True, exist_ok=True)
        n = len(list(logs.glob("*.out")))
        self.out_path, self.err_path = logs / f"{n}.out", logs / f"{n}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(path), *args],
                env=game_env(run_dir, **env),
                stdout=out,
                stderr=err,
                cwd=str(run_dir.parent),
            )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"timed out after {timeout} s:\n{self.output()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def output(self) -> str:
        err = self.err_path.read_text(errors="replace")
        return f"--- stdout\n{self.stdout()}\n--- stderr (tail)\n{err[-4000:]}"

    def __enter__(self) -> Script:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def committed(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every committed checkpoint (its manifest written), oldest first."""
    root = run_dir / P.CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        step = ckpt_step(entry.name)
        if step is not None and (entry / MANIFEST_NAME).is_file():
            found.append((step, entry))
    return sorted(found)


def heartbeat_step(run_dir: Path) -> int:
    hb = P.read_heartbeat(run_dir)
    return -1 if hb is None else hb.global_step


def wait_for(cond: Callable[[], bool], script: Script, timeout: float = 60.0) -> None:
    """Wait until `cond()`, failing with the script's output if it exits or time runs out."""
    deadline = time.monotonic() + timeout
    while not cond():
        if script.proc.poll() is not None:
            raise AssertionError(f"exited {script.proc.returncode} first:\n{script.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s:\n{script.output()}")
        time.sleep(0.05)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def stdout_fields(text: str, first_word: str) -> dict[str, str]:
    """`key=value` pairs of the first stdout line starting with `first_word`."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == first_word:
            return dict(w.split("=", 1) for w in words[1:] if "=" in w)
    raise AssertionError(f"no {first_word!r} line in:\n{text}")


SB3_ZIP_ENTRIES = {"data", "pytorch_variables.pth", "_stable_baselines3_version"}


def assert_no_pickled_objects(ckpt: Path) -> None:
    """Nothing in the checkpoint executes code on load: no SB3 `model.save` zip and no pickle
    file; every .pt loads with `torch.load(weights_only=True)`; every .json parses; every other
    file is a raw array chunk under arrays/."""
    import torch

    files = [p for p in ckpt.rglob("*") if p.is_file()]
    assert files
    for path in files:
        rel = path.relative_to(ckpt).as_posix()
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                leaves = {name.rsplit("/", 1)[-1] for name in z.namelist()}
            assert not leaves & SB3_ZIP_ENTRIES, f"{rel}: an SB3 model.save() zip: {leaves}"
        if path.suffix == ".pt":
            torch.load(path, weights_only=True, map_location="cpu")  # raises on any object
        elif path.suffix == ".json":
            read_json(path)
        else:
            assert rel.startswith("arrays/"), f"{rel}: neither .pt, .json nor an array chunk"
