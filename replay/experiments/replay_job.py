"""Running a batch of replays on an executor, each given by its ``ReplayConfig``.

A ``ReplayConfig`` is plain data (picklable: paths, names, numbers), so ``replay compare``,
``sweep``, ``overload`` and ``plan`` can send their replays to worker processes or Ray,
each with every option ``replay run`` has. ``run_jobs`` runs a batch: in this process one
after the other, each with its own progress observer, when the executor is serial; else
through ``Executor.map``, counting finished replays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from replay.experiments.executor import Executor, OnDone, SerialExecutor
from replay.runner.config import ReplayConfig
from replay.runner.run import ReplayResult, run_replay
from replay.sim.simulator import ProgressObserver

__all__ = ["run_job", "run_jobs"]


def run_job(config: ReplayConfig, progress: ProgressObserver | None = None) -> ReplayResult:
    """The replay ``config`` describes."""
    return run_replay(config, progress=progress)


def run_jobs(
    executor: Executor | None,
    jobs: Sequence[ReplayConfig],
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
