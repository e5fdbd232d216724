"""`rlsup.sb3`'s arrays: an SB3 replay buffer's filled part and VecNormalize's running
statistics, saved through `run.save_arrays` (incremental, verified) and loaded back exactly,
with the layout checked against the model's (rlsup/sb3.py holds the callback, `save`,
`resume` and `restore`)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.vec_env import VecNormalize

from rlsup._run import Run, SdkError

_REPLAY_FIELDS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def check_buffer(buffer: Any) -> None:
    if type(buffer) not in (ReplayBuffer, DictReplayBuffer):
        raise SdkError(
            f"rlsup.sb3: replay buffer {type(buffer).__name__} is not supported (only "
            "ReplayBuffer and DictReplayBuffer are saved field by field; anything else would "
            "be saved incompletely)"
        )


def _buffer_fields(buffer: Any) -> list[tuple[str, str, np.ndarray]]:
    """(array name, field, array) for every array the buffer holds, in a fixed order."""
    out: list[tuple[str, str, np.ndarray]] = []
    for field in _REPLAY_FIELDS:
        if field == "next_observations" and buffer.optimize_memory_usage:
            continue
        value = getattr(buffer, field)
        if isinstance(value, dict):
            for i, key in enumerate(sorted(value)):
                out.append((f"replay-{field}-{i}", f"{field}[{key}]", value[key]))
        else:
            out.append((f"replay-{field}", field, value))
    return out


def _filled(buffer: Any, field: str) -> int:
    """How many leading rows of `field` hold data (optimize_memory_usage keeps the last
    transition's next observation in observations[pos])."""
    size = int(buffer.buffer_size)
    if buffer.full:
        return size
    n = int(buffer.pos)
    if buffer.optimize_memory_usage and field.startswith("observations") and n > 0:
        n = min(n + 1, size)
    return n


def replay_digest(buffer: Any) -> str:
    """sha256 over a replay buffer's pos, full and the filled part of every array, in a fixed
    order: equal before a checkpoint and after `restore()` when the buffer came back intact."""
    h = hashlib.sha256(f"pos={int(buffer.pos)} full={bool(buffer.full)}\n".encode())
    for name, field, array in _buffer_fields(buffer):
        part = np.ascontiguousarray(array[: _filled(buffer, field)])
        h.update(f"{name} {part.dtype.str} {part.shape}\n".encode())
        h.update(part.data)
    return h.hexdigest()


def save_replay(buffer: Any, run: Run, record_digest: bool) -> dict[str, Any]:
    check_buffer(buffer)
    arrays: dict[str, dict[str, Any]] = {}
    for name, field, array in _buffer_fields(buffer):
        n = _filled(buffer, field)
        run.save_arrays(name, array[:n])
        arrays[name] = {"field": field, "rows": n, "shape": list(array.shape)}
    obs = buffer.observations
    return {
        "type": type(buffer).__name__,
        "pos": int(buffer.pos),
        "full": bool(buffer.full),
        "buffer_size": int(buffer.buffer_size),
        "n_envs": int(buffer.n_envs),
        "optimize_memory_usage": bool(buffer.optimize_memory_usage),
        "obs_keys": sorted(obs) if isinstance(obs, dict) else None,
        "size": int(buffer.size()),
        "arrays": arrays,
        "sha256": replay_digest(buffer) if record_digest else None,
    }


def _rms_list(vecnorm: VecNormalize) -> list[tuple[str, Any]]:
    """(array-name stem, RunningMeanStd) for VecNormalize's statistics, in a fixed order."""
    out: list[tuple[str, Any]] = []
    obs_rms = getattr(vecnorm, "obs_rms", None)
    if isinstance(obs_rms, dict):
        out += [(f"vecnorm-obs-{i}", obs_rms[k]) for i, k in enumerate(sorted(obs_rms))]
    elif obs_rms is not None:
        out.append(("vecnorm-obs", obs_rms))
    out.append(("vecnorm-ret", vecnorm.ret_rms))
    return out


def save_vecnorm(vecnorm: VecNormalize, run: Run) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for stem, rms in _rms_list(vecnorm):
        run.save_arrays(f"{stem}-mean", np.asarray(rms.mean, dtype=np.float64))
        run.save_arrays(f"{stem}-var", np.asarray(rms.var, dtype=np.float64))
        stats[stem] = {"count": float(rms.count)}
    obs_rms = getattr(vecnorm, "obs_rms", None)
    return {
        "stats": stats,
        "obs_keys": sorted(obs_rms) if isinstance(obs_rms, dict) else None,
    }


def load_replay(buffer: Any, run: Run, saved: dict[str, Any], path: Path) -> None:
    check_buffer(buffer)
    obs = buffer.observations
    layout = {
        "type": type(buffer).__name__,
        "buffer_size": int(buffer.buffer_size),
        "n_envs": int(buffer.n_envs),
        "optimize_memory_usage": bool(buffer.optimize_memory_usage),
        "obs_keys": sorted(obs) if isinstance(obs, dict) else None,
    }
    for key, have in layout.items():
        if saved[key] != have:
            raise SdkError(
                f"{path}: replay buffer saved with {key}={saved[key]!r}, the model's has "
                f"{have!r} (build the model with the same buffer settings)"
            )
    buffer.pos, buffer.full = int(saved["pos"]), bool(saved["full"])
    for name, field, array in _buffer_fields(buffer):
        rows = _filled(buffer, field)
        loaded = run.load_arrays(name)
        if loaded.shape != (rows, *array.shape[1:]) or loaded.dtype != array.dtype:
            raise SdkError(
                f"{path}: array {name} is {loaded.dtype}{list(loaded.shape)}, the buffer's "
                f"{field} needs {array.dtype}{[rows, *array.shape[1:]]}"
            )
        array[:rows] = loaded
        array[rows:] = 0
    digest = saved.get("sha256")
    if digest is not None and replay_digest(buffer) != digest:
        raise SdkError(f"{path}: the replay buffer read back differs from the one saved")
    if buffer.optimize_memory_usage and (buffer.full or buffer.pos > 0):
        # The last transition's next observation (observations[pos]) is overwritten by the
        # first observation after the resume: end that episode there, as SB3 does when it
        # truncates the last trajectory (stable-baselines3 issue 46).
        buffer.dones[(buffer.pos - 1) % buffer.buffer_size] = True


def load_vecnorm(vecnorm: VecNormalize, run: Run, saved: dict[str, Any], path: Path) -> None:
    obs_rms = getattr(vecnorm, "obs_rms", None)
    keys = sorted(obs_rms) if isinstance(obs_rms, dict) else None
    if keys != saved["obs_keys"]:
        raise SdkError(f"{path}: VecNormalize observation keys {saved['obs_keys']} != {keys}")
    stems = _rms_list(vecnorm)
    if sorted(s for s, _ in stems) != sorted(saved["stats"]):
        raise SdkError(f"{path}: VecNormalize statistics {sorted(saved['stats'])} do not fit")
    for stem, rms in stems:
        mean, var = run.load_arrays(f"{stem}-mean"), run.load_arrays(f"{stem}-var")
        if mean.shape != np.shape(rms.mean) or var.shape != np.shape(rms.var):
            raise SdkError(f"{path}: VecNormalize {stem} has shape {mean.shape}")
        rms.mean, rms.var = mean, var
        count = float(saved["stats"][stem]["count"])
        if not math.isfinite(count):
            raise SdkError(f"{path}: VecNormalize {stem} count {count}")
        rms.count = count
