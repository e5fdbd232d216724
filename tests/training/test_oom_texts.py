"""Which failures the worker calls out of memory (exit 76, a step down) rather than a crash:
torch's allocator, and the driver or a CUDA library finding the GPU full."""

from __future__ import annotations

import pytest
import torch

from training.device import is_out_of_memory


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported async"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried ..."),
    ],
)
def test_out_of_memory_however_it_is_spelled(exc: BaseException) -> None:
    assert is_out_of_memory(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED"),
        ValueError("out of memory"),  # not a RuntimeError: not torch's
    ],
)
def test_other_failures_are_crashes(exc: BaseException) -> None:
    assert not is_out_of_memory(exc)
