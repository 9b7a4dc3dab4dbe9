"""One replay of an experiment as plain data, and running a batch of them on an executor.

``ReplayJob`` holds everything ``run_replay`` needs (picklable: paths, names, numbers), so
``replay compare`` and ``replay sweep`` can send their replays to worker processes or Ray.
``run_jobs`` runs a batch: in this process one after the other, each with its own progress
observer, when the executor is serial; else through ``Executor.map``, counting finished
replays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.experiments.executor import Executor, OnDone, SerialExecutor
from replay.metrics.summary import SlaThresholds
from replay.runner.run import ReplayResult, run_replay
from replay.sim.kv_events import KV_EVENT_DELAY_S
from replay.sim.simulator import ProgressObserver

__all__ = ["ReplayJob", "run_job", "run_jobs"]


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """The arguments of one ``run_replay`` call."""

    trace: str | Path
    preset: str
    policy: str
    rate_scale: float = 1.0
    seed: int = 0
    policy_params: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    kv_event_delay_s: float = KV_EVENT_DELAY_S
    sla: SlaThresholds | None = None

    @classmethod
    def of(
        cls,
        trace: str | Path,
        preset: str,
        policy: str,
        *,
        rate_scale: float,
        seed: int,
        policy_params: Mapping[str, Any] | None,
        overrides: Mapping[str, Any] | None,
        kv_event_delay_s: float,
        sla: SlaThresholds | None,
    ) -> ReplayJob:
        return cls(
            trace, preset, policy, rate_scale, seed, dict(policy_params or {}),
            dict(overrides or {}), kv_event_delay_s, sla,
        )  # fmt: skip


def run_job(job: ReplayJob, progress: ProgressObserver | None = None) -> ReplayResult:
    """The replay ``job`` describes."""
    return run_replay(
        job.trace, job.preset, job.policy, job.rate_scale, job.seed,
        policy_params=job.policy_params, overrides=job.overrides,
        kv_event_delay_s=job.kv_event_delay_s, sla=job.sla, progress=progress,
    )  # fmt: skip


def run_jobs(
    executor: Executor | None,
    jobs: Sequence[ReplayJob],
    *,
    observer: Callable[[int], ProgressObserver | None] | None = None,
    on_done: OnDone | None = None,
) -> list[ReplayResult]:
    """``jobs``' replays in order. Serial (``executor`` None or serial): here, the i-th with
    ``observer(i)`` as its progress; else on the executor's workers, ``on_done(n)`` as the
    n-th finishes."""
    if executor is None or isinstance(executor, SerialExecutor):
        results = []
        for i, job in enumerate(jobs):
            results.append(run_job(job, observer(i) if observer is not None else None))
            if on_done is not None:
                on_done(len(results))
        return results
    return executor.map(run_job, jobs, on_done=on_done)
