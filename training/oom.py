"""Out of memory, however torch, a CUDA library or numpy spells it, told apart from a crash
without importing torch: the worker exits 76 with it (training/entry.py), and so does the SDK
for an error a user's script lets escape (rlsup/_exits.py). The stability policy then scales
the game down instead of counting a crash. Stdlib only."""

from __future__ import annotations

OOM_TEXTS = (
    "CUDA out of memory",  # the caching allocator (torch.cuda.OutOfMemoryError's text)
    # The driver or a CUDA library, not torch's allocator: a context, cuBLAS's workspace or a
    # cuDNN plan that finds the GPU full (another process holds it) fails with these.
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
)


def oom_kind(exc: BaseException) -> str | None:
    """Which running out of memory `exc` is, "cuda_oom" or "host_oom" (None: none of it): a
    MemoryError, torch's OutOfMemoryError (by name and module: no torch import), or a
    RuntimeError with one of the allocators' texts."""
    if isinstance(exc, MemoryError):
        return "host_oom"
    torch_oom = any(
        k.__name__ == "OutOfMemoryError" and k.__module__.split(".")[0] == "torch"
        for k in type(exc).__mro__
    )
    text = str(exc)
    if torch_oom or (isinstance(exc, RuntimeError) and any(t in text for t in OOM_TEXTS)):
        return (
            "cuda_oom"
            if torch_oom or "CUDA" in text or "CUBLAS" in text or "CUDNN" in text
            else "host_oom"
        )
    return None
