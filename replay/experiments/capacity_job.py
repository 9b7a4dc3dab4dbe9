"""One deployment's capacity search as a picklable job, for the executors' workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from replay.experiments.capacity import CapacityResult, CapacitySettings, find_capacity
from replay.experiments.steady_replay import SteadyMeasure, SteadyWindow, deployment_replay
from replay.metrics.summary import SlaThresholds
from replay.trace.formats import read_trace
from replay.trace.record import TraceRequest

__all__ = ["CapacityJob", "run_capacity_job"]


@dataclass(frozen=True, slots=True)
class CapacityJob:
    """Search the capacity of ``preset`` + ``overrides`` under ``policy`` on ``trace``."""

    trace: str
    preset: str
    policy: str  # NAME or NAME:k=v,...
    overrides: dict[str, Any]
    settings: CapacitySettings
    window: SteadyWindow
    sla: SlaThresholds = field(default_factory=SlaThresholds)


@lru_cache(maxsize=2)  # a worker runs many jobs on the same trace: read it once
def _requests(trace: str) -> tuple[TraceRequest, ...]:
    return tuple(read_trace(trace))


def run_capacity_job(job: CapacityJob) -> CapacityResult:
    """Run one job (module level, so worker processes can run it)."""
    replay = deployment_replay(job.preset, job.policy, job.overrides, job.sla)
    measure = SteadyMeasure(_requests(job.trace), replay, job.sla, job.window)
    return find_capacity(measure, job.settings)
