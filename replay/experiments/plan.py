"""`replay plan`: search deployments for the best SLA goodput per cost on a trace.

The candidates (``plan_space``) are priced, bounded (``plan_bounds``) and pruned: a
candidate whose bound is below the target rate (by default the trace's own rate) cannot
serve the trace, and a candidate whose bound is no higher than the SLA goodput measured
for a candidate that costs no more is dominated on cost. The rest are judged in order of
cost by ``replay sweep``'s SLA goodput (``run_sweep``: the highest arrival rate meeting
the target SLA attainment), a few at a time on an ``Executor``, so that each batch's
results prune the next. The Pareto front of cost against SLA goodput, the best BCR and an
intra-DC baseline of about the same cost (H100s only, prefill and decode in one
datacenter) are the answer; ``plan_output`` writes and prints it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from replay.experiments.executor import Executor
from replay.experiments.experiment_config import SweepConfig, SweepSearch
from replay.experiments.plan_bounds import Bounds, TraceLoad, bounds_of
from replay.experiments.plan_space import (
    Candidate,
    Layout,
    PlanSpace,
    candidate_preset,
    enumerate_candidates,
)
from replay.experiments.policy_spec import parse_policy_spec
from replay.experiments.sweep import run_sweep
from replay.metrics.summary import SlaThresholds
from replay.presets.loader import load_preset
from replay.runner.config import ReplaySettings
from replay.runner.run import run_replay

__all__ = [
    "Baseline",
    "CandidateResult",
    "PlanResult",
    "PlanSettings",
    "SweepJob",
    "SweepOutcome",
    "run_job",
    "run_plan",
]

BASELINE_PRESET = "idc-pd"
_SHARED_PREFIXES = ("timing.", "handoff.", "hardware.", "models.")  # --set keys the baseline gets


class PlanSettings(BaseModel):
    """What every sweep of the plan shares."""

    model_config = ConfigDict(frozen=True)

    trace: str
    preset: str
    policy: str
    replay: ReplaySettings = ReplaySettings()
    target: float = 0.9
    tolerance: float = 0.05
    max_probes: int = 8
    min_rate_scale: float = 1.0

    @property
    def overrides(self) -> dict[str, Any]:
        return self.replay.overrides

    @property
    def seed(self) -> int:
        return self.replay.seed

    @property
    def sla(self) -> SlaThresholds:
        return self.replay.sla


@dataclass(frozen=True, slots=True)
class SweepJob:
    """One sweep to run on an executor (picklable)."""

    trace: str
    preset: str
    policy: str
    overrides: dict[str, Any]
    replay: ReplaySettings
    target: float
    tolerance: float
    max_probes: int
    start_scale: float
    stop_below: bool = True  # a first replay at start_scale that misses ends the job


class SweepOutcome(BaseModel):
    """A sweep's answer and the figures of its best passing probe."""

    sla_goodput_rps: float
    cost_per_hour: float
    bcr: float
    bracketed: bool
    probes: int
    rate_scale: float | None
    sla_attainment: float | None
    ttft_p99_s: float | None
    wan_gbps_mean: float | None
    rld_token_share: float | None
    below_target: bool = False  # the target rate missed the SLA: no sweep was run


def run_job(job: SweepJob) -> SweepOutcome:
    """Run one sweep (module level, so worker processes can run it). With ``stop_below``
    one replay at the target rate comes first: a deployment that misses the SLA there
    cannot serve the trace, and its sweep is skipped."""
    if job.stop_below:
        spec = parse_policy_spec(job.policy)
        first = run_replay(
            job.replay.replay(job.trace, job.preset, spec.name, spec.params,
                              rate_scale=job.start_scale, overrides=job.overrides)
        ).summary  # fmt: skip
        if first.sla_attainment < job.target:
            return SweepOutcome(
                sla_goodput_rps=0.0, cost_per_hour=first.cost_per_hour, bcr=0.0,
                bracketed=True, probes=1, rate_scale=first.rate_scale,
                sla_attainment=first.sla_attainment, ttft_p99_s=first.ttft_s.p99,
                wan_gbps_mean=first.wan_gbps_mean, rld_token_share=first.rld_token_share,
                below_target=True,
            )  # fmt: skip
    search = SweepSearch(
        target=job.target,
        tolerance=job.tolerance,
        max_probes=job.max_probes,
        start_scale=job.start_scale,
    )
    replay = job.replay.model_copy(update={"overrides": job.overrides})
    result = run_sweep(SweepConfig(trace=job.trace, preset=job.preset, policies=[job.policy],
                                   replay=replay, search=search))  # fmt: skip
    best = result.best_result.summary if result.best_result is not None else None
    return SweepOutcome(
        sla_goodput_rps=result.sla_goodput_rps or 0.0,
        cost_per_hour=result.cost_per_hour,
        bcr=result.bcr or 0.0,
        bracketed=result.bracketed,
        probes=len(result.probes),
        rate_scale=None if best is None else best.rate_scale,
        sla_attainment=None if best is None else best.sla_attainment,
        ttft_p99_s=None if best is None else best.ttft_s.p99,
        wan_gbps_mean=None if best is None else best.wan_gbps_mean,
        rld_token_share=None if best is None else best.rld_token_share,
    )


