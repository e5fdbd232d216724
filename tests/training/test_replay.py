"""Replay buffer: frame-stack reconstruction, sampling validity, snapshot-consistent and
incremental checkpoints through the real CheckpointStore."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from checkpoints import CheckpointStore
from training.replay import ReplayBuffer, ReplayError, ReplaySnapshot, chunk_file
from training.replay_load import load_buffer

# ---- a naive reference: every transition stored with its full stacks ---------------------


@dataclass
class Naive:
    """Drives a ReplayBuffer and a naive store side by side with a random interleaved stream.

    Frame element [0] is a unique id, so a sampled transition is identified by its newest
    next_obs frame. Each frame's global push index mirrors the buffer's push order.
    """

    buf: ReplayBuffer
    rng: np.random.Generator
    n_envs: int
    done_p: float = 0.15
    pushed: int = 0
    next_id: int = 1
    stacks: dict[int, list[tuple[np.ndarray, int]]] = field(default_factory=dict)
    transitions: dict[float, dict[str, Any]] = field(default_factory=dict)

    def _frame(self) -> np.ndarray:
        f = self.rng.integers(0, 250, size=self.buf.frame_shape).astype(self.buf.frame_dtype)
        f.reshape(-1)[0] = self.next_id % 251 if self.buf.frame_dtype == np.uint8 else self.next_id
        if self.buf.frame_dtype == np.uint8:  # ids wrap: keep uniqueness via the other bytes
            f.reshape(-1)[1] = (self.next_id // 251) % 251
            f.reshape(-1)[2] = (self.next_id // 251 // 251) % 251
        self.next_id += 1
        return f

    def _obs(self, stack: list[tuple[np.ndarray, int]]) -> np.ndarray:
        frames = [f for f, _ in stack]
        return np.stack(frames) if self.buf.stack > 1 else frames[0]

    @staticmethod
    def key(frame: np.ndarray) -> bytes:
        return np.ascontiguousarray(frame).tobytes()

    def round(self) -> None:
        envs = self.rng.permutation(self.n_envs)[: self.rng.integers(1, self.n_envs + 1)]
        closed = [int(e) for e in envs if int(e) not in self.stacks]
        open_ = [int(e) for e in envs if int(e) in self.stacks]
        if closed:
            obs = []
            for e in closed:
                st = []
                for _ in range(self.buf.stack):
                    st.append((self._frame(), self.pushed))
                    self.pushed += 1
                self.stacks[e] = st
                obs.append(self._obs(st))
            self.buf.add_reset(np.array(closed), np.stack(obs))
        if open_:
            acts = self.rng.integers(0, 6, size=len(open_))
            rews = self.rng.normal(size=len(open_)).astype(np.float32)
            dones = self.rng.random(len(open_)) < self.done_p
            nxt = []
            for i, e in enumerate(open_):
                old = self.stacks[e]
                new = [*old[1:], (self._frame(), self.pushed)]
                self.pushed += 1
                nxt.append(self._obs(new))
                self.transitions[self.key(new[-1][0])] = {
                    "obs": self._obs(old),
                    "next_obs": self._obs(new),
                    "action": int(acts[i]),
                    "reward": float(rews[i]),
                    "done": float(dones[i]),
                    "gidx": [g for _, g in old] + [new[-1][1]],
                }
                if dones[i]:
                    del self.stacks[e]
                else:
                    self.stacks[e] = new
            self.buf.add_step(np.array(open_), acts, rews, dones, np.stack(nxt))

    def valid_keys(self) -> set[bytes]:
        oldest = self.pushed - self.buf.capacity
        return {k for k, tr in self.transitions.items() if min(tr["gidx"]) >= oldest}


def check_samples(model: Naive, n: int = 3000) -> None:
    buf = model.buf
    valid = model.valid_keys()
    assert len(valid) > 0
    assert int(buf.valid_mask().sum()) == len(valid)
    obs, act, rew, nxt, done = buf.sample(n, np.random.default_rng(1))
    assert obs.shape == nxt.shape == (n, *buf.obs_shape)
    assert act.dtype == np.int64 and rew.dtype == np.float32 and done.dtype == np.float32
    seen = set()
    for i in range(n):
        newest = nxt[i][-1] if buf.stack > 1 else nxt[i]
        k = Naive.key(newest)
        assert k in valid, "sampled a transition whose chain was overwritten"
        tr = model.transitions[k]
        np.testing.assert_array_equal(obs[i], tr["obs"])
        np.testing.assert_array_equal(nxt[i], tr["next_obs"])
        assert act[i] == tr["action"] and done[i] == tr["done"]
        assert rew[i] == np.float32(tr["reward"])
        seen.add(k)
    assert seen == valid, "sampling must cover every valid transition"


@pytest.mark.parametrize(
    ("frame_shape", "dtype", "stack", "capacity"),
    [((5, 6), np.uint8, 4, 97), ((4,), np.float32, 1, 61), ((3,), np.float32, 2, 40)],
)
def test_stacks_match_naive_store_interleaved_envs(
    frame_shape: tuple[int, ...], dtype: Any, stack: int, capacity: int
) -> None:
    buf = ReplayBuffer(capacity, frame_shape, dtype, stack, chunk_bytes=64)
    model = Naive(buf, np.random.default_rng(7), n_envs=4)
    for r in range(400):
        model.round()
        if r in (3, 10, 60, 399):  # before wrap-around, just after, and deep into it
            check_samples(model, n=2000)
    assert buf.cursor == model.pushed


def test_sample_requires_data_and_rejects_only_invalid() -> None:
    buf = ReplayBuffer(10, (2,), np.float32, 4)
    with pytest.raises(ValueError, match="no transition"):
        buf.sample(4, np.random.default_rng(0))
    buf.add_reset(np.array([0]), np.ones((1, 4, 2), np.float32))
    buf.add_step(np.array([0]), np.array([1]), np.array([1.0]), np.array([0]), np.ones((1, 4, 2)))
    obs, *_ = buf.sample(8, np.random.default_rng(0))
    assert obs.shape == (8, 4, 2)
    # Fill the ring so the only transition's chain is overwritten by reset frames.
    buf.add_reset(np.array([1, 2]), np.zeros((2, 4, 2), np.float32))
    with pytest.raises(ValueError, match="no sampleable transition"):
        buf.sample(4, np.random.default_rng(0))


def test_add_step_needs_reset_for_new_env_and_after_done() -> None:
    buf = ReplayBuffer(50, (2,), np.float32, 1)
    with pytest.raises(ReplayError, match=r"env\(s\) \[3\].*add_reset"):
        buf.add_step(np.array([3]), np.array([0]), np.array([0.0]), np.array([0]), np.ones((1, 2)))
    buf.add_reset(np.array([3]), np.ones((1, 2)))
    buf.add_step(np.array([3]), np.array([0]), np.array([0.0]), np.array([1]), np.ones((1, 2)))
    with pytest.raises(ReplayError, match="add_reset"):
        buf.add_step(np.array([3]), np.array([0]), np.array([0.0]), np.array([0]), np.ones((1, 2)))
    with pytest.raises(ValueError, match="duplicate"):
        buf.add_reset(np.array([1, 1]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="shape"):
        buf.add_reset(np.array([1]), np.ones((1, 3)))


# ---- persistence with the real store ------------------------------------------------------


@pytest.fixture(autouse=True)
def _fake_boot_id(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = tmp_path_factory.mktemp("boot") / "boot_id"
    boot.write_text("test-boot-id\n")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(boot))


def atari_like(capacity: int = 1200, chunk_frames: int = 50) -> ReplayBuffer:
    return ReplayBuffer(capacity, (12, 12), np.uint8, 4, chunk_bytes=chunk_frames * 144)


def run_steps(buf: ReplayBuffer, rng: np.random.Generator, n_calls: int, n_envs: int = 4) -> None:
    """Random stream for n_envs envs; resets whoever is done."""
    ids = np.arange(n_envs)
    if not getattr(buf, "_test_started", False):
        buf.add_reset(ids, rng.integers(0, 256, (n_envs, *buf.obs_shape), dtype=np.uint8))
        buf._test_started = True  # type: ignore[attr-defined]
    for _ in range(n_calls):
        dones = rng.random(n_envs) < 0.02
        nxt = rng.integers(0, 256, (n_envs, *buf.obs_shape), dtype=np.uint8)
        buf.add_step(ids, rng.integers(0, 6, n_envs), rng.normal(size=n_envs), dones, nxt)
        if dones.any():
            d = ids[dones]
            buf.add_reset(d, rng.integers(0, 256, (len(d), *buf.obs_shape), dtype=np.uint8))


def state_of(buf: ReplayBuffer) -> dict[str, Any]:
    return {
        "frames": buf.frames.copy(),
        "slots": buf.slot_records.copy(),
        "cursor": buf.cursor,
        "len": len(buf),
        "num_steps": buf.num_steps,
        "num_resets": buf.num_resets,
    }


def assert_state_equal(buf: ReplayBuffer, expected: dict[str, Any]) -> None:
    got = state_of(buf)
    assert got["frames"].tobytes() == expected["frames"].tobytes()
    assert got["slots"].tobytes() == expected["slots"].tobytes()
    for k in ("cursor", "len", "num_steps", "num_resets"):
        assert got[k] == expected[k], k


def checkpoint(store: CheckpointStore, buf: ReplayBuffer, step: int) -> Any:
    snap = buf.begin_snapshot()
    with store.begin(step, {"game": "Pong-v5", "algo": "dqn"}) as w:
        buf.save(w, snap)
        w.commit()
    buf.mark_committed(snap, step)
    return w.stats


@pytest.mark.parametrize("n_calls", [30, 700])  # partly filled; wrapped several times
def test_save_load_round_trip_byte_identical(tmp_path: Path, n_calls: int) -> None:
    buf = atari_like()
    rng = np.random.default_rng(3)
    run_steps(buf, rng, n_calls)
    expected = state_of(buf)
    store = CheckpointStore(tmp_path / "ckpt")
    stats = checkpoint(store, buf, 100)
    if n_calls == 30:  # unwritten chunks are not stored at all
        assert stats.files_written == 1 + 2 * -(-buf.cursor // buf.chunk_slots)
    loaded = store.load_latest()
    assert loaded is not None
    back = load_buffer(loaded)
    assert_state_equal(back, expected)
    assert (back.capacity, back.obs_shape, back.chunk_slots) == (
        buf.capacity,
        buf.obs_shape,
        buf.chunk_slots,
    )
    assert back.base_step == 100
    assert back.dirty_chunks() == []
    a = buf.sample(64, np.random.default_rng(5))
    b = back.sample(64, np.random.default_rng(5))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_after_load_every_env_must_reset_and_env_count_may_change(tmp_path: Path) -> None:
    buf = atari_like()
    run_steps(buf, np.random.default_rng(0), 100, n_envs=4)
    store = CheckpointStore(tmp_path / "ckpt")
    checkpoint(store, buf, 5)
    loaded = store.load_latest()
    assert loaded is not None
    back = load_buffer(loaded)
    assert len(back) == len(buf)
    obs = np.zeros((1, *back.obs_shape), np.uint8)
    with pytest.raises(ReplayError, match=r"env\(s\) \[0\] with no open episode.*add_reset"):
        back.add_step(np.array([0]), np.array([1]), np.array([0.0]), np.array([0]), obs)
    ids = np.arange(7)  # the supervisor scaled num_envs from 4 to 7
    back.add_reset(ids, np.zeros((7, *back.obs_shape), np.uint8))
    back.add_step(ids, np.zeros(7), np.zeros(7), np.zeros(7), np.ones((7, *back.obs_shape)))
    assert back.sample(16, np.random.default_rng(0))[0].shape == (16, 4, 12, 12)


class SlowWriter:
    """Delays each chunk write so the training loop overtakes the saver."""

    def __init__(self, writer: Any, delay: float) -> None:
        self._w = writer
        self._delay = delay

    def write_json(self, name: str, obj: Any) -> Any:
        return self._w.write_json(name, obj)

    def link_or_write(self, name: str, data: Any, *, unchanged_since_step: int | None) -> Any:
        time.sleep(self._delay)
        return self._w.link_or_write(name, data, unchanged_since_step=unchanged_since_step)


@pytest.mark.parametrize("delay", [0.0, 0.004])
def test_background_save_is_consistent_while_loop_keeps_writing(
    tmp_path: Path, delay: float
) -> None:
    buf = atari_like(capacity=2000, chunk_frames=40)
    rng = np.random.default_rng(11)
    run_steps(buf, rng, 600)
    store = CheckpointStore(tmp_path / "ckpt")
    checkpoint(store, buf, 1)
    run_steps(buf, rng, 50)  # some dirty chunks, most linked: both save paths run

    snap = buf.begin_snapshot()
    expected = state_of(buf)  # test-only full copy, taken at the snapshot instant
    errors: list[BaseException] = []

    def saver(snap: ReplaySnapshot) -> None:
        try:
            with store.begin(2, {"game": "Pong-v5"}) as w:
                buf.save(SlowWriter(w, delay), snap)
                w.commit()
            buf.mark_committed(snap, 2)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    th = threading.Thread(target=saver, args=(snap,))
    th.start()
    calls = 0
    while th.is_alive() or calls < 20:
        run_steps(buf, rng, 1, n_envs=4)
        calls += 1
    th.join()
    assert not errors, errors
    assert snap.chunks_copied_by_loop >= 1  # copy-on-write really happened
    if delay:  # the loop lapped the slow saver: many chunks were preserved by the loop
        assert calls * 4 > buf.capacity
        assert snap.chunks_copied_by_loop > 5
    assert not snap.active and buf._active == ()
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 2
    assert_state_equal(load_buffer(loaded), expected)


def test_incremental_save_writes_only_dirty_chunks(tmp_path: Path) -> None:
    buf = atari_like(capacity=10_000, chunk_frames=100)  # 100 chunks
    rng = np.random.default_rng(2)
    run_steps(buf, rng, 2600)  # wrapped
    store = CheckpointStore(tmp_path / "ckpt")
    first = checkpoint(store, buf, 10)
    assert first.files_linked == 0
    assert first.files_written == 1 + 2 * buf.num_chunks

    run_steps(buf, rng, 25)  # 100+ new frames: 1% of the buffer
    dirty = buf.dirty_chunks()
    assert 1 <= len(dirty) <= 3
    expected = state_of(buf)
    second = checkpoint(store, buf, 20)
    assert second.files_written == 1 + 2 * len(dirty)
    assert second.files_linked == 2 * (buf.num_chunks - len(dirty))
    assert second.bytes_written < 0.05 * first.bytes_written
    assert buf.dirty_chunks() == []
    new = store.path_for(20)
    for c in range(buf.num_chunks):
        nlink = os.stat(new / chunk_file("frames", c)).st_nlink
        assert nlink == (1 if c in dirty else 2), c
    loaded = store.load_latest()
    assert loaded is not None
    assert_state_equal(load_buffer(loaded), expected)


class FailingWriter(SlowWriter):
    def __init__(self, writer: Any, fail_after: int) -> None:
        super().__init__(writer, 0.0)
        self._left = fail_after

    def link_or_write(self, name: str, data: Any, *, unchanged_since_step: int | None) -> Any:
        self._left -= 1
        if self._left < 0:
            raise OSError(28, "No space left on device (simulated)")
        return super().link_or_write(name, data, unchanged_since_step=unchanged_since_step)


def test_failed_checkpoint_keeps_dirty_state(tmp_path: Path) -> None:
    buf = atari_like(capacity=3000, chunk_frames=100)  # 30 chunks
    rng = np.random.default_rng(4)
    run_steps(buf, rng, 800)
    store = CheckpointStore(tmp_path / "ckpt")
    checkpoint(store, buf, 1)

    run_steps(buf, rng, 30)
    dirty_a = set(buf.dirty_chunks())
    snap = buf.begin_snapshot()
    with pytest.raises(OSError, match="simulated"), store.begin(2, {}) as w:
        buf.save(FailingWriter(w, fail_after=3), snap)
    assert not snap.active and not snap.saved
    with pytest.raises(ValueError, match="not saved"):
        buf.mark_committed(snap, 2)
    assert store.latest() is not None and store.latest().step == 1  # type: ignore[union-attr]

    run_steps(buf, rng, 30)
    dirty = set(buf.dirty_chunks())
    assert dirty_a <= dirty and dirty - dirty_a  # nothing forgotten, new ones added
    expected = state_of(buf)
    stats = checkpoint(store, buf, 3)
    assert stats.files_written == 1 + 2 * len(dirty)
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 3
    assert_state_equal(load_buffer(loaded), expected)


def test_released_snapshot_stops_copy_on_write() -> None:
    buf = atari_like(capacity=400, chunk_frames=20)
    rng = np.random.default_rng(0)
    run_steps(buf, rng, 50)
    snap = buf.begin_snapshot()
    run_steps(buf, rng, 5)
    assert snap.chunks_copied_by_loop >= 1
    snap.release()
    before = snap.chunks_copied_by_loop
    run_steps(buf, rng, 200)
    assert snap.chunks_copied_by_loop == before and snap._copies == {}
    with pytest.raises(ValueError, match="already saved or released"):
        buf.save(object(), snap)  # type: ignore[arg-type]


def _peak_rss_during(fn: Any) -> tuple[int, int]:
    proc = psutil.Process()
    start = proc.memory_info().rss
    peak = start
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.002)

    th = threading.Thread(target=sample)
    th.start()
    try:
        fn()
    finally:
        stop.set()
        th.join()
    return start, max(peak, proc.memory_info().rss)


def test_save_and_load_extra_memory_is_about_one_chunk(tmp_path: Path) -> None:
    cap = 128 << 20 >> 12  # 128 MiB of 64x64 frames, 4 MiB chunks
    buf = ReplayBuffer(cap, (64, 64), np.uint8, 4, chunk_bytes=4 << 20)
    block = np.random.default_rng(0).integers(0, 256, (64, 4, 64, 64), dtype=np.uint8)
    buf.add_reset(np.arange(8), block[:8])
    for i in range(cap // 8):
        j = (i * 8) % 56
        buf.add_step(np.arange(8), np.zeros(8), np.zeros(8), np.zeros(8), block[j : j + 8])
    store = CheckpointStore(tmp_path / "ckpt")
    start, peak = _peak_rss_during(lambda b=buf: checkpoint(store, b, 1))
    assert peak - start < 24 << 20, (peak - start) >> 20
    nbytes = buf.nbytes
    del buf
    loaded = store.load_latest()
    assert loaded is not None
    holder: list[ReplayBuffer] = []
    start, peak = _peak_rss_during(lambda: holder.append(load_buffer(loaded)))
    assert peak - start - nbytes < 24 << 20, (peak - start - nbytes) >> 20
