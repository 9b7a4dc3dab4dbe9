"""Shared fixtures: paths to the shared traces."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


@pytest.fixture(scope="session")
def conversation_trace() -> Path:
    """The Mooncake conversation trace of ../shared/traces (skipped when absent)."""
    path = SHARED_TRACES / "mooncake_conversation.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not present")
    return path
