"""Driving the CLI from tests: one call with captured output, and a synthetic trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.app import main

__all__ = ["calibrate_p_and_md", "cli", "replay_one_each", "run_cli", "synth_agentic"]


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


def calibrate_p_and_md(
    capsys: pytest.CaptureFixture[str],
    p_url: str,
    md_url: str,
    folder: Path,
    *md_args: str,
    vocab: int,
) -> Path:
    """``calibrate`` the engine-sim at ``p_url`` as idc-pd-small's P pool, then the one at
    ``md_url`` (with ``md_args``) as its MD pool, probing token IDs under ``vocab``: the
    preset written, ``folder/cluster.yaml``."""
    probes = ("--vocab-size", str(vocab), "--max-prompt", "2048", "--max-batch", "4",
              "--repeats", "1", "--no-progress")  # fmt: skip
    cli(capsys, "calibrate", "--url", p_url, "--preset", "idc-pd-small", "--pool", "p",
        "--out", str(folder / "p.yaml"), *probes)  # fmt: skip
    cli(capsys, "calibrate", "--url", md_url, "--preset", str(folder / "p.yaml"), "--pool", "md",
        "--out", str(folder / "cluster.yaml"), *md_args, *probes)  # fmt: skip
    return folder / "cluster.yaml"


def replay_one_each(
    capsys: pytest.CaptureFixture[str], trace: Path, preset: Path, out: Path, kv_tokens: int
) -> None:
    """``replay run`` of ``trace`` on ``preset`` cut to one P and one MD instance, each with
    ``kv_tokens`` of KV memory and a batch of 64, into ``out``."""
    one_each = [f"pools.{p}.{k}={v}" for p in ("p", "md")
                for k, v in (("instances", 1), ("kv_capacity_tokens", kv_tokens),
                             ("max_batch", 64))]  # fmt: skip
    sets = [a for s in one_each for a in ("--set", s)]
    cli(capsys, "replay", "run", str(trace), "--preset", str(preset), *sets, "--out", str(out),
        "--no-progress")  # fmt: skip
