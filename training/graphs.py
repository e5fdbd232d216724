"""`--cuda-graphs on`: a learner's gradient step (and its acting forward) replayed as one CUDA
graph.

At Atari batch sizes a GPU step is bound by kernel launches: PPO's minibatch step is a hundred
or so small kernels (forward, loss, backward, gradient clipping, Adam), each a few microseconds
of host work for less GPU work. Captured once into a CUDA graph, the step is one launch. What a
graph asks of the code it replays, and how this module gives it:

- **Static inputs.** A graph reads the memory it read when captured. `StepGraph.feed(**inputs)`
  copies each input into a buffer of the graph's own (device to device, no sync); an input
  whose shape, dtype or layout changes is a new buffer, and the graph is captured again.
- **No host work inside.** The step takes no Python branch on a tensor and reads nothing back
  (the learners' loop already does neither: training/transfer.py), and its outputs are the
  graph's own tensors, overwritten by the next replay: copy what you keep.
- **The optimizer.** Adam (and PQN's RAdam) with `capturable=True`, whose step counter lives
  on the device, and the learning rate as a device tensor while capturing: each replay reads
  it, so the schedule (which keeps writing a float into the optimizer's group, as on the eager
  path: the checkpoint format does not change) is copied into that tensor before each replay
  (`fill_`, no sync).
- **Autocast without its weight cache** inside the captured step (torch's rule for graphs).
- **Capture without side effects.** torch warms a step up on a side stream before capturing
  it (its lazy initialisations must not happen inside the capture); those warm-up steps would
  train. The parameters and the optimizer's state are saved before and put back after, in
  place, so the graph's memory stays the learner's: capturing changes nothing a checkpoint
  holds (tests/training/test_graphs.py; tests/gpu/test_graphs.py on a GPU).

Off a GPU (no CUDA graphs), `StepGraph` calls the same step on the same static buffers each
time, uncaptured: the CPU runs and tests the path the GPU captures.

A graph holds the tensors it was captured with: `reset()` after anything that replaces them
(an optimizer's `load_state_dict` replaces its state tensors); the next call captures again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from training.args import WorkerConfig
from training.optim import Precision

# torch's own examples warm a captured step up with a few eager steps on a side stream.
WARMUP_STEPS = 2

Step = Callable[[dict[str, torch.Tensor]], torch.Tensor]


def capturable_optimizer(device: torch.device) -> bool:
    """Whether an optimizer on `device` is made `capturable` for `--cuda-graphs on` (CUDA; the
    CPU has no graphs, and torch refuses capturable there but for the fused Adam)."""
    return device.type == "cuda"


def graphs_usable(cfg: WorkerConfig, precision: Precision) -> bool:
    """`--cuda-graphs on` where the step can be one (not under fp16's GradScaler)."""
    return cfg.cuda_graphs == "on" and precision.graphable


def graphs_state(cfg: WorkerConfig, device: torch.device, precision: Precision) -> str:
    """What `--cuda-graphs` does in this worker, for its log: off, captured, uncaptured (no
    CUDA: the same static step, run as it is), or eager and why."""
    if cfg.cuda_graphs != "on":
        return "off"
    if not precision.graphable:
        return "eager: fp16's grad scaler reads its overflow check back to the host"
    return "captured" if device.type == "cuda" else "uncaptured: no CUDA graphs on the CPU"


class _Snapshot:
    """The parameters' and an optimizer's tensors, copied, to put back in place."""

    def __init__(self, params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer | None):
        with torch.no_grad():
            self.params = [(p, p.detach().clone()) for p in params]
            self.state: list[tuple[torch.Tensor, torch.Tensor]] = []
            self.had_state: set[int] = set()
            if optimizer is not None:
                for param, state in optimizer.state.items():
                    self.had_state.add(id(param))
                    for value in state.values():
                        if isinstance(value, torch.Tensor):
                            self.state.append((value, value.detach().clone()))
        self.optimizer = optimizer

    def restore(self) -> None:
        with torch.no_grad():
            for live, saved in self.params:
                live.copy_(saved)
            for live, saved in self.state:
                live.copy_(saved)
            if self.optimizer is None:
                return
            # State the warm-up created: zeros, which is what a first step starts from (Adam's
            # and RAdam's moments and step counter; training/optim.py warmup_adam relies on it).
            for param, state in self.optimizer.state.items():
                if id(param) in self.had_state:
                    continue
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        value.zero_()


class StepGraph:
    """`step(inputs)` over static input buffers: captured as a CUDA graph on a GPU and replayed
    on each call; called as it is elsewhere. `params` and `optimizer`: what the step changes
    (put back after the capture's warm-up)."""

    def __init__(
        self,
        device: torch.device,
        step: Step,
        params: Sequence[torch.Tensor] = (),
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.device = device
        self.capture = device.type == "cuda"
        self.step = step
        self.params = list(params)
        self.optimizer = optimizer
        self.inputs: dict[str, torch.Tensor] = {}
        self.captures = 0  # how many times a graph was captured (tests, the benchmark)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._output: torch.Tensor | None = None
        self._lrs: list[torch.Tensor] = []

    def feed(self, **inputs: torch.Tensor) -> None:
        """Copy each input into its static buffer (a new buffer, and a new capture, when its
        shape, dtype or layout differs from the last)."""
        for name, value in inputs.items():
            held = self.inputs.get(name)
            if (
                held is None
                or held.shape != value.shape
                or held.dtype != value.dtype
                or held.stride() != value.stride()
            ):
                self.inputs[name] = torch.empty_strided(
                    value.shape, value.stride(), dtype=value.dtype, device=value.device
                )
                self.inputs[name].copy_(value)
                self.reset()
            else:
                held.copy_(value)

    def reset(self) -> None:
        """Forget the graph: the next call captures again."""
        self._graph, self._output = None, None

    def __call__(self) -> torch.Tensor:
        if not self.capture:
            return self.step(self.inputs)
        if self._graph is None:
            self._capture()
        assert self._graph is not None and self._output is not None
        if self.optimizer is not None:
            for lr, group in zip(self._lrs, self.optimizer.param_groups, strict=True):
                lr.fill_(float(group["lr"]))  # the schedule's rate, read by this replay
        self._graph.replay()
        return self._output

    def _capture(self) -> None:
        saved = _Snapshot(self.params, self.optimizer)
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), self._tensor_lr():
            for _ in range(WARMUP_STEPS):
                self.step(self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with self._tensor_lr(), torch.cuda.graph(graph):
            output = self.step(self.inputs)
        saved.restore()
        self._graph, self._output = graph, output
        self.captures += 1

    @contextlib.contextmanager
    def _tensor_lr(self) -> Iterator[None]:
        """The optimizer's learning rates as device tensors (the captured step reads them from
        there), the floats the schedule writes back once done."""
        if self.optimizer is None:
            yield
            return
        groups = self.optimizer.param_groups
        if len(self._lrs) != len(groups):
            self._lrs = [torch.zeros((), device=self.device) for _ in groups]
        rates = [float(group["lr"]) for group in groups]
        for lr, rate, group in zip(self._lrs, rates, groups, strict=True):
            lr.fill_(rate)
            group["lr"] = lr
        try:
            yield
        finally:
            for rate, group in zip(rates, groups, strict=True):
                group["lr"] = rate