Status = Literal["evaluated", "pruned"]


class CandidateResult(BaseModel):
    """A candidate, its cost and bounds, and either its sweep or why it was pruned."""

    candidate: Candidate
    cost_per_hour: float
    bounds: Bounds
    overrides: dict[str, Any]
    status: Status = "pruned"
    pruned_by: str | None = None  # memory, prefill, decode, line or dominated
    outcome: SweepOutcome | None = None

    @property
    def goodput_rps(self) -> float:
        return self.outcome.sla_goodput_rps if self.outcome is not None else 0.0

    @property
    def bcr(self) -> float:
        return self.goodput_rps / self.cost_per_hour if self.cost_per_hour > 0 else 0.0


class Baseline(BaseModel):
    """The intra-DC PD deployment of about the best candidate's cost."""

    preset: str
    policy: str
    p: int
    md: int
    overrides: dict[str, Any]
    cost_per_hour: float
    bounds: Bounds
    outcome: SweepOutcome

    @property
    def bcr(self) -> float:
        return self.outcome.sla_goodput_rps / self.cost_per_hour if self.cost_per_hour else 0.0


class PlanResult(BaseModel):
    """Everything ``replay plan`` found."""

    settings: PlanSettings
    space: PlanSpace
    trace_rate_rps: float
    target_rate_rps: float
    results: list[CandidateResult]
    front: list[int]  # indices into results, by cost
    best: int | None
    baseline: Baseline | None

    def pruned_by(self) -> dict[str, int]:
        """How many candidates each reason pruned."""
        out: dict[str, int] = {}
        for r in self.results:
            if r.pruned_by is not None:
                out[r.pruned_by] = out.get(r.pruned_by, 0) + 1
        return out

    def feasible(self, r: CandidateResult) -> bool:
        return r.status == "evaluated" and r.goodput_rps >= self.target_rate_rps * (
            1 - 1e-6
        )  # rates are rounded


def _job(
    settings: PlanSettings,
    preset: str,
    policy: str,
    overrides: Mapping[str, Any],
    stop_below: bool = True,
) -> SweepJob:
    return SweepJob(
        trace=settings.trace, preset=preset, policy=policy, overrides=dict(overrides),
        replay=settings.replay, target=settings.target, tolerance=settings.tolerance,
        max_probes=settings.max_probes, start_scale=settings.min_rate_scale,
        stop_below=stop_below,
    )  # fmt: skip


def _policy_word(name: str, params: Mapping[str, Any]) -> str:
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={v}" for k, v in sorted(params.items()))


def _price(settings: PlanSettings, space: PlanSpace, load: TraceLoad) -> list[CandidateResult]:
    base = load_preset(settings.preset, settings.overrides)
    layout = Layout.of(base)
    out = []
    for c in enumerate_candidates(space):
        preset, overrides = candidate_preset(
            settings.preset, settings.overrides, c, layout, space.wan_price_per_gbps_month
        )
        bounds = bounds_of(preset, load, target=settings.target, sla=settings.sla)
        out.append(CandidateResult(
            candidate=c, cost_per_hour=preset.cost_per_hour(), bounds=bounds, overrides=overrides
        ))  # fmt: skip
    return out


