"""One small thread pool for the store's large hashing and reading (hashlib and file reads
release the GIL): a checkpoint's files verified side by side, a chunk hashed while it is
written. Made on first use; its threads end with the process."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

# Below this many bytes the pool costs more than it gives: work stays on the caller's thread.
WORTH_IT_BYTES = 4 << 20

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            workers = max(2, min(4, os.cpu_count() or 2))
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-io")
        return _pool
