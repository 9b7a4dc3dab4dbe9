"""The service's container of parts (``ServiceState``) stays where it is built and
handed out: the composition builds it, the dependency functions of ``deps`` take the
narrow parts out of it; no handler or helper reaches into it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"router/service/composition.py", "router/service/deps.py"}


def _imports_state(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names = {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            names = {alias.name for alias in node.names}
        else:
            continue
        if "router.service.state" in names:
            return True
    return False


def test_only_the_composition_and_the_dependencies_reach_the_service_state() -> None:
    reaching = {
        str(path.relative_to(ROOT))
        for package in ("router", "cli", "bench", "replay")
        for path in (ROOT / package).rglob("*.py")
        if _imports_state(path)
    }
    assert reaching == ALLOWED


def test_no_module_reads_the_lifespan_state_by_name_but_the_dependencies() -> None:
    """The parts in the lifespan's state (``svc``) are read through ``deps`` only."""
    reading = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "router").rglob("*.py")
        if '"svc"' in path.read_text(encoding="utf-8")
        or ".state.svc" in path.read_text(encoding="utf-8")
    }
    assert reading == {"router/service/deps.py", "router/service/app.py"}  # app yields it
