"""How a worker loads its replay buffer back (training/resuming.py, then training/replay_load.py):
one pass over the disk, the chunks hashed as they are read, and rot found on that pass costs
only the damaged chunk's transitions, which never reach a sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import structlog

from checkpoints import CheckpointStore
from training.args import WorkerConfig, validate
from training.checkpointing import checkpoint_meta
from training.heartbeat import HeartbeatWriter, initial_heartbeat
from training.mirroring import Mirror
from training.replay import ReplayBuffer, chunk_file
from training.replay_load import load_buffer
from training.resuming import Resumer

FRAME = (84, 84)
CHUNK_BYTES = 1 << 20
N_ENVS = 4


def _rchar() -> int:
    """Bytes this process has read through read(2) and friends, page cache hits included."""
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _filled(capacity: int) -> ReplayBuffer:
    buf = ReplayBuffer(capacity, FRAME, np.uint8, 4, chunk_bytes=CHUNK_BYTES)
    rng = np.random.default_rng(0)
    ids = np.arange(N_ENVS)
    buf.add_reset(ids, rng.integers(0, 255, (N_ENVS, 4, *FRAME), dtype=np.uint8))
    zeros = np.zeros(N_ENVS)
    for i in range(capacity // N_ENVS + 2):
        frames = np.full((N_ENVS, 4, *FRAME), i % 251, dtype=np.uint8)
        buf.add_step(ids, zeros + i, zeros, zeros, frames)
    return buf


def _resumer(run_dir: Path) -> tuple[Resumer, WorkerConfig]:
    cfg = validate(WorkerConfig(game="Pong-v5", algo="dqn", num_envs=N_ENVS, threads=1))
    log = structlog.get_logger()
    hb = HeartbeatWriter(run_dir, initial_heartbeat(cfg.game, cfg.algo, 0, "cpu"))
    return Resumer(cfg, log, hb, Mirror(cfg, run_dir, log, hb)), cfg


def _saved(run_dir: Path, cfg: WorkerConfig, buf: ReplayBuffer) -> CheckpointStore:
    store = CheckpointStore(run_dir / "checkpoints", keep=2)
    snap = buf.begin_snapshot()
    with store.begin(100, checkpoint_meta(cfg)) as w:
        w.write_bytes("learner.pt", b"not read by this test")
        buf.save(w, snap)
        w.commit()
    buf.mark_committed(snap, 100)
    return store


def test_a_worker_reads_its_replay_buffer_from_disk_once(tmp_path: Path) -> None:
    """Verifying every chunk, then reading every chunk, read the buffer twice: on a host whose
    page cache cannot hold the buffer, twice from the disk. The worker's load reads it once."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    resumer, cfg = _resumer(run_dir)
    buf = _filled(2048)  # 14 MiB of frames in 14 chunks
    store = _saved(run_dir, cfg, buf)
    before = _rchar()
    loaded = resumer.load_newest(store)
    assert loaded is not None
    back = load_buffer(loaded)
    read = _rchar() - before
    assert back.nbytes == buf.nbytes and back.load_damage is None
    assert read < 1.2 * buf.nbytes, f"read {read} bytes for a {buf.nbytes}-byte buffer"
    np.testing.assert_array_equal(back._frames, buf._frames)
    np.testing.assert_array_equal(back._slots, buf._slots)


def test_rot_found_while_the_worker_reads_drops_that_chunk_and_nothing_else(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    resumer, cfg = _resumer(run_dir)
    buf = _filled(2048)
    store = _saved(run_dir, cfg, buf)
    chunk = 3
    path = store.committed()[-1].path / chunk_file("frames", chunk)
    with open(path, "r+b") as f:  # one flipped bit: the size is right, the load cannot see it
        f.seek(1000)
        byte = f.read(1)[0]
        f.seek(1000)
        f.write(bytes([byte ^ 1]))
    loaded = resumer.load_newest(store)
    assert loaded is not None and loaded.damaged == {}, "the load itself did not hash it"
    back = load_buffer(loaded)
    assert back.load_damage is not None
    assert back.load_damage["chunks"] == [chunk]
    assert back.load_damage["files"] == [chunk_file("frames", chunk)]
    lo, hi = back.chunk_bounds(chunk)
    assert back.load_damage["transitions_dropped"] == int(buf._slots["valid"][lo:hi].sum()) > 0
    assert not back._slots["valid"][lo:hi].any() and not back._frames[lo:hi].any()
    keep = np.ones(back.capacity, bool)
    keep[lo:hi] = False
    np.testing.assert_array_equal(back._frames[keep], buf._frames[keep])
    np.testing.assert_array_equal(back._slots[keep], buf._slots[keep])
    # No transition left reaches the emptied chunk: no stack or next frame is read from it.
    ok, chains = back._chains(np.arange(back.capacity, dtype=np.int64))
    assert 0 < ok.sum() <= back.load_damage["transitions_kept"]
    assert not ((chains[ok] >= lo) & (chains[ok] < hi)).any()
    back.sample(64, np.random.default_rng(1))
