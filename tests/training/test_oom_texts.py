"""Which failures the worker calls out of memory (exit 76, a step down) rather than a crash:
torch's allocator, and the driver or a CUDA library finding the GPU full; and the same told
without importing torch (training/oom.py: what the SDK says of a user's script's error)."""

from __future__ import annotations

import pytest
import torch

from training.device import is_out_of_memory
from training.oom import oom_kind


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


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (MemoryError(), "host_oom"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "cuda_oom"),
        (torch.cuda.OutOfMemoryError("anything"), "cuda_oom"),  # by its class, not its text
        (RuntimeError("CUDA error: out of memory"), "cuda_oom"),
        (RuntimeError("cuBLAS failed: CUBLAS_STATUS_ALLOC_FAILED"), "cuda_oom"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 80 GB"), "host_oom"),
        (RuntimeError("Expected all tensors to be on the same device"), None),
        (ValueError("CUDA out of memory"), None),  # a text in another kind of error: a bug's
        (OSError(12, "Cannot allocate memory"), None),  # ENOMEM from a syscall: not the heap's
    ],
)
def test_without_torch_the_sdk_tells_the_same_and_which_memory_ran_out(
    exc: BaseException, kind: str | None
) -> None:
    assert oom_kind(exc) == kind
    assert is_out_of_memory(exc) is (kind is not None), "the worker and the SDK agree"