def _dominated(r: CandidateResult, measured: list[CandidateResult]) -> bool:
    """A measured candidate costs no more and already serves what ``r`` could at best."""
    return any(
        m.cost_per_hour <= r.cost_per_hour and m.goodput_rps >= r.bounds.rps for m in measured
    )


def _front(plan: PlanResult) -> list[int]:
    """Feasible candidates no other beats on both cost and goodput, cheapest first."""
    ranked = sorted(
        (i for i, r in enumerate(plan.results) if plan.feasible(r)),
        key=lambda i: (plan.results[i].cost_per_hour, -plan.results[i].goodput_rps),
    )
    front: list[int] = []
    for i in ranked:
        if not front or plan.results[i].goodput_rps > plan.results[front[-1]].goodput_rps:
            front.append(i)
    return front


def _baseline(
    settings: PlanSettings, load: TraceLoad, cost: float, executor: Executor
) -> Baseline | None:
    """idc-pd of H100s at about ``cost``: the instance count that prices closest, split
    between prefill and decode as the bounds favour (the two best splits are swept)."""
    shared = {k: v for k, v in settings.overrides.items() if k.startswith(_SHARED_PREFIXES)}
    base = load_preset(BASELINE_PRESET, shared)
    per_instance = base.spec.pools["p"].gpus_per_instance * base.hardware["h100"].price_per_hour
    count = max(round(cost / per_instance), 2)
    splits = []
    for p in range(1, count):
        overrides = {**shared, "pools.p.instances": p, "pools.md.instances": count - p}
        preset = load_preset(BASELINE_PRESET, overrides)
        bounds = bounds_of(preset, load, target=settings.target, sla=settings.sla)
        splits.append((bounds, p, overrides, preset.cost_per_hour()))
    splits.sort(key=lambda s: -s[0].rps)
    tried = splits[:2]
    policy = base.spec.default_policy
    outcomes = executor.map(
        run_job, [_job(settings, BASELINE_PRESET, policy, o, False) for _, _, o, _ in tried]
    )
    pick = max(range(len(tried)), key=lambda i: (outcomes[i].sla_goodput_rps, -i))
    bounds, p, overrides, price = tried[pick]
    return Baseline(
        preset=BASELINE_PRESET, policy=policy, p=p, md=count - p, overrides=overrides,
        cost_per_hour=price, bounds=bounds, outcome=outcomes[pick],
    )  # fmt: skip


def run_plan(
    settings: PlanSettings,
    space: PlanSpace,
    load: TraceLoad,
    executor: Executor,
    *,
    baseline: bool = True,
    advance: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Price, bound, prune and sweep the candidates of ``space`` on ``load``'s trace."""
    results = _price(settings, space, load)
    target_rate = settings.min_rate_scale * load.rate_rps
    for r in results:
        if r.bounds.rps < target_rate:
            r.pruned_by = r.bounds.limit
    queue = sorted(
        (r for r in results if r.pruned_by is None),
        key=lambda r: (r.cost_per_hour, -r.bounds.rps),
    )
    total, done = len(queue), 0
    measured: list[CandidateResult] = []
    while queue:
        batch: list[CandidateResult] = []
        while queue and len(batch) < executor.workers:
            r = queue.pop(0)
            if _dominated(r, measured):
                r.pruned_by = "dominated"
                done += 1
            else:
                batch.append(r)
        jobs = [
            _job(settings, settings.preset, _policy_word(settings.policy, r.candidate.params),
                 r.overrides)
            for r in batch
        ]  # fmt: skip
        for r, outcome in zip(batch, executor.map(run_job, jobs), strict=True):
            r.status, r.outcome = "evaluated", outcome
            measured.append(r)
        done += len(batch)
        if advance is not None:
            advance(done, total)
    plan = PlanResult(
        settings=settings, space=space, trace_rate_rps=load.rate_rps,
        target_rate_rps=target_rate, results=results, front=[], best=None, baseline=None,
    )  # fmt: skip
    plan.front = _front(plan)
    if plan.front:
        plan.best = max(plan.front, key=lambda i: (plan.results[i].bcr, -i))
        if baseline:
            cost = plan.results[plan.best].cost_per_hour
            plan.baseline = _baseline(settings, load, cost, executor)
    return plan
