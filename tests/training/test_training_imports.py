"""The training package's import graph: no cycle among its modules (imports inside functions
and under TYPE_CHECKING included: grimp reads every import statement), and the contract the
supervisor imports (training.protocol, training.args) stays free of torch, numpy and envpool.
"""

from __future__ import annotations

import subprocess
import sys

import grimp
import pytest

pytestmark = pytest.mark.e2e

HEAVY = ("torch", "numpy", "envpool")
TORCH_FREE = ("training.protocol", "training.args")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("training", include_external_packages=True, cache_dir=None)


def _training_modules(graph: grimp.ImportGraph) -> list[str]:
    return sorted(m for m in graph.modules if m == "training" or m.startswith("training."))


def test_the_graph_sees_imports_inside_functions(graph: grimp.ImportGraph) -> None:
    # Resuming makes the session's learner through a function-level import: were such imports
    # left out, a cycle through one would go unseen below.
    assert graph.direct_import_exists(importer="training.resuming", imported="training.registry")


def test_no_import_cycle_among_training_modules(graph: grimp.ImportGraph) -> None:
    cycles = []
    for module in _training_modules(graph):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if not imported.startswith("training."):
                continue
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.append(" -> ".join((module, *back)))
    assert not cycles, "import cycles in training/:\n" + "\n".join(cycles)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_the_contract_imports_no_torch_numpy_or_envpool(
    graph: grimp.ImportGraph, module: str
) -> None:
    upstream = graph.find_upstream_modules(module)
    heavy = sorted(m for m in upstream if m.split(".")[0] in HEAVY)
    assert not heavy, f"{module} imports {heavy} (directly or through {sorted(upstream)})"


def test_the_contract_loads_no_torch_numpy_or_envpool_at_run_time() -> None:
    code = (
        "import sys, training.protocol, training.args\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
