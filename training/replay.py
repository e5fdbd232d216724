"""DQN replay buffer: each frame stored once, chunked, incremental, snapshot-consistent saves.

Layout: a ring of `capacity` slots. Slot s holds one frame (`frames[s]`) and one record
(`slots[s]`): the global write index of what it holds (`widx`, -1 = never written), a link
`prev` to the global index of the previous frame of the same env stream (-1 at episode start),
and the transition that ends in this frame (action, reward, done, valid). `add_reset` pushes the
`stack` frames of a fresh observation as linked slots with valid=0; `add_step` pushes the newest
frame of next_obs linked to that env's head, with valid=1. A frame stack is rebuilt by following
`prev` links; a transition is sampleable only if every slot of its `stack + 1` chain still holds
the global index it is expected to hold (nothing in the chain was overwritten).

Persistence (ARCHITECTURE.md section 4): both arrays are cut at the same slot boundaries into
chunk files `replay/frames-<c:06d>.bin` and `replay/slots-<c:06d>.bin`, plus `replay/meta.json`.

Checkpointing without stalling the training loop:
  - `begin_snapshot()` is O(number of chunks): it records the cursor/counters and a copy of the
    per-chunk modification generations, and registers the snapshot as active.
  - Copy-on-write at chunk granularity: before add_* writes into a chunk that an active snapshot
    has not saved yet, it copies that chunk (both arrays' slices) into the snapshot.
  - The saver (any thread) takes each chunk under the snapshot's lock: the private copy when
    there is one, else a copy of the live slices into a one-chunk scratch buffer (so the loop is
    never held out for more than a chunk-sized memcpy). Chunks are saved in ring order starting
    just after the cursor's chunk (which goes last), so the saver runs ahead of the loop and the
    loop rarely has to copy more than the chunk it is writing into.
  - Incremental: per-chunk modification generations (`epoch` of the last write). A chunk whose
    generation at snapshot time is <= the epoch of the snapshot held by the base checkpoint
    (set by `mark_committed`) is hard-linked from it (`unchanged_since_step=base_step`). Nothing
    is cleared when a checkpoint starts, so a failed checkpoint loses no dirty state.

Threading contract: add_reset/add_step/sample/begin_snapshot are called from one thread (the
training loop); save() may run in another thread concurrently with them; mark_committed from any.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

FORMAT_VERSION = 1
META_NAME = "replay/meta.json"
ARRAYS = ("frames", "slots")

# Packed (26 bytes/slot), explicit little-endian so chunk files are portable.
SLOT_DTYPE = np.dtype(
    [
        ("widx", "<i8"),
        ("prev", "<i8"),
        ("reward", "<f4"),
        ("action", "<i4"),
        ("done", "u1"),
        ("valid", "u1"),
    ]
)

# Recorded in meta.json and checked on load.
SLOT_LAYOUT = [[name, SLOT_DTYPE[name].str] for name in SLOT_DTYPE.names or ()]

_PENDING, _COPIED, _SAVED = 0, 1, 2

IntArray = npt.NDArray[np.int64]


class ReplayError(RuntimeError):
    """Misuse of the replay buffer (e.g. add_step for an env with no open episode)."""


class _Writer(Protocol):
    def write_json(self, name: str, obj: Any) -> Any: ...

    def link_or_write(
        self, name: str, data: memoryview, *, unchanged_since_step: int | None
    ) -> Any: ...


def chunk_file(array: str, chunk: int) -> str:
    return f"replay/{array}-{chunk:06d}.bin"


_CHUNK_FILE_RE = re.compile(r"replay/(?:frames|slots)-\d{6}\.bin")


def is_chunk_file(name: str) -> bool:
    """A replay chunk file: one the buffer can do without (its transitions are dropped)."""
    return _CHUNK_FILE_RE.fullmatch(name) is not None


def _byte_view(a: np.ndarray) -> memoryview:
    """Flat byte view of a C-contiguous array (no copy; writable if `a` is)."""
    if not a.flags.c_contiguous:
        raise ValueError("array slice is not contiguous")
    return a.reshape(-1).view(np.uint8).data


class ReplaySnapshot:
    """The buffer as of one begin_snapshot() call; pass it to ReplayBuffer.save() once.

    While active it costs memory only for chunks the loop overwrites before the saver reaches
    them. Call release() if you decide not to save it (save() releases it itself).
    """

    def __init__(self, buffer: ReplayBuffer, epoch: int, gens: IntArray, meta: dict[str, Any]):
        self._buffer = buffer
        self.epoch = epoch
        self.gens = gens
        self.meta = meta
        self.t = int(meta["t"])
        self._state = np.zeros(len(gens), dtype=np.int8)
        self._copies: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.saved = False
        # Figures for logs and benchmarks.
        self.chunks_copied_by_loop = 0
        self.max_private_chunks = 0

    @property
    def active(self) -> bool:
        return not self._closed

    def release(self) -> None:
        """Stop copy-on-write for this snapshot and drop its private copies. Idempotent."""
        with self._lock:
            self._closed = True
            self._copies.clear()
        self._buffer._deactivate(self)

    # Called by the loop thread (inside add_*) before it writes chunk c.
    def _preserve(self, c: int, frames: np.ndarray, slots: np.ndarray, lo: int, hi: int) -> None:
        with self._lock:
            if self._closed or self._state[c] != _PENDING:
                return
            self._copies[c] = (frames[lo:hi].copy(), slots[lo:hi].copy())
            self._state[c] = _COPIED
            self.chunks_copied_by_loop += 1
            self.max_private_chunks = max(self.max_private_chunks, len(self._copies))


class ReplayBuffer:
    """Uniform replay over transitions; observations are rebuilt from once-stored frames."""

    def __init__(
        self,
        capacity: int,
        frame_shape: tuple[int, ...],
        frame_dtype: npt.DTypeLike,
        stack: int,
        *,
        chunk_bytes: int = 16 << 20,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if stack < 1:
            raise ValueError(f"stack must be >= 1, got {stack}")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.capacity = int(capacity)
        self.frame_shape = tuple(int(d) for d in frame_shape)
        self.frame_dtype = np.dtype(frame_dtype)
        self.stack = int(stack)
        self.obs_shape = (self.stack, *self.frame_shape) if self.stack > 1 else self.frame_shape
        frame_bytes = max(
            1, int(np.prod(self.frame_shape, dtype=np.int64)) * self.frame_dtype.itemsize
        )
        self.frame_bytes = frame_bytes
        self.chunk_slots = max(1, int(chunk_bytes) // frame_bytes)
        self.num_chunks = -(-self.capacity // self.chunk_slots)
        # np.zeros: pages are only committed once written (or read into on load).
        self._frames = np.zeros((self.capacity, *self.frame_shape), dtype=self.frame_dtype)
        self._slots = np.zeros(self.capacity, dtype=SLOT_DTYPE)
        self._slots["widx"] = -1
        self._slots["prev"] = -1
        self._t = 0  # global write index of the next slot
        self._n_transitions = 0  # slots currently holding a transition (valid=1)
        self.num_steps = 0  # add_step transitions ever pushed
        self.num_resets = 0  # add_reset episodes ever started
        self._heads: IntArray = np.full(0, -1, dtype=np.int64)  # per env id; not persisted
        # Incremental checkpoints: generation (epoch) of each chunk's last write.
        self._epoch = 0
        self._chunk_gen: IntArray = np.zeros(self.num_chunks, dtype=np.int64)
        self._base_step: int | None = None
        self._base_epoch = -1
        self._lock = threading.Lock()  # guards _base_* and _active
        self._active: tuple[ReplaySnapshot, ...] = ()
        # Set by load() when damaged chunks were left out: what was lost, for the operator.
        self.load_damage: dict[str, Any] | None = None

    # ---- sizes --------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return int(self._frames.nbytes + self._slots.nbytes)

    def __len__(self) -> int:
        """Transitions currently stored. A few of the oldest may be unsampleable because the
        frames of their stack were already overwritten."""
        return self._n_transitions

    @property
    def cursor(self) -> int:
        """Global write index of the next slot (total frames ever pushed)."""
        return self._t

    @property
    def base_step(self) -> int | None:
        """Step of the committed checkpoint that incremental saves link from."""
        return self._base_step

    @property
    def frames(self) -> np.ndarray:
        """The frame ring (read-only view)."""
        v = self._frames.view()
        v.flags.writeable = False
        return v

    @property
    def slot_records(self) -> np.ndarray:
        """The per-slot records (read-only view)."""
        v = self._slots.view()
        v.flags.writeable = False
        return v

    def chunk_bounds(self, c: int) -> tuple[int, int]:
        lo = c * self.chunk_slots
        return lo, min(self.capacity, lo + self.chunk_slots)

    def dirty_chunks(self) -> list[int]:
        """Chunks written since the snapshot held by the base checkpoint (all if no base)."""
        filled = min(self._t, self.capacity)
        return [
            c
            for c in range(self.num_chunks)
            if c * self.chunk_slots < filled and self._chunk_gen[c] > self._base_epoch
        ]

    # ---- adding -------------------------------------------------------------------------

    def _env_heads(self, env_ids: IntArray) -> IntArray:
        if env_ids.size and env_ids.min() < 0:
            raise ValueError(f"env ids must be >= 0, got {env_ids.min()}")
        need = int(env_ids.max()) + 1 if env_ids.size else 0
        if need > len(self._heads):
            grown = np.full(max(need, 2 * len(self._heads)), -1, dtype=np.int64)
            grown[: len(self._heads)] = self._heads
            self._heads = grown
        return self._heads[env_ids]

    def _prepare_ids(self, env_ids: np.ndarray, n_frames_each: int) -> IntArray:
        ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"duplicate env ids in one call: {ids.tolist()}")
        if len(ids) * n_frames_each > self.capacity:
            raise ValueError(
                f"{len(ids) * n_frames_each} frames in one call exceed capacity {self.capacity}"
            )
        return ids

    def _check_obs(self, obs: np.ndarray, n: int, what: str) -> np.ndarray:
        obs = np.asarray(obs)
        if obs.shape != (n, *self.obs_shape):
            raise ValueError(f"{what} has shape {obs.shape}, expected {(n, *self.obs_shape)}")
        return obs

    def _touched_chunks(self, n: int) -> Iterator[int]:
        a = self._t % self.capacity
        b = (self._t + n - 1) % self.capacity
        cs = self.chunk_slots
        if a <= b:
            yield from range(a // cs, b // cs + 1)
        else:
            yield from range(a // cs, self.num_chunks)
            yield from range(0, b // cs + 1)

    def _before_write(self, n: int) -> None:
        """Copy-on-write for active snapshots, then bump the touched chunks' generations."""
        active = self._active
        for c in self._touched_chunks(n):
            self._chunk_gen[c] = self._epoch
            for snap in active:
                if snap._state[c] == _PENDING:
                    lo, hi = self.chunk_bounds(c)
                    snap._preserve(c, self._frames, self._slots, lo, hi)

    def _push(self, n: int, frames: np.ndarray, records: np.ndarray) -> IntArray:
        self._before_write(n)
        g = self._t + np.arange(n, dtype=np.int64)
        idx = g % self.capacity
        self._n_transitions -= int(self._slots["valid"][idx].sum())
        records["widx"] = g
        self._frames[idx] = frames
        self._slots[idx] = records
        self._n_transitions += int(records["valid"].sum())
        self._t += n
        return g

    def add_reset(self, env_ids: np.ndarray, obs: np.ndarray) -> None:
        """Start a new episode for each env: push the `stack` frames of its first obs."""
        ids = self._prepare_ids(env_ids, self.stack)
        n = len(ids)
        if n == 0:
            return
        obs = self._check_obs(obs, n, "obs")
        self._env_heads(ids)  # grow the head table
        s = self.stack
        frames = obs.reshape(n * s, *self.frame_shape) if s > 1 else obs
        rec = np.zeros(n * s, dtype=SLOT_DTYPE)
        base = self._t + np.arange(n * s, dtype=np.int64)
        prev = base - 1
        prev[::s] = -1
        rec["prev"] = prev
        self._push(n * s, frames, rec)
        self._heads[ids] = base[s - 1 :: s]
        self.num_resets += n

    def add_step(
        self,
        env_ids: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        dones: np.ndarray,
        next_obs: np.ndarray,
    ) -> None:
        """Push one transition per env: (its current obs, action, reward, next_obs, done).

        After done=True the env's episode is closed: its next call must be add_reset.
        """
        ids = self._prepare_ids(env_ids, 1)
        n = len(ids)
        if n == 0:
            return
        next_obs = self._check_obs(next_obs, n, "next_obs")
        heads = self._env_heads(ids)
        if (heads < 0).any():
            missing = ids[heads < 0].tolist()
            raise ReplayError(
                f"add_step for env(s) {missing} with no open episode: call add_reset first "
                "(after a new env, a done, or loading a checkpoint, an env's next call must be "
                "add_reset)"
            )
        dones_b = np.asarray(dones).reshape(-1).astype(bool)
        rec = np.zeros(n, dtype=SLOT_DTYPE)
        rec["prev"] = heads
        rec["action"] = np.asarray(actions).reshape(-1)
        rec["reward"] = np.asarray(rewards).reshape(-1)
        rec["done"] = dones_b
        rec["valid"] = 1
        frames = next_obs[:, -1] if self.stack > 1 else next_obs
        g = self._push(n, frames, rec)
        self._heads[ids] = np.where(dones_b, -1, g)
        self.num_steps += n

    # ---- sampling -----------------------------------------------------------------------

    def _chains(self, slot_idx: IntArray) -> tuple[npt.NDArray[np.bool_], IntArray]:
        """For candidate slots: validity and the (m, stack+1) chain of global indices,
        newest first (column 0 = the transition's own slot)."""
        cap = self.capacity
        widx = self._slots["widx"]
        prev_arr = self._slots["prev"]
        chain = np.empty((len(slot_idx), self.stack + 1), dtype=np.int64)
        cur = widx[slot_idx]
        ok = (self._slots["valid"][slot_idx] == 1) & (cur >= 0)
        chain[:, 0] = cur
        for k in range(1, self.stack + 1):
            cur = prev_arr[np.where(ok, cur, 0) % cap]
            ok &= cur >= 0
            ok &= widx[np.where(ok, cur, 0) % cap] == cur
            chain[:, k] = cur
        return ok, chain

    def valid_mask(self) -> npt.NDArray[np.bool_]:
        """Which of the filled slots hold a sampleable transition (O(capacity); for tests)."""
        filled = min(self._t, self.capacity)
        ok, _ = self._chains(np.arange(filled, dtype=np.int64))
        return ok

    def sample(
        self, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Uniform (with replacement) over sampleable transitions.

        Returns obs (B, *obs_shape), actions int64 (B,), rewards float32 (B,),
        next_obs (B, *obs_shape), dones float32 (B,).
        """
        filled = min(self._t, self.capacity)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self._n_transitions == 0:
            raise ValueError("replay buffer holds no transition to sample")
        picked: list[IntArray] = []
        need = batch_size
        # Rejection sampling: uniform draws kept if valid are uniform over valid transitions.
        for _ in range(8):
            cand = rng.integers(0, filled, size=need + need // 2 + 8, dtype=np.int64)
            ok, chain = self._chains(cand)
            got = chain[ok][:need]
            picked.append(got)
            need -= len(got)
            if need == 0:
                break
        if need > 0:  # very few valid transitions: enumerate them
            ok, chain = self._chains(np.arange(filled, dtype=np.int64))
            valid = chain[ok]
            if len(valid) == 0:
                raise ValueError("replay buffer holds no sampleable transition yet")
            picked.append(valid[rng.integers(0, len(valid), size=need)])
        chain = np.concatenate(picked) if len(picked) > 1 else picked[0]
        slots = chain % self.capacity  # (B, stack+1), newest first
        s = self.stack
        if s > 1:
            obs = self._frames[slots[:, s:0:-1]]
            next_obs = self._frames[slots[:, s - 1 :: -1]]
        else:
            obs = self._frames[slots[:, 1]]
            next_obs = self._frames[slots[:, 0]]
        rec = self._slots[slots[:, 0]]
        return (
            obs,
            rec["action"].astype(np.int64),
            rec["reward"].astype(np.float32),
            next_obs,
            rec["done"].astype(np.float32),
        )

    # ---- persistence --------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "capacity": self.capacity,
            "frame_shape": list(self.frame_shape),
            "frame_dtype": self.frame_dtype.str,
            "stack": self.stack,
            "chunk_slots": self.chunk_slots,
            "num_chunks": self.num_chunks,
            "slot_dtype": SLOT_LAYOUT,
            "arrays": list(ARRAYS),
            "t": self._t,
            "n_transitions": self._n_transitions,
            "num_steps": self.num_steps,
            "num_resets": self.num_resets,
        }

    def begin_snapshot(self) -> ReplaySnapshot:
        """Freeze the buffer's current content for save(); O(num_chunks), no data copied."""
        snap = ReplaySnapshot(self, self._epoch, self._chunk_gen.copy(), self._meta())
        self._epoch += 1  # writes from now on are newer than this snapshot
        with self._lock:
            self._active = (*self._active, snap)
        return snap

    def _deactivate(self, snap: ReplaySnapshot) -> None:
        with self._lock:
            self._active = tuple(s for s in self._active if s is not snap)

    def _save_order(self, t: int) -> list[int]:
        """Chunks holding data at snapshot time, in ring order just after the cursor's chunk,
        which comes last: the saver runs ahead of the loop's writes, and the loop, which writes
        into the cursor's chunk at once, copies it itself instead of waiting for the saver."""
        filled = min(t, self.capacity)
        start = (t % self.capacity) // self.chunk_slots
        order = [(start + 1 + i) % self.num_chunks for i in range(self.num_chunks)]
        return [c for c in order if c * self.chunk_slots < filled]

    def save(self, writer: _Writer, snapshot: ReplaySnapshot) -> None:
        """Write `snapshot` (meta + every chunk of every array) with writer.link_or_write.

        Safe to run in a background thread while the loop keeps calling add_*. Releases the
        snapshot whatever happens; on success call mark_committed() after writer.commit().
        """
        if snapshot._buffer is not self:
            raise ValueError("snapshot belongs to another replay buffer")
        if snapshot._closed:
            raise ValueError("snapshot was already saved or released")
        try:
            with self._lock:
                base_step, base_epoch = self._base_step, self._base_epoch
            can_link = base_step is not None and base_epoch <= snapshot.epoch
            writer.write_json(META_NAME, snapshot.meta)
            scratch_f = np.empty((self.chunk_slots, *self.frame_shape), dtype=self.frame_dtype)
            scratch_s = np.empty(self.chunk_slots, dtype=SLOT_DTYPE)
            for c in self._save_order(snapshot.t):
                lo, hi = self.chunk_bounds(c)
                clean = can_link and int(snapshot.gens[c]) <= base_epoch
                since = base_step if clean else None
                with snapshot._lock:
                    copies = snapshot._copies.pop(c, None)
                    if copies is None:
                        if clean:
                            # Unchanged since the base: a hard link, which does not read
                            # the data. Held under the lock in case it falls back to a write.
                            self._write_chunk(
                                writer, c, self._frames[lo:hi], self._slots[lo:hi], since
                            )
                            snapshot._state[c] = _SAVED
                            continue
                        n = hi - lo
                        np.copyto(scratch_f[:n], self._frames[lo:hi])
                        np.copyto(scratch_s[:n], self._slots[lo:hi])
                        copies = (scratch_f[:n], scratch_s[:n])
                    snapshot._state[c] = _SAVED
                self._write_chunk(writer, c, copies[0], copies[1], since)
                del copies
            snapshot.saved = True
        finally:
            snapshot.release()

    @staticmethod
    def _write_chunk(
        writer: _Writer, c: int, frames: np.ndarray, slots: np.ndarray, since: int | None
    ) -> None:
        writer.link_or_write(
            chunk_file("frames", c), _byte_view(frames), unchanged_since_step=since
        )
        writer.link_or_write(chunk_file("slots", c), _byte_view(slots), unchanged_since_step=since)

    def _drop_chunks(self, chunks: list[int], files: list[str]) -> None:
        """After a load that left damaged chunks empty: recount, and mark them dirty so the next
        checkpoint writes them from memory instead of linking the damaged files."""
        before = self._n_transitions
        self._n_transitions = int(self._slots["valid"].sum())
        self._chunk_gen[chunks] = self._epoch
        self.load_damage = {
            "chunks": chunks,
            "files": files,
            "transitions_dropped": before - self._n_transitions,
            "transitions_kept": self._n_transitions,
        }

    def mark_committed(self, snapshot: ReplaySnapshot, step: int) -> None:
        """The committed checkpoint of `step` holds `snapshot`: link unchanged chunks from it."""
        if snapshot._buffer is not self:
            raise ValueError("snapshot belongs to another replay buffer")
        if not snapshot.saved:
            raise ValueError("snapshot was not saved completely; it cannot be a base")
        with self._lock:
            if snapshot.epoch > self._base_epoch:
                self._base_step, self._base_epoch = int(step), snapshot.epoch
