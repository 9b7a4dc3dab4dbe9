"""The package graph points one way and has no cycle; this test fails when that breaks.

policies <- engines_adapter <- engine_sim <- router <- bench <- replay <- cli: a package
may import only its own modules and the packages before it, so the control plane starts
without the benchmarks and the trace simulator, and the CLI is the only composition
root. Inside replay the stages follow the data: traces and presets, the simulator,
metrics, the runner, experiments and tuning, the report. Every import counts, lazy and
type-only ones included, and no two modules may import each other through any chain.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("policies", "engines_adapter", "engine_sim", "router", "bench", "replay", "cli")
REPLAY_STAGES = {
    "trace": 0,
    "presets": 0,
    "sim": 1,
    "metrics": 2,
    "runner": 3,
    "experiments": 4,
    "tuning": 4,
    "report": 5,
}

Graph = dict[str, set[str]]


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the layered packages."""
    modules = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def import_graph(root: Path) -> Graph:
    """Module -> the project's modules it imports (``from a import b`` counts as a.b when
    b is a module, else as a)."""
    modules = module_files(root)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                target = resolve(name) if name.split(".")[0] in LAYERS else None
                if target is not None and target != module:
                    targets.add(target)
        graph[module] = targets
    return graph


def _rank(module: str) -> tuple[int, int]:
    parts = module.split(".")
    stage = REPLAY_STAGES.get(parts[1], -1) if parts[0] == "replay" and len(parts) > 1 else -1
    return LAYERS.index(parts[0]), stage


def upward_imports(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Imports of a later package (or a later replay stage) by an earlier one."""
    found = []
    for module, targets in graph.items():
        for target in targets:
            (layer, stage), (t_layer, t_stage) = _rank(module), _rank(target)
            same_replay = layer == t_layer == LAYERS.index("replay")
            if t_layer > layer or (same_replay and min(stage, t_stage) >= 0 and t_stage > stage):
                found.append(f"{module} imports {target}")
    return sorted(found)


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(ROOT)


def test_every_package_and_stage_is_found(graph: Graph) -> None:
    packages = {m.split(".")[0] for m in graph}
    assert packages == set(LAYERS)
    stages = {m.split(".")[1] for m in graph if m.startswith("replay.") and m.count(".") >= 2}
    assert stages == set(REPLAY_STAGES)  # a new stage must be placed in the order
    assert len(graph) > 150


def test_no_package_imports_a_later_one(graph: Graph) -> None:
    assert upward_imports(graph) == []


def test_no_modules_import_each_other(graph: Graph) -> None:
    assert cycles(graph) == []


def test_the_control_plane_never_imports_the_benchmarks_the_replay_or_the_cli(graph: Graph) -> None:
    control_plane = {"policies", "engines_adapter", "engine_sim", "router"}
    control = [m for m in graph if m.split(".")[0] in control_plane]
    reached = {t.split(".")[0] for m in control for t in graph[m]}
    assert reached <= control_plane


def test_the_guard_catches_an_upward_import_and_a_cycle(graph: Graph) -> None:
    broken = {m: set(t) for m, t in graph.items()}
    broken["router.scheduler"].add("replay.runner.run")  # the control plane reaching up
    broken["replay.sim.request_state"].add("replay.sim.decode_instance")  # an old loop
    broken["replay.metrics.writers"].add("replay.report.render")  # metrics rendering HTML
    assert upward_imports(broken) == [
        "replay.metrics.writers imports replay.report.render",
        "router.scheduler imports replay.runner.run",
    ]
    loop = {"replay.sim.decode_instance", "replay.sim.request_state"}
    assert any(loop <= set(cycle) for cycle in cycles(broken)), cycles(broken)
