"""A script of benchmarks/ imported for its pure functions in tests: the folder is not a
package, and its scripts import their neighbours (hostinfo, peers, worker_throughput)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@contextmanager
def benchmark_module(filename: str, name: str) -> Iterator[ModuleType]:
    """benchmarks/`filename` as module `name` (registered while in use: dataclasses look their
    module up), with benchmarks/ on sys.path for its neighbours."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / filename)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(str(BENCH))
