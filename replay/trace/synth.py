"""Synthetic traces by profile name, written as Mooncake JSONL.

Profiles: ``agentic`` (see ``replay.trace.synth_agentic``). The same profile,
parameters, request count and seed always give a byte-identical file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from policies.param_errors import model_parameters, parameter_problems
from replay.trace.defaults import PROFILES
from replay.trace.mooncake import MOONCAKE_BLOCK_SIZE, write_mooncake
from replay.trace.record import TraceRequest
from replay.trace.synth_agentic import AgenticProfile, synthesize_agentic
from router.errors import UserError

__all__ = ["PROFILES", "make_profile", "synthesize", "write_synthetic_trace"]


def make_profile(name: str, overrides: Mapping[str, Any] | None = None) -> AgenticProfile:
    """The named profile with some parameters overridden; UserError on a bad name or value."""
    if name.strip().lower() not in PROFILES:
        raise UserError(f"unknown synthetic profile '{name}'; supported: {', '.join(PROFILES)}")
    try:
        return AgenticProfile(**dict(overrides or {}))
    except ValidationError as exc:
        problems = parameter_problems(
            exc, model_parameters(AgenticProfile), listing=f"parameters of profile {name}"
        )
        raise UserError(f"bad profile parameter: {problems}") from None


def synthesize(profile: AgenticProfile, requests: int, seed: int = 0) -> Iterator[TraceRequest]:
    """``requests`` synthetic requests in arrival order."""
    if requests <= 0:
        raise UserError(f"the number of requests must be positive, got {requests}")
    if seed < 0:
        raise UserError(f"the seed must be non-negative, got {seed}")
    return synthesize_agentic(profile, requests, seed)


def write_synthetic_trace(
    out: str | Path, profile: AgenticProfile, requests: int, seed: int = 0
) -> int:
    """Write a synthetic trace as Mooncake JSONL; return the number of requests written."""
    if profile.block_size != MOONCAKE_BLOCK_SIZE:
        raise UserError(
            f"a Mooncake trace has {MOONCAKE_BLOCK_SIZE}-token blocks; "
            f"the profile has block_size={profile.block_size}"
        )
    stream = synthesize(profile, requests, seed)
    path = Path(out)
    try:
        with path.open("w", encoding="utf-8", newline="\n") as fh:
            return write_mooncake(stream, fh)
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
