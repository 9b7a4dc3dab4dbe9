"""`pdd-router serve` as its --help and its first checks describe it."""

from __future__ import annotations

import pytest
from cli_support import run_cli

from router.settings import PolicySettings


def test_help_names_the_policy_serve_decides_with(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "serve", "--help")
    assert code == 0
    default = PolicySettings().name
    assert f"(default: {default})" in " ".join(out.split())
