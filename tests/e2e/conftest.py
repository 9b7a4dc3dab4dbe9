"""Fixtures every end-to-end test gets."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep rich from wrapping long paths in messages (it wraps at 80 columns off a terminal)."""
    monkeypatch.setenv("COLUMNS", "400")
