"""`pdd-router demo`: the project's main job on embedded defaults."""

from __future__ import annotations

__all__ = ["demo"]


def demo() -> None:
    """Generate the synthetic agentic trace and print its statistics."""
    raise NotImplementedError
