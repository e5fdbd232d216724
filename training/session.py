"""One worker session: load the newest valid checkpoint, train, checkpoint, evaluate, stop.

It owns the session's course and its files (progress.csv, eval.json, TensorBoard, the
heartbeat's fields); the way back to the newest checkpoint and the learner built from it is
training/resuming.py, the device training/device.py, the mirror (restore, placement fence)
training/mirroring.py, the named failures training/errors.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import torch

from checkpoints import CheckpointStore, LoadedCheckpoint, write_json_atomic
from training import rng, torchbuild
from training.args import WorkerConfig
from training.checkpoint_request import CheckpointRequestWatch
from training.checkpointing import Checkpointer, CheckpointResult
from training.device import keep_compiled, pick_device, setup_torch, torch_build
from training.errors import (
    CheckpointUnreadableError,
    EvalWriteFailed,
    FinalCheckpointFailed,
    PlacementFencedError,
)
from training.graphs import graphs_state
from training.heartbeat import HeartbeatWriter, initial_heartbeat
from training.metrics import (
    EPISODIC_RETURN_TAG,
    EVAL_MEAN_TAG,
    EVAL_STD_TAG,
    SPS_TAG,
    TAGS,
    TB_DIR,
    TensorBoardWriter,
    csv_value,
    metric_columns,
)
from training.mirroring import Mirror
from training.progress import ProgressLog
from training.protocol import (
    ASSUMED_CHECKPOINT_COST_S,
    CHECKPOINT_DIR,
    EVAL_FILE,
    EVALS_KEPT,
    PROGRESS_COLUMNS,
    ExitCode,
    Phase,
    checkpoint_interval_s,
    clean_eval,
    read_json_file,
)
from training.resuming import Resumer

if TYPE_CHECKING:
    from training.learner import Learner

STARTING_DEADLINE_S = 300.0
STOPPING_DEADLINE_S = 120.0
MIN_TRAINING_DEADLINE_S = 10.0  # the supervisor's hang_timeout_s is the operator's floor
PROGRESS_EVERY_S = 2.0


class TrainingSession:
    def __init__(
        self,
        cfg: WorkerConfig,
        run_dir: Path,
        log: structlog.stdlib.BoundLogger,
        on_tick: Callable[[], None],
        start: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.log = log
        self.threads = cfg.threads or os.cpu_count() or 1
        self.step = 0
        self.learner: Learner | None = None
        self.hb = HeartbeatWriter(
            run_dir,
            initial_heartbeat(cfg.game, cfg.algo, cfg.total_steps, cfg.device),
            on_tick=on_tick,
        )
        self.start = dict(start or {"served": "cold"})
        self.hb.update(
            threads=self.threads, phase_deadline_s=STARTING_DEADLINE_S, start=dict(self.start)
        )
        self.hb.start()
        self.progress = ProgressLog(
            run_dir,
            lambda: self.hb.count_failure("progress"),
            columns=PROGRESS_COLUMNS + metric_columns(cfg.algo),
        )
        # TensorBoard: opened (in its own thread) by the first scalars; see training/metrics.py.
        self.tb: TensorBoardWriter | None = None
        self._tb_step = -1  # the last step written to the training tags (strictly increasing)
        self._episodes_seen = 0
        self._row_step = -1  # the step of the last progress row
        self.checkpoint_failures = 0
        self.sync_fallbacks = 0  # checkpoints taken synchronously for want of memory
        self.mirror = Mirror(cfg, run_dir, log, self.hb)  # used only with --mirror-url
        self.resumer = Resumer(cfg, log, self.hb, self.mirror)
        self.fenced: str | None = None  # why a commit was refused by the placement fence
        self.evaluation: dict[str, Any] | None = None  # the latest: step, mean, std, episodes
        self.requests: CheckpointRequestWatch | None = None  # checkpoint.request, once training

    @property
    def trained(self) -> Learner:
        """The learner, once built (every path that trains has built it)."""
        assert self.learner is not None, "no learner yet"
        return self.learner

    # ---- the session ---------------------------------------------------------------------
    def run(self, stop: Any) -> int:
        device = pick_device(self.cfg.device)
        setup_torch(device, self.threads)
        if self.cfg.compile != "off":
            keep_compiled(self.run_dir)  # before the learner compiles anything
        # "cpu" or "cuda:N" (the GPU it trains on, which `rlsup status` shows).
        index = torch.cuda.current_device() if device.type == "cuda" else None
        build = torch_build(torchbuild.driver_version())
        self.hb.update(device=device.type if index is None else f"cuda:{index}", torch_build=build)
        fallback = torchbuild.cpu_fallback_reason(
            build["driver"], build["cuda"] is not None, build["cuda_available"]
        )
        if self.cfg.device == "auto" and device.type == "cpu" and fallback:
            # Not silent: a GPU host training on its CPU is almost always an install mistake.
            self.log.warning("cpu_fallback", reason=fallback, **build)
        store = CheckpointStore(
            self.run_dir / CHECKPOINT_DIR,
            keep=self.cfg.keep_checkpoints,
            keep_best=self.cfg.keep_best,
            keep_every_steps=self.cfg.keep_every_steps,
            log=self.log,
        )
        try:
            swept = store.sweep()
            if swept:
                self.log.info("staging_swept", paths=[str(p) for p in swept])
            if self.cfg.mirror_url and (
                store.latest() is None or (self.cfg.epoch and self.mirror.superseded(store))
            ):
                self.mirror.restore(store, self.cfg.mirror_url)
            loaded = self.resumer.load_newest(store)
        except OSError as exc:  # listing or sweeping the store itself failed: not corruption
            raise CheckpointUnreadableError(
                f"cannot read the checkpoints in {store.root}: {exc}; nothing was moved"
            ) from exc
        if (
            loaded is not None
            and loaded.step >= self.cfg.total_steps
            and self._eval_is_current(loaded.step)
        ):
            self.log.info("already_done", step=loaded.step)
            self.step = loaded.step
            self.hb.update(global_step=loaded.step, last_checkpoint_step=loaded.step)
            return ExitCode.DONE
        self.learner, loaded, counters = self.resumer.restore(device, store, loaded)
        self.step = self.learner.global_step
        if self.cfg.cuda_graphs != "off":
            state = graphs_state(self.cfg, device, self.learner.precision)
            self.log.info("cuda_graphs", state=state)
        self._mark_start("loaded")
        fence = self.mirror.check_fence if self.cfg.epoch and self.cfg.mirror_url else None
        checkpointer = Checkpointer(store, self.cfg, self.log, self._on_checkpoint, fence)
        return self._train(stop, checkpointer, counters, loaded)

    def _mark_start(self, mark: str, when: float | None = None) -> None:
        """A start mark for the heartbeat (`start`): when, on the system's monotonic clock."""
        self.start[mark] = time.monotonic() if when is None else when
        self.hb.update(start=dict(self.start))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()  # flushed; waits a few seconds at most
        if self.learner is not None:
            self.learner.close()
        self.hb.stop()

    # ---- training ------------------------------------------------------------------------
    def _train(
        self,
        stop: Any,
        checkpointer: Checkpointer,
        counters: dict[str, Any],
        loaded: LoadedCheckpoint | None,
    ) -> int:
        cfg, learner = self.cfg, self.trained
        last_saved_step = loaded.step if loaded is not None else -1
        if cfg.tensorboard:
            # purge_step: TensorBoard drops what a killed predecessor wrote at or after the
            # step this run resumes from (everything, for a start from zero).
            self.tb = TensorBoardWriter(
                self.run_dir / TB_DIR,
                purge_step=learner.global_step,
                on_failure=lambda: self.hb.count_failure("tensorboard"),
                log=self.log,
            )
        self._episodes_seen = learner.tracker.episodes
        requests = self.requests = CheckpointRequestWatch(
            self.run_dir, stop, counters.get("loaded_time"), self._on_request_report
        )
        learner.interrupt = requests.interrupt
        last_ckpt_t = time.monotonic()
        last_ckpt_step = learner.global_step
        first_interval = self._first_interval()
        self.hb.update(checkpoint_interval_s=round(first_interval, 3))
        if first_interval != cfg.checkpoint_every_s:  # the host fails often: said at start
            self.log.info("checkpoint_interval_adapted", interval_s=round(first_interval, 3),
                          host_mtbf_s=cfg.host_mtbf_s,
                          checkpoint_every_s=cfg.checkpoint_every_s)  # fmt: skip
        last_progress_t = 0.0
        next_eval = _next_multiple(learner.global_step, cfg.eval_every_steps)
        longest_iter_s = 0.0
        self.hb.set_phase(Phase.TRAINING, STARTING_DEADLINE_S)
        while learner.global_step < cfg.total_steps and not stop and self.fenced is None:
            t0 = time.monotonic()
            learner.iterate()
            now = time.monotonic()
            longest_iter_s = max(longest_iter_s, now - t0)
            if "first_step" not in self.start and learner.interrupted is None:
                self._mark_start("first_step", now)
            self.step = learner.global_step
            self._publish_progress(max(MIN_TRAINING_DEADLINE_S, 5 * longest_iter_s))
            # A checkpoint request (a preemption notice) first: before an evaluation, which
            # can take a minute.
            if requests.due() and self._serve_request(
                requests, checkpointer, counters, last_saved_step
            ):
                last_ckpt_t, last_ckpt_step = time.monotonic(), self.step
                self.hb.set_phase(Phase.TRAINING, max(MIN_TRAINING_DEADLINE_S, 5 * longest_iter_s))
            if now - last_progress_t >= PROGRESS_EVERY_S:
                last_progress_t = now
                self._record(counters)
            # Evaluate before checkpointing: a checkpoint taken at an evaluation's step records
            # its result in its manifest (what keep_best ranks, across resumes and the mirror).
            due_eval = False
            if next_eval is not None and self.step >= next_eval and self.step < cfg.total_steps:
                if self._evaluate(interrupt=requests.interrupt) is None:
                    # A checkpoint request (or a stop before a deadline) cut the evaluation
                    # short: the request first; the evaluation runs again after the next
                    # iteration (next_eval stays).
                    if requests.due() and self._serve_request(
                        requests, checkpointer, counters, last_saved_step
                    ):
                        last_ckpt_t, last_ckpt_step = time.monotonic(), self.step
                else:
                    checkpointer.evaluation = self.evaluation
                    # keep_best: the evaluated policy must be in a checkpoint to be kept.
                    due_eval = cfg.keep_best > 0 and _scored(self.evaluation)
                    if due_eval:
                        checkpointer.wait()  # one in flight holds an older step
                    next_eval = _next_multiple(self.step, cfg.eval_every_steps)
                self.hb.set_phase(Phase.TRAINING, max(MIN_TRAINING_DEADLINE_S, 5 * longest_iter_s))
            due_s = now - last_ckpt_t >= self._interval(checkpointer)
            due_steps = (
                cfg.checkpoint_every_steps is not None
                and self.step - last_ckpt_step >= cfg.checkpoint_every_steps
            )
            if (due_s or due_steps or due_eval) and checkpointer.save_async(
                learner, self._counters(counters)
            ):
                last_ckpt_t, last_ckpt_step = now, self.step
                if self.tb is not None:
                    self.tb.flush()
        self._record(counters)
        if self.fenced is not None:
            checkpointer.wait()  # one already begun is refused by the fence too, and cleaned up
            raise PlacementFencedError(f"stopped at step {self.step}: {self.fenced}")
        if stop:
            return self._stop(stop.reason, checkpointer, counters, last_saved_step)
        return self._finish(checkpointer, counters, last_saved_step)

    def _stop(
        self, reason: str, checkpointer: Checkpointer, counters: dict[str, Any], saved: int
    ) -> int:
        self.log.info("stop_requested", reason=reason, step=self.step)
        self.hb.set_phase(Phase.STOPPING, STOPPING_DEADLINE_S + self._replay_bytes() / 20e6)
        checkpointer.wait()
        committed = max(saved, self.hb.current.last_checkpoint_step or -1)
        if self.step > committed:
            result = checkpointer.save_sync(self.trained, self._counters(counters))
            if result.fenced:
                raise PlacementFencedError(f"stopped at step {self.step}: {result.error}")
            if not result.ok:
                # Exit 75 would tell the supervisor that nothing was lost: say what was.
                raise FinalCheckpointFailed(
                    f"stopped on request ({reason}) but the final checkpoint at step "
                    f"{self.step} failed: {result.error}; a restart resumes from step "
                    f"{committed} and redoes {self.step - max(committed, 0)} steps"
                )
        return ExitCode.STOPPED

    def _serve_request(
        self,
        requests: CheckpointRequestWatch,
        checkpointer: Checkpointer,
        counters: dict[str, Any],
        saved: int,
    ) -> bool:
        """Checkpoint now for the standing request (training/checkpoint_request.py); True when
        a checkpoint was taken (committed or not)."""
        learner = self.trained
        requests.note_cut(learner.interrupted)
        checkpointer.wait()  # one in flight may have been captured after the request
        if not requests.due():
            return False
        committed = max(saved, self.hb.current.last_checkpoint_step or -1)
        if self.step <= committed:
            # Nothing learned since the newest checkpoint (a rollout abandoned right after
            # one, a request found at start): that checkpoint is this state.
            requests.committed(time.time(), committed)
            return False
        self.log.info("checkpoint_requested", step=self.step, cut=learner.interrupted)
        self.hb.set_phase(Phase.CHECKPOINTING, STOPPING_DEADLINE_S + self._replay_bytes() / 20e6)
        result = checkpointer.save_sync(learner, self._counters(counters))
        if not result.ok and not result.fenced:
            requests.failed()  # retried later; training goes on meanwhile
        return True

    def _on_request_report(self, report: dict[str, Any]) -> None:
        """A checkpoint request seen, or served: in the heartbeat at once (the supervisor
        measures notice -> committed checkpoint from it)."""
        self.hb.update(checkpoint_request=report)
        self.hb.publish()
        event = "checkpoint_request_served" if report.get("committed") else "checkpoint_request"
        self.log.info(event, **report)

    def _finish(self, checkpointer: Checkpointer, counters: dict[str, Any], saved: int) -> int:
        deadline_s = STOPPING_DEADLINE_S + self._replay_bytes() / 20e6
        self.hb.set_phase(Phase.CHECKPOINTING, deadline_s)
        checkpointer.wait()
        written: bool | None = None  # eval.json, when the final evaluation came first
        if self.step > max(saved, self.hb.current.last_checkpoint_step or -1):
            if self.cfg.keep_best:
                # The final checkpoint records the final evaluation, so keep_best ranks it
                # if the run is ever taken further.
                written = self._evaluate()
                checkpointer.evaluation = self.evaluation
                self.hb.set_phase(Phase.CHECKPOINTING, deadline_s)
            result = checkpointer.save_sync(self.trained, self._counters(counters))
            if result.fenced:
                raise PlacementFencedError(f"stopped at step {self.step}: {result.error}")
            if not result.ok:
                raise FinalCheckpointFailed(
                    f"total_steps reached but the final checkpoint at step {self.step} "
                    f"failed: {result.error}"
                )
        if not (self._evaluate() if written is None else written):
            raise EvalWriteFailed(
                f"total_steps reached and checkpoint {self.step} committed, but "
                f"{EVAL_FILE} could not be written; a restart only re-evaluates"
            )
        self.log.info("done", step=self.step, total_steps=self.cfg.total_steps)
        return ExitCode.DONE

    # ---- evaluation ----------------------------------------------------------------------
    def _eval_is_current(self, step: int) -> bool:
        if self.cfg.eval_episodes == 0:
            return True
        data = read_json_file(self.run_dir / EVAL_FILE)
        # Its step as read, checked: an infinite, NaN or string step (a hand edit, another
        # writer) is no evaluation of this step, so it is evaluated again, never a crash.
        evaluated = clean_eval(data)[0].get("step") if data is not None else None
        return evaluated is not None and evaluated >= step

    def _evaluate(self, interrupt: Callable[[], bool] | None = None) -> bool | None:
        """Evaluate and write eval.json; False when it could not be written (counted); None
        when `interrupt` cut it short (nothing recorded)."""
        if self.cfg.eval_episodes == 0 or self.learner is None:
            return True
        from training.evaluate import evaluate

        # The budget bounds the episodes; the margin covers making the envs and the last step.
        self.hb.set_phase(Phase.EVALUATING, self.cfg.eval_budget_s + 120.0)
        t0 = time.monotonic()
        result = evaluate(
            self.learner,
            self.cfg.game,
            self.cfg.eval_episodes,
            seed=rng.derive_env_seed(self.cfg.seed + 1_000_003, self.step),
            threads=self.threads,
            budget_s=self.cfg.eval_budget_s,
            interrupt=interrupt,
        )
        if result.get("interrupted"):
            self.log.info("evaluation_interrupted", step=self.step, seconds=round(
                time.monotonic() - t0, 3))  # fmt: skip
            return None
        result = {**result, "step": self.step, "time": time.time()}
        result["seconds"] = round(time.monotonic() - t0, 3)
        self.evaluation = {k: result.get(k) for k in ("step", "mean", "std", "episodes")}
        brief = {k: result.get(k) for k in ("step", "mean", "episodes", "seconds", "time")}
        evals = [*self.hb.current.evals, brief][-EVALS_KEPT:]
        self.hb.update(eval=result, evals=evals)
        if self.tb is not None:
            self.tb.scalars(
                self.step, {EVAL_MEAN_TAG: result.get("mean"), EVAL_STD_TAG: result.get("std")}
            )
        self.log.info("evaluated", **result)
        try:
            write_json_atomic(self.run_dir / EVAL_FILE, result)
        except OSError as exc:
            self.hb.count_failure("eval")
            self.log.warning("eval_write_failed", error=str(exc))
            return False
        return True

    # ---- bookkeeping ---------------------------------------------------------------------
    def _publish_progress(self, deadline_s: float) -> None:
        learner = self.trained
        gpu_mb = None
        if learner.device.type == "cuda":
            gpu_mb = round(torch.cuda.max_memory_allocated(learner.device) / 2**20, 1)
        self.hb.progress(
            learner.global_step,
            episodes=learner.tracker.episodes,
            mean_return=learner.tracker.mean_return(),
            gpu_mem_mb=gpu_mb,
            phase_deadline_s=deadline_s,
        )

    def _counters(self, counters: dict[str, Any]) -> dict[str, Any]:
        wall = counters["wall_time_s"] + time.monotonic() - counters["session_started"]
        return {
            "global_step": self.trained.global_step,
            "updates": self.trained.updates,
            "episodes": self.trained.tracker.episodes,
            "resume_count": counters["resume_count"],
            "wall_time_s": round(wall, 3),
            "time": time.time(),
            "num_envs": self.cfg.num_envs,
            "batch_size": _batch_size(self.cfg),
        }

    def _record(self, counters: dict[str, Any]) -> None:
        """One progress row, and the same diagnostics (plus the returns of the episodes that
        ended since the last one) to TensorBoard."""
        metrics = self.trained.take_metrics()
        if self.step == self._row_step:
            # The loop's last iteration already wrote this step's row (and took its
            # diagnostics): a second row would repeat it with the diagnostics left empty.
            return
        self._row_step = self.step
        row = self._progress_row(counters, metrics)
        self.progress.append(row)
        tracker = self.trained.tracker
        ended, self._episodes_seen = tracker.episodes - self._episodes_seen, tracker.episodes
        if self.tb is None or self.step <= self._tb_step:
            return  # the row written at a stop repeats the step before it
        self._tb_step = self.step
        values: dict[str, float | None] = {TAGS[k]: v for k, v in metrics.items() if k in TAGS}
        if row["sps"]:  # 0 until the rate has two samples
            values[SPS_TAG] = row["sps"]
        recent = list(tracker.recent)[-ended:] if ended > 0 else []
        if recent:
            values[EPISODIC_RETURN_TAG] = sum(recent) / len(recent)
        self.tb.scalars(self.step, values)

    def _progress_row(
        self, counters: dict[str, Any], metrics: dict[str, float] | None = None
    ) -> dict[str, Any]:
        hb = self.hb.current
        c = self._counters(counters)
        diagnostics = {
            name: csv_value((metrics or {}).get(name)) for name in metric_columns(self.cfg.algo)
        }
        return {
            "time": round(time.time(), 3),
            "wall_s": c["wall_time_s"],
            "global_step": c["global_step"],
            "episodes": c["episodes"],
            "sps": hb.sps,
            "mean_return": "" if hb.mean_return is None else round(hb.mean_return, 3),
            "num_envs": c["num_envs"],
            "batch_size": c["batch_size"],
            "resume_count": c["resume_count"],
            **diagnostics,
        }

    def _interval(self, checkpointer: Checkpointer) -> float:
        """Seconds between checkpoints: the configured interval, paced by the last one's cost."""
        last = checkpointer.last_result
        if last is None:
            return self._first_interval()
        return self._interval_after(last)

    def _first_interval(self) -> float:
        """Before any checkpoint of this process has a measured cost: Young's rule on an
        assumed one (checkpoint_every_s when the host's MTBF is unknown)."""
        return checkpoint_interval_s(
            self.cfg.checkpoint_every_s,
            cost_s=ASSUMED_CHECKPOINT_COST_S,
            mtbf_s=self.cfg.host_mtbf_s,
        )

    def _interval_after(self, result: CheckpointResult) -> float:
        """The interval after `result`: checkpoint_every_s, shortened by Young's rule on a
        failing host (what it cost training: the stall and the writer's CPU), then paced."""
        return checkpoint_interval_s(
            self.cfg.checkpoint_every_s,
            result.pause_s,
            result.seconds,
            cost_s=result.pause_s + result.cpu_s,
            mtbf_s=self.cfg.host_mtbf_s,
        )

    def _on_checkpoint(self, result: CheckpointResult) -> None:
        fields = {
            "step": result.step,
            "pause_s": round(result.pause_s, 4),
            "seconds": round(result.seconds, 3),
            "cpu_s": round(result.cpu_s, 4),
            "bytes_written": result.bytes_written,
            "bytes_linked": result.bytes_linked,
        }
        if result.bad_bases:
            bases = [b.split("/", 1) for b in result.bad_bases]  # "ckpt-<step>/<file>"
            entry = {
                "checkpoint": ", ".join(sorted({ckpt for ckpt, _ in bases})),
                "files": [name for _, name in bases],
                "when": "checkpoint",
                "rewritten_in": f"ckpt-{result.step:012d}" if result.ok else None,
            }
            self.log.warning("replay_damaged", **entry)
            self.hb.update(replay_damage=[*self.hb.current.replay_damage, entry])
        if result.sync_fallback is not None:
            self.sync_fallbacks += 1
            self.hb.update(
                checkpoint_sync_fallbacks=self.sync_fallbacks,
                last_checkpoint_sync_fallback=result.sync_fallback,
            )
        every = self._interval_after(result)
        before = self.hb.current.checkpoint_interval_s or self.cfg.checkpoint_every_s
        if every != self.cfg.checkpoint_every_s and not 0.8 < every / before < 1.25:
            # Paced or shortened (or its pace changed by a quarter): said once, not at every
            # checkpoint.
            self.log.info("checkpoint_paced", interval_s=round(every, 3),
                          host_mtbf_s=self.cfg.host_mtbf_s, **fields)  # fmt: skip
        self.hb.update(checkpoint_interval_s=round(every, 3))
        if result.ok:
            self.hb.update(last_checkpoint_step=result.step, last_checkpoint_time=time.time())
            self.log.info("checkpoint", **fields)
            if self.requests is not None:
                self.requests.committed(result.captured_at, result.step)
        elif result.fenced:
            self.fenced = result.error
            self.log.warning("checkpoint_fenced", error=result.error, **fields)
        else:
            self.checkpoint_failures += 1
            self.hb.update(
                checkpoint_failures=self.checkpoint_failures, last_checkpoint_error=result.error
            )
            self.log.warning("checkpoint_failed", error=result.error, **fields)

    def _replay_bytes(self) -> int:
        replay = getattr(self.learner, "replay", None)
        return int(getattr(replay, "nbytes", 0)) if replay is not None else 0


def _batch_size(cfg: WorkerConfig) -> int:
    return cfg.train_batch_size()


def _scored(evaluation: dict[str, Any] | None) -> bool:
    """Did the evaluation finish an episode (a mean to rank checkpoints by)?"""
    return evaluation is not None and evaluation.get("mean") is not None


def _next_multiple(step: int, every: int | None) -> int | None:
    if every is None:
        return None
    return (step // every + 1) * every
