"""The house keeps its shape: no import cycle anywhere in the product (imports inside functions
and under TYPE_CHECKING included), the CLI and the daemon imported only from above, wings that
say what they own, no circle between supervisor/'s wings, and a daemon that stays start-up,
the tick and shutdown. The finer rules (each wing's floor, which wing may import which) are
import-linter's contracts in pyproject.toml (`make lint`)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("supervisor", "training", "checkpoints")
WINGS = ("lifecycle", "launch", "ledger", "stability", "gpu", "mirror", "observe", "preemption")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, include_external_packages=False)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_no_import_cycle_in_the_product(graph: grimp.ImportGraph) -> None:
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    g = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        g.add_module(m)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.a")
    g.add_import(importer="p.c", imported="p.a")
    assert _cycles(g) == [["p.a", "p.b"]]


def _rooms(graph: grimp.ImportGraph, package: str) -> grimp.ImportGraph:
    """`package`'s import graph with each child (a wing, or a top-level module) drawn as one
    room: an import between two modules of different rooms is an arrow between the rooms."""
    children = graph.find_children(package)
    rooms = grimp.ImportGraph()
    for child in children:
        rooms.add_module(child)

    def room(module: str) -> str | None:
        return next((c for c in children if module == c or module.startswith(c + ".")), None)

    for module in graph.find_descendants(package):
        here = room(module)
        for imported in graph.find_modules_directly_imported_by(module):
            there = room(imported)
            if here and there and here != there:
                rooms.add_import(importer=here, imported=there)
    return rooms


def test_no_circle_between_the_supervisors_wings(graph: grimp.ImportGraph) -> None:
    # Module cycles are caught above; this catches a wing that imports a wing that imports it
    # back through other files (gpu -> stability -> gpu once did). pyproject.toml's layers
    # contract says which way each arrow must run.
    assert _cycles(_rooms(graph, "supervisor")) == []


def test_the_rooms_show_a_circle_that_no_module_cycle_shows() -> None:
    g = grimp.ImportGraph()
    for m in ("p", "p.a", "p.a.x", "p.a.y", "p.b", "p.b.z", "p.c"):
        g.add_module(m)
    g.add_import(importer="p.a.x", imported="p.b.z")
    g.add_import(importer="p.b.z", imported="p.a.y")
    g.add_import(importer="p.c", imported="p.a.x")
    assert _cycles(g) == []
    assert _cycles(_rooms(g, "p")) == [["p.a", "p.b"]]


def test_only_the_cli_imports_the_commands(graph: grimp.ImportGraph) -> None:
    importers = graph.find_modules_that_directly_import("supervisor.commands")
    for cmd in graph.find_children("supervisor.commands"):
        importers |= graph.find_modules_that_directly_import(cmd)
    below = {m for m in importers if not m.startswith(("supervisor.commands", "supervisor.cli"))}
    assert below == set()


def test_only_rlsup_run_imports_the_daemon(graph: grimp.ImportGraph) -> None:
    importers = graph.find_modules_that_directly_import("supervisor.daemon")
    assert importers <= {"supervisor.commands.run", "supervisor.cli"}


@pytest.mark.parametrize("wing", WINGS)
def test_each_wing_says_what_it_owns(wing: str) -> None:
    module = importlib.import_module(f"supervisor.{wing}")
    doc = module.__doc__ or ""
    assert len(doc.split()) >= 15, f"supervisor/{wing}/__init__.py: a paragraph on what it owns"


def test_the_daemon_is_start_up_the_tick_and_shutdown() -> None:
    source = (ROOT / "supervisor" / "daemon.py").read_text()
    assert len(source.splitlines()) <= 600
    tree = ast.parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Supervisor"]
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    assert len(methods) <= 30, [m.name for m in methods]
    assert "assert " not in source, "what start() makes is one Started object, never asserted"
    assert ".backend ==" not in source and ".backend !=" not in source
    assert "isinstance(self.probe" not in source


def test_no_room_of_the_supervisor_is_over_600_lines() -> None:
    """The fence the daemon had, for every file of supervisor/: growth that it stopped there
    went next door (participants.py, config.py), so a room that size is split by what it owns."""
    big = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / "supervisor").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert not big, big


def test_benchmarks_and_the_harness_never_import_the_tests() -> None:
    """Servers and drivers that tests and benchmarks share live in harness/; a benchmark that
    reached into tests/ (and tests into benchmarks) made the two import each other."""
    offenders = []
    for folder in ("benchmarks", "harness"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                bad = [n for n in names if n.split(".")[0] == "tests"]
                bad += [n for n in names if folder == "harness" and n.split(".")[0] == "benchmarks"]
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in bad]
    assert not offenders, offenders
