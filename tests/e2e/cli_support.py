"""Driving the CLI from tests: one call with captured output, and a synthetic trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.app import main

__all__ = ["cli", "run_cli", "synth_agentic"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``pdd-router ARGV``: its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``pdd-router ARGV``, which must succeed: its stdout."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    return out


def synth_agentic(path: Path, *, seed: int, requests: int = 300, rate: float = 5.0) -> Path:
    """Write a synthetic agentic trace (``trace synth``) to ``path``, by default at 5
    req/s: the rate the -small presets serve (half the paper's cluster at half its rate)."""
    args = ["trace", "synth", "--profile", "agentic", "--requests", str(requests)]
    args += ["--param", f"rate={rate:g}"]
    assert main([*args, "--seed", str(seed), "--out", str(path)]) == 0
    return path
