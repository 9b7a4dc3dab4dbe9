"""Running the replay from unit tests: one call for a trace file or requests in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.runner.config import ReplayConfig
from replay.runner.run import ReplayResult, run_replay
from replay.trace.record import TraceRequest

__all__ = ["replay"]


def replay(
    trace: Path | list[TraceRequest], preset: str, policy: str | None = None, **fields: Any
) -> ReplayResult:
    """``run_replay`` of a trace file, or of requests in memory."""
    if isinstance(trace, Path):
        return run_replay(ReplayConfig(trace=str(trace), preset=preset, policy=policy, **fields))
    config = ReplayConfig(trace="<memory>", preset=preset, policy=policy, **fields)
    return run_replay(config, requests=trace)
