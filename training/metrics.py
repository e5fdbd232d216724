"""Training diagnostics: what each update computes, and where it goes.

The learners accumulate their per-update diagnostics as tensors on their own device
(`Means`): no GPU->CPU sync per minibatch or gradient step, one `.tolist()` whenever the session
takes them (`take_metrics()`, once per progress row, about every 2 s). The session writes them
to `progress.csv` (columns after the original ones) and, unless `--no-tensorboard`, to
TensorBoard event files under `<run_dir>/tb/` (`TensorBoardWriter`).

TensorBoard is written from a thread of its own, which also imports `torch.utils.tensorboard`
(about 0.27 s) on the first scalars: the training loop only puts a small tuple into a bounded
queue, so neither a slow nor a full disk can stop it. A failed write is counted in the
heartbeat's `write_failures["tensorboard"]`, logged once, and retried after a pause.

Resume: the writer is opened with `purge_step` = the loaded checkpoint's global step (0 for a
fresh start), which writes a SessionLog START event at that step: TensorBoard's loader then
discards the points a killed predecessor wrote at or after it, so the resumed run continues the
same curves with no duplicated or rewound points.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

TB_DIR = "tb"

# progress.csv columns after protocol.PROGRESS_COLUMNS, per algorithm (CleanRL's quantities).
PPO_COLUMNS = (
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clipfrac",
    "explained_variance",
    "learning_rate",
    "grad_norm",
)
DQN_COLUMNS = ("td_loss", "q_values", "epsilon", "learning_rate", "grad_norm", "replay_fill")
PQN_COLUMNS = ("td_loss", "q_values", "epsilon", "learning_rate", "grad_norm")

# TensorBoard scalar tags (CleanRL's naming); x-axis = global agent step.
TAGS = {
    "policy_loss": "losses/policy_loss",
    "value_loss": "losses/value_loss",
    "entropy": "losses/entropy",
    "approx_kl": "losses/approx_kl",
    "clipfrac": "losses/clipfrac",
    "explained_variance": "losses/explained_variance",
    "td_loss": "losses/td_loss",
    "q_values": "losses/q_values",
    "grad_norm": "losses/grad_norm",
    "learning_rate": "charts/learning_rate",
    "epsilon": "charts/epsilon",
    "replay_fill": "charts/replay_fill",
}
EPISODIC_RETURN_TAG = "charts/episodic_return"
SPS_TAG = "charts/steps_per_second"
EVAL_MEAN_TAG = "eval/mean_return"
EVAL_STD_TAG = "eval/std_return"


def metric_columns(algo: str) -> tuple[str, ...]:
    return {"ppo": PPO_COLUMNS, "pqn": PQN_COLUMNS}.get(algo, DQN_COLUMNS)


def csv_value(value: float | None) -> float | str:
    """A plain number for progress.csv (6 significant digits), "" for none or non-finite:
    readers split rows on commas, so nothing is ever quoted."""
    if value is None or not math.isfinite(value):
        return ""
    return float(f"{value:.6g}")


# ---- computed by the learners ---------------------------------------------------------------


class Means:
    """Running means of a fixed set of scalar tensors, summed on their device."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self._sum: torch.Tensor | None = None
        self.count = 0

    def add(self, *values: torch.Tensor) -> None:
        stacked = torch.stack([v.detach().float().reshape(()) for v in values])
        self._sum = stacked if self._sum is None else self._sum + stacked
        self.count += 1

    def add_vector(self, values: torch.Tensor) -> None:
        """`add` of values already stacked in `names`' order (a CUDA graph's output, which
        the next replay overwrites: copied here)."""
        stacked = values.detach().float()
        self._sum = stacked.clone() if self._sum is None else self._sum + stacked
        self.count += 1

    def take(self) -> dict[str, float]:
        """The means since the last take (one sync), or {} when nothing was added."""
        if self._sum is None or self.count == 0:
            return {}
        means = (self._sum / self.count).tolist()
        self._sum, self.count = None, 0
        return dict(zip(self.names, means, strict=True))


