"""One deployment's capacity search as a picklable job, for the executors' workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from replay.experiments.capacity import CapacityResult, CapacitySettings, find_capacity
from replay.experiments.steady_replay import SteadyMeasure, SteadyWindow, deployment_replay
from replay.runner.config import ReplaySettings
from replay.trace.flatten_hits import flatten_hits
from replay.trace.formats import read_trace, resolve_format
from replay.trace.record import TraceRequest

__all__ = ["CapacityJob", "run_capacity_job"]


@dataclass(frozen=True, slots=True)
class CapacityJob:
    """Search the capacity of ``preset`` under ``policy`` on ``trace``, each replay with
    the ``replay`` settings (their ``overrides`` the deployment's own); with a
    ``hit_band`` (low, high), on the trace with its hit rates flattened into it
    (``flatten_hits``)."""

    trace: str
    preset: str
    policy: str  # NAME or NAME:k=v,...
    settings: CapacitySettings
    window: SteadyWindow
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    hit_band: tuple[float, float] | None = None


@lru_cache(maxsize=2)  # a worker runs many jobs on the same trace: read it once
def _requests(
    trace: str, trace_format: str | None, block_size: int | None, strict: bool,
    max_requests: int | None, hit_band: tuple[float, float] | None,
) -> tuple[TraceRequest, ...]:  # fmt: skip
    """The trace's requests (its first ``max_requests``), flattened into ``hit_band``."""
    fmt = resolve_format(trace_format) if trace_format is not None else None
    requests = list(read_trace(trace, fmt, block_size, strict=strict))[:max_requests]
    if hit_band is not None:
        return tuple(flatten_hits(requests, *hit_band))
    return tuple(requests)


def run_capacity_job(job: CapacityJob) -> CapacityResult:
    """Run one job (module level, so worker processes can run it) on the trace's requests,
    its first ``replay.max_requests`` when set."""
    r = job.replay
    replay = deployment_replay(job.preset, job.policy, r)
    requests = _requests(
        job.trace, r.trace_format, r.block_size, r.strict_trace, r.max_requests, job.hit_band
    )
    measure = SteadyMeasure(requests, replay, r.sla, job.window)
    return find_capacity(measure, job.settings)
