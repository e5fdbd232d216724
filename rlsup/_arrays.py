"""Large numpy arrays in a checkpoint (`run.save_arrays()`, `run.load_arrays()`): each array
is a header (`arrays/<name>.json`: dtype, shape, chunking) and its bytes in chunk files
(`arrays/<name>.<6 digits>`), a chunk unchanged since the previous checkpoint hard-linked from
it; read back chunk by chunk into one new array. Damage found at load (a chunk rotten in every
checkpoint that holds it) is reported as the rows it held, and a load of that array is refused
unless the script takes the holes (rlsup/_damage.py counts the rows).

numpy is imported inside the functions that need it: `import rlsup` stays stdlib-only.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from checkpoints import CheckpointError, LoadedCheckpoint
from checkpoints.errors import CheckpointUnreadable
from rlsup import _damage, _exits
from rlsup._errors import ArrayDamaged, SdkError, say
from training.protocol import Phase

if TYPE_CHECKING:
    import numpy as np

    from rlsup._run import Run

ARRAYS_DIR = "arrays"
DEFAULT_CHUNK_BYTES = 16 << 20
_ARRAY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
LOADING_DEADLINE_S = 3600.0  # verifying and reading a large checkpoint: the step need not move


def save(run: Run, name: str, array: Any, chunk_bytes: int) -> dict[str, int]:
    """`run.save_arrays()`'s body: see its docstring."""
    import numpy as np  # only the array functions need numpy

    writer = run._writer
    if writer is None:
        raise SdkError("run.save_arrays(): only inside a `with run.checkpoint(step):` block")
    check_name(name)
    if chunk_bytes < 1:
        raise SdkError(f"run.save_arrays({name!r}): chunk_bytes must be >= 1")
    a = np.asarray(array)
    if a.dtype.hasobject or a.dtype.names is not None:
        raise SdkError(
            f"run.save_arrays({name!r}): dtype {a.dtype} is not a plain numeric type "
            "(objects would need pickle, which a checkpoint never holds)"
        )
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    flat = memoryview(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    before_w, before_l = writer.stats.bytes_written, writer.stats.bytes_linked
    chunks = math.ceil(a.nbytes / chunk_bytes)
    for i in range(chunks):
        view = flat[i * chunk_bytes : (i + 1) * chunk_bytes]
        writer.link_or_write(
            f"{ARRAYS_DIR}/{name}.{i:06d}",
            view,
            unchanged_since_step=run._base_step,
            expect_same=False,
            sync_at_commit=True,  # the kernel writes chunk i back while i+1 is written
        )
    stats = {
        "bytes_written": writer.stats.bytes_written - before_w,
        "bytes_linked": writer.stats.bytes_linked - before_l,
    }
    writer.write_json(
        f"{ARRAYS_DIR}/{name}.json",
        {
            "dtype": a.dtype.str,
            "shape": list(a.shape),
            "nbytes": int(a.nbytes),
            "chunk_bytes": int(chunk_bytes),
            "chunks": chunks,
        },
    )
    return stats


def load(run: Run, name: str, salvage: bool) -> np.ndarray:
    """`run.load_arrays()`'s body: see its docstring."""
    import numpy as np

    check_name(name)
    if not run._looked:
        run.latest()
    loaded = run._loaded
    if loaded is None:
        raise SdkError(f"run.load_arrays({name!r}): the run has no checkpoint")
    header_name = f"{ARRAYS_DIR}/{name}.json"
    if header_name not in loaded.files():
        have = sorted(
            f[len(ARRAYS_DIR) + 1 : -5]
            for f in loaded.files()
            if f.startswith(ARRAYS_DIR + "/") and f.endswith(".json")
        )
        raise SdkError(
            f"run.load_arrays({name!r}): {loaded.path.name} holds no such array "
            f"(it has: {', '.join(have) or 'none'})"
        )
    run._phase(Phase.LOADING, LOADING_DEADLINE_S)
    try:
        header = loaded.read_json(header_name)
        dtype = np.dtype(header["dtype"])
        if dtype.hasobject:
            raise SdkError(f"{loaded.path}/{header_name}: dtype {dtype} is not allowed")
        out = np.empty(tuple(header["shape"]), dtype=dtype)
        flat = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        step = int(header["chunk_bytes"])
        if out.nbytes != int(header["nbytes"]):
            raise SdkError(f"{loaded.path}/{header_name}: shape and nbytes disagree")
        lost = set(_damage.chunks_by_array(loaded.damaged).get(name, []))
        if lost:
            _refuse_or_accept_holes(run, loaded, name, header, salvage)
        for i in range(int(header["chunks"])):
            part = flat[i * step : (i + 1) * step]
            if i in lost:
                part[:] = bytes(len(part))  # salvage: the damaged chunk's rows are zeros
            else:
                loaded.read_into(f"{ARRAYS_DIR}/{name}.{i:06d}", part)
    except CheckpointUnreadable as exc:  # EIO, EACCES: the disk, not the checkpoint
        _exits.unreadable(run, f"run.load_arrays({name!r}): cannot read {loaded.path.name}", exc)
    except (KeyError, TypeError, ValueError) as exc:
        raise SdkError(f"{loaded.path}/{header_name}: not an array header: {exc}") from exc
    finally:
        if not run._closed:
            run._back_to_work()
    return out


def _refuse_or_accept_holes(
    run: Run, loaded: LoadedCheckpoint, name: str, header: dict[str, Any], salvage: bool
) -> None:
    rows = run._lost_rows.get(name, [])
    where = _damage.describe(rows, int(header["shape"][0]) if header["shape"] else 1)
    if salvage:
        say(f"load_arrays({name!r}, salvage=True): {where} are zeros (damaged)")
        return
    raise ArrayDamaged(
        f"run.load_arrays({name!r}): {loaded.path.name} holds damaged chunks of it, in "
        f"every checkpoint that has them: {where} are lost. Pass salvage=True to load the "
        f"rest with those rows zeroed (run.damaged_rows({name!r}) names them), or, with a "
        f"mirror, restore them before the next start: rlsup pull --game {run.game} --repair",
        name,
        rows,
    )


def report_damage(run: Run, loaded: LoadedCheckpoint) -> None:
    """Rot found while loading, never silent: each array's lost rows (or the files put
    right from an identical copy) on stderr and in the heartbeat's `replay_damage`."""
    run._lost_rows = {}
    if not loaded.damaged and not loaded.repaired:
        return
    totals: dict[str, int] = {}
    for array, chunks in _damage.chunks_by_array(loaded.damaged).items():
        try:  # the header verified (it is not salvageable): only a read error is left
            header = loaded.read_json(f"{ARRAYS_DIR}/{array}.json")
        except CheckpointError as exc:
            raise SdkError(f"cannot read the checkpoints in {run.store.root}: {exc}") from exc
        run._lost_rows[array] = _damage.rows_of_chunks(header, chunks)
        totals[array] = int(header["shape"][0]) if header["shape"] else 1
    entry: dict[str, Any] = {
        "checkpoint": loaded.path.name,
        "when": "load",
        "files": sorted({*loaded.damaged, *loaded.repaired}),
        "rows_lost": {a: [list(r) for r in rows] for a, rows in run._lost_rows.items()},
        "repaired": dict(loaded.repaired),
    }
    run._damage_reports.append(entry)
    for file, where in sorted(loaded.repaired.items()):
        say(f"{loaded.path.name}/{file} was damaged; repaired from {where} (nothing lost)")
    for array, rows in run._lost_rows.items():
        files = sorted(f for f in loaded.damaged if f.startswith(f"{ARRAYS_DIR}/{array}."))
        say(
            f"{loaded.path.name}: {', '.join(files)} damaged in every checkpoint holding "
            f"it: {_damage.describe(rows, totals[array])} of array {array!r} are lost; "
            f"load_arrays({array!r}) raises ArrayDamaged unless salvage=True"
        )
    if run._hb is not None:
        run._hb.update(replay_damage=list(run._damage_reports))
        run._hb.publish()


def check_name(name: str) -> None:
    if not isinstance(name, str) or _ARRAY_NAME.fullmatch(name) is None:
        raise SdkError(
            f"array name {name!r}: 1-100 characters [A-Za-z0-9_-], starting with a letter or "
            "digit (it names files in the checkpoint)"
        )
