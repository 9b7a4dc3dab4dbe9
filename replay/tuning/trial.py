"""One `replay tune` trial: a configuration replayed on every tuning scenario.

A scenario is a trace on a preset at a rate scale (``TuneSetup``). A trial replays
one set of policy parameters on each scenario and keeps each one's figures. The replays of
a batch of trials (every configuration on every scenario) are independent: they run on
an ``Executor`` (this process, worker processes or Ray), with the same figures wherever.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from replay.experiments.executor import Executor, SerialExecutor
from replay.metrics.summary import Summary
from replay.runner.config import ReplayConfig
from replay.runner.run import run_replay

__all__ = ["Figures", "Objective", "Trial", "TuneSetup", "run_trials"]

Objective = Literal["goodput", "bcr"]


class TuneSetup(ReplayConfig):
    """One scenario: a replay (every option of ``replay run``) without the policy
    parameters, which each trial sets (picklable)."""

    policy: str

    @property
    def label(self) -> str:
        return f"{Path(self.trace).name} ({self.preset}, x{self.rate_scale:g})"


class Figures(BaseModel):
    """What one replay of a trial gave."""

    scenario: str
    sla_goodput_req_s: float
    bcr_at_trace_rate_per_1000_usd_h: float
    sla_attainment: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    wan_bytes: float
    rld_token_share: float
    max_gap_p99_s: float | None

    @classmethod
    def of(cls, scenario: str, summary: Summary) -> Figures:
        return cls(
            scenario=scenario,
            sla_goodput_req_s=summary.sla_goodput_req_s,
            bcr_at_trace_rate_per_1000_usd_h=summary.bcr_at_trace_rate_per_1000_usd_h,
            sla_attainment=summary.sla_attainment,
            ttft_p50_s=summary.ttft_s.p50,
            ttft_p99_s=summary.ttft_s.p99,
            wan_bytes=summary.wan_bytes,
            rld_token_share=summary.rld_token_share,
            max_gap_p99_s=summary.max_gap_s.p99,
        )

    def value(self, objective: Objective) -> float:
        if objective == "goodput":
            return self.sla_goodput_req_s
        return self.bcr_at_trace_rate_per_1000_usd_h


class Trial(BaseModel):
    """One configuration and its figures on each scenario (totals over scenarios)."""

    number: int
    params: dict[str, Any]  # only what differs from the defaults
    figures: list[Figures]
    sla_goodput_req_s: float  # summed over scenarios
    bcr_at_trace_rate_per_1000_usd_h: float  # summed over scenarios
    # coordinate search: "best", "replaced by trial N" or why it was not kept (else None)
    verdict: str | None = None

    @classmethod
    def of(cls, number: int, params: Mapping[str, Any], figures: list[Figures]) -> Trial:
        return cls(
            number=number,
            params=dict(params),
            figures=figures,
            sla_goodput_req_s=round(sum(f.sla_goodput_req_s for f in figures), 9),
            bcr_at_trace_rate_per_1000_usd_h=round(
                sum(f.bcr_at_trace_rate_per_1000_usd_h for f in figures), 9
            ),
        )

    def value(self, objective: Objective) -> float:
        if objective == "goodput":
            return self.sla_goodput_req_s
        return self.bcr_at_trace_rate_per_1000_usd_h

    def score(self, objective: Objective) -> tuple[float, float, float]:
        """Larger is better: the objective, then the lower worst TTFT P99, then P50."""
        inf = float("inf")
        p99 = max((f.ttft_p99_s if f.ttft_p99_s is not None else inf) for f in self.figures)
        p50 = max((f.ttft_p50_s if f.ttft_p50_s is not None else inf) for f in self.figures)
        return (round(self.value(objective), 9), -p99, -p50)

    def not_worse_anywhere(self, other: Trial, objective: Objective) -> bool:
        """At least ``other``'s objective on every scenario."""
        return all(
            a.value(objective) >= b.value(objective)
            for a, b in zip(self.figures, other.figures, strict=True)
        )


Job = tuple[TuneSetup, dict[str, Any]]


def _figures(job: Job) -> Figures:
    """One scenario of one trial (a module-level function: workers receive it pickled)."""
    setup, params = job
    summary = run_replay(setup.model_copy(update={"policy_params": params})).summary
    return Figures.of(setup.label, summary)


def run_trials(
    setups: Sequence[TuneSetup],
    configs: Sequence[tuple[int, dict[str, Any]]],
    executor: Executor | None = None,
    advance: Callable[[int], None] | None = None,
) -> list[Trial]:
    """Replay each (number, parameters) on every scenario, every replay of the batch on the
    executor's workers at once (serial by default); ``advance(n)`` as the n-th replay ends."""
    jobs: list[Job] = [(setup, params) for _, params in configs for setup in setups]
    figures = (executor or SerialExecutor()).map(_figures, jobs, on_done=advance)
    width = len(setups)
    return [
        Trial.of(number, params, figures[i * width : (i + 1) * width])
        for i, (number, params) in enumerate(configs)
    ]
