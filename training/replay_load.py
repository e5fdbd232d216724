"""Loading a replay buffer back from a checkpoint (training/replay.py holds the buffer and how
it is saved): the metadata checked against this version's layout, then every chunk read
straight into the arrays in one pass over the disk, the chunks the store left unverified
hashed as they are read (CheckpointStore.load_latest's verify_on_read). A chunk found damaged,
by the store or on the read, is left empty and its transitions dropped (`load_damage`)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from training.replay import (
    ARRAYS,
    FORMAT_VERSION,
    META_NAME,
    SLOT_LAYOUT,
    ReplayBuffer,
    _byte_view,
    chunk_file,
)

PAGE_BYTES = 4096  # one write per page commits it (a huge page's first write commits it all)


class Loaded(Protocol):
    """What a load reads through: checkpoints.LoadedCheckpoint is one."""

    step: int
    damaged: dict[str, str]

    def read_json(self, name: str) -> Any: ...

    def read_many_into(self, items: list[tuple[str, memoryview]]) -> dict[str, str]: ...


def load_buffer(loaded: Loaded) -> ReplayBuffer:
    """The buffer of a verified checkpoint. Afterwards the base step is the loaded step, every
    chunk clean, and every env must start with add_reset."""
    meta = loaded.read_json(META_NAME)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"unsupported replay format in {META_NAME}: {meta!r:.200}")
    if meta["slot_dtype"] != SLOT_LAYOUT or meta["arrays"] != list(ARRAYS):
        raise ValueError("replay slot layout in the checkpoint differs from this version")
    frame_dtype = np.dtype(meta["frame_dtype"])
    frame_shape = tuple(int(d) for d in meta["frame_shape"])
    chunk_slots = int(meta["chunk_slots"])
    frame_bytes = max(1, int(np.prod(frame_shape, dtype=np.int64)) * frame_dtype.itemsize)
    buf = ReplayBuffer(
        int(meta["capacity"]),
        frame_shape,
        frame_dtype,
        int(meta["stack"]),
        chunk_bytes=chunk_slots * frame_bytes,
    )
    if buf.chunk_slots != chunk_slots or buf.num_chunks != int(meta["num_chunks"]):
        raise ValueError("replay chunk layout in the checkpoint is inconsistent")
    t = int(meta["t"])
    order = buf._save_order(t)

    def hit(names: Any) -> list[int]:
        return [c for c in order if set(names) & {chunk_file(a, c) for a in ARRAYS}]

    bad = hit(loaded.damaged)  # left empty (widx -1): no chain can pass through them
    items = []
    for c in order:
        if c not in bad:
            lo, hi = buf.chunk_bounds(c)
            items.append((chunk_file("frames", c), _byte_view(buf._frames[lo:hi])))
            items.append((chunk_file("slots", c), _byte_view(buf._slots[lo:hi])))
    # The arrays' pages are committed before the disk is read into them: faulting fresh
    # (huge) pages in while the page cache fills from the disk made a 1 GiB load take
    # 1.8-2.4 s instead of 0.6 s on the development VM (benchmarks/replay_save.py).
    for _, view in items:
        np.frombuffer(view, np.uint8)[::PAGE_BYTES] = 0
    # One pass: chunks not verified by the store are hashed as they are read, side by side.
    found = hit(loaded.read_many_into(items))
    for c in found:  # damaged on read: emptied as if never read
        lo, hi = buf.chunk_bounds(c)
        buf._frames[lo:hi] = 0
        buf._slots[lo:hi] = 0
        buf._slots["widx"][lo:hi] = -1
        buf._slots["prev"][lo:hi] = -1
    bad = sorted({*bad, *found}, key=order.index)
    buf._t = t
    buf._n_transitions = int(meta["n_transitions"])
    buf.num_steps = int(meta["num_steps"])
    buf.num_resets = int(meta["num_resets"])
    # Everything equals the loaded checkpoint: generation 0 <= base epoch 0.
    buf._epoch = 1
    buf._base_step, buf._base_epoch = int(loaded.step), 0
    if bad:
        buf._drop_chunks(bad, sorted(loaded.damaged))
    return buf