def explained_variance(
    predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """1 - Var[target - predicted] / Var[target] over the masked entries (nan when the
    target does not vary): 1 is a perfect value function, 0 no better than a constant."""
    n = mask.sum().clamp(min=1.0)

    def var(x: torch.Tensor) -> torch.Tensor:
        mean = (x * mask).sum() / n
        return (((x - mean) ** 2) * mask).sum() / n

    var_y = var(target)
    ev = 1.0 - var(target - predicted) / var_y
    return torch.where(var_y > 0, ev, torch.full_like(ev, math.nan))


# ---- written by the session -----------------------------------------------------------------


class TensorBoardWriter:
    """Scalars to `<log_dir>/events.out.tfevents.*`, written by a thread of its own.

    `scalars()`, `flush()` never block: they queue (at most `max_pending` items; a batch that
    does not fit is counted as a failure and dropped). The thread imports and opens the
    SummaryWriter on the first batch; a write that raises (a full disk, an unwritable
    directory) is counted through `on_failure`, logged once, and writing is retried after
    `retry_s` with a new event file (batches in between are dropped and counted).
    """

    def __init__(
        self,
        log_dir: Path,
        purge_step: int | None,
        on_failure: Callable[[], None],
        log: Any,
        *,
        retry_s: float = 60.0,
        max_pending: int = 1000,
    ) -> None:
        self.log_dir = log_dir
        self.on_failure = on_failure
        self.log = log
        self.retry_s = retry_s
        self.failures = 0
        self.written = 0  # batches written (for tests and benchmarks)
        self._purge_step = purge_step  # consumed by the first writer that opens
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self._writer: Any = None
        self._retry_at = 0.0
        self._warned = False
        self._closed = False

    # ---- the training thread's side ------------------------------------------------------
    def scalars(self, step: int, values: Mapping[str, float | None]) -> None:
        finite = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}
        if finite:
            self._put(("scalars", (int(step), finite, time.time())))

    def flush(self) -> None:
        if self._thread is not None:
            self._put(("flush", None))

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush and close; wait at most `timeout_s` (a hung disk must not hold up an exit)."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(("close", None), timeout=timeout_s)
        self._thread.join(timeout_s)

    def _put(self, item: tuple[str, Any]) -> None:
        if self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tensorboard", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            if item[0] == "scalars":
                self._failed(OSError("the TensorBoard writer is stalled: queue full"))

    # ---- the writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            kind, payload = self._queue.get()
            if kind == "close":
                self._drop_writer(flush=True)
                return
            try:
                if kind == "scalars":
                    writer = self._open()
                    if writer is None:  # pausing after a failure: this batch is lost
                        self._failed(None)
                        continue
                    step, values, wall = payload
                    for name, value in values.items():
                        writer.add_scalar(name, value, step, walltime=wall)
                    writer.flush()  # a write() per batch (every ~2 s): curves show live
                    self.written += 1
                elif kind == "flush" and self._writer is not None:
                    self._writer.flush()
            except Exception as exc:  # never let metrics stop training
                self._failed(exc)
                self._drop_writer(flush=False)
                self._retry_at = time.monotonic() + self.retry_s

    def _open(self) -> Any:
        if self._writer is not None:
            return self._writer
        if time.monotonic() < self._retry_at:
            return None
        from torch.utils.tensorboard import SummaryWriter  # heavy: only when used

        self._writer = SummaryWriter(
            str(self.log_dir), purge_step=self._purge_step, max_queue=100, flush_secs=30
        )
        self._purge_step = None  # a writer reopened after a failure must not purge our own
        return self._writer

    def _drop_writer(self, flush: bool) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            if flush:
                writer.flush()
            writer.close()
        except Exception as exc:
            if flush:
                self._failed(exc)

    def _failed(self, exc: BaseException | None) -> None:
        self.failures += 1
        with contextlib.suppress(Exception):
            self.on_failure()
        if not self._warned and exc is not None:
            self._warned = True
            with contextlib.suppress(Exception):
                self.log.warning(
                    "tensorboard_write_failed",
                    error=f"{type(exc).__name__}: {exc}",
                    dir=str(self.log_dir),
                    retry_in_s=self.retry_s,
                    note="training goes on; later failures are only counted",
                )
