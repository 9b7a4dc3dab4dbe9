#!/usr/bin/env python3
"""List the functions, modules and classes over the project's size limits, outside tests/.

    python scripts/check-sizes.py [ROOT]

Limits (docs/architecture.md, "Size limits"): a function or method at most 80 lines (its
``def`` line to its last, decorators left out), a module at most 400 lines, a class at
most 15 public methods (``def`` names not starting with ``_``; properties are read as
attributes and not counted). Every file ending in .py under ROOT (default: this
repository) is read, but for tests/ and hidden or virtual-environment folders.

Exits 1 when something is over a limit and not in ALLOWED below, each named with its
size; 0 otherwise. Entries of ALLOWED that are no longer over their limit are named as
stale (remove them), without failing.

The standard library's ast gives the sizes: a linter's length rule (ruff's PLR0915 counts
statements, not lines, and has no module or public-method limit) would measure something
else.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

FUNCTION_LINES = 80
MODULE_LINES = 400
PUBLIC_METHODS = 15

SKIPPED = {"tests", ".venv", "venv", "node_modules", "build", "dist"}

ALLOWED: dict[str, str] = {
    # "path" (a module), "path::qualified.name" (a function or a class): the reason
}


def python_files(root: Path) -> Iterator[Path]:
    """The .py files under ``root`` outside tests/ and hidden or environment folders."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if any(part in SKIPPED or part.startswith(".") for part in parts):
            continue
        yield path


def _public_methods(node: ast.ClassDef) -> int:
    count = 0
    for item in node.body:
        if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        decorators = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")
                      for d in item.decorator_list}  # fmt: skip
        if item.name.startswith("_") or "property" in decorators or "setter" in decorators:
            continue
        count += 1
    return count


def _walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, str, int]]:
    """(kind, qualified name, size) of every function and class over its limit, nested
    ones included."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > FUNCTION_LINES:
                yield "function", name, lines
            yield from _walk(node.body, name + ".")
        elif isinstance(node, ast.ClassDef):
            name = prefix + node.name
            methods = _public_methods(node)
            if methods > PUBLIC_METHODS:
                yield "class", name, methods
            yield from _walk(node.body, name + ".")


def oversized(root: Path) -> list[tuple[str, str]]:
    """(allowlist key, description) of everything over a limit under ``root``."""
    found: list[tuple[str, str]] = []
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MODULE_LINES:
            found.append((rel, f"{rel}: module of {lines} lines (limit {MODULE_LINES})"))
        for kind, name, size in _walk(ast.parse(text, filename=rel).body, ""):
            unit, limit = (
                ("lines", FUNCTION_LINES)
                if kind == "function"
                else ("public methods", PUBLIC_METHODS)
            )
            found.append((f"{rel}::{name}", f"{rel}: {kind} {name}, {size} {unit} (limit {limit})"))
    return found


def main(argv: list[str], allowlist: Mapping[str, str] = ALLOWED) -> int:
    """Check ``argv[1]`` (default: this checkout) against the limits, ``allowlist`` aside."""
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    if not root.is_dir():
        print(f"{root}: no such folder", file=sys.stderr)
        return 2
    found = oversized(root)
    refused = [text for key, text in found if key not in allowlist]
    for text in refused:
        print(text)
    stale = sorted(set(allowlist) - {key for key, _ in found})
    if root.resolve() == Path(__file__).resolve().parent.parent:
        for key in stale:
            print(f"note: {key} is within its limits: remove it from ALLOWED", file=sys.stderr)
    allowed = len(found) - len(refused)
    print(
        f"{len(refused)} over the limits, {allowed} allowed "
        f"(functions {FUNCTION_LINES} lines, modules {MODULE_LINES}, classes "
        f"{PUBLIC_METHODS} public methods)",
        file=sys.stderr,
    )
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
